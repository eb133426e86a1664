"""Request validation and fault directives. Pure: no I/O, no clock, no threads.

A call is ``POST /{step}`` with a JSON object as body (the order's JSON, or what the
step's ``input`` built: docs/contracts.md §3.4, §3.13) and ``Idempotency-Key:
<orderId>:<step>`` (``<orderId>:<step>:<round>`` for a compensation run again as a new
effect, §3.11). The order id comes from the key; a body that names an ``orderId`` must
name the same. A body may ask for a callback, ``"callback": {"url": "<http(s) URL>"}``
(``simulator.callbacks``). A body may carry ``"simulate": {step: directive}`` (an order's
JSON carries it through); a directive is a string shorthand or an object:

    "transient[:N]"  {"fail": "transient", "times": N, "status": 503, "retryAfter": S}
    "permanent[:N]"  {"fail": "permanent", "times": N, "status": 422, "error": "..."}
    "hang[:N]"       {"fail": "hang", "times": N, "seconds": 3600, "applyFirst": true}
    "drop[:N]"       {"fail": "drop", "times": N, "applyFirst": false}
                     {"fail": "stall", "seconds": S}
                     {"latencyMs": n}  (alone, or added to any object above)
                     {"callback": "lost[:N]" | "refuse[:REASON]", "callbackMs": n}
                     (alone, or added to any object above: for a call that asks for a
                     callback, the first N callbacks are never sent; or the effect is
                     not applied and the callback refuses it; sent n ms after the answer)

N defaults to 1 and counts calls per idempotency key over the server's life, except for
``permanent``: without N it refuses every call; with N, the first N (a refusal whose cause
the service then fixes: the order fails for good, and a resubmit completes it). A stall
holds every call made within ``S`` seconds of the key's first call until those ``S``
seconds are over, then applies the effect (once) and answers: a remote that stalls for
a while on some orders while it answers others. A call whose caller gave up meanwhile
gets nothing; one still waiting gets the answer.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, replace
from typing import Any, Final, Literal

FailKind = Literal["transient", "permanent", "hang", "drop", "stall"]

STEP_PATTERN: Final = re.compile(r"[a-z0-9-]+")
DEFAULT_TRANSIENT_STATUS: Final = 503
DEFAULT_PERMANENT_STATUS: Final = 422
DEFAULT_HANG_SECONDS: Final = 3600.0
#: The 4xx statuses docs/contracts.md §3.4 calls transient: a permanent fault may not use them.
TRANSIENT_4XX: Final = frozenset({408, 425, 429})

_COMMON_FIELDS: Final = frozenset({"fail", "latencyMs", "callback", "callbackMs"})
#: How long a callback may be put off by a directive.
MAX_CALLBACK_MS: Final = 600_000
CallbackFault = Literal["lost", "refuse"]
_FIELDS: Final[dict[str | None, frozenset[str]]] = {
    None: _COMMON_FIELDS,
    "transient": _COMMON_FIELDS | {"times", "status", "retryAfter"},
    "permanent": _COMMON_FIELDS | {"times", "status", "error"},
    "hang": _COMMON_FIELDS | {"times", "seconds", "applyFirst"},
    "drop": _COMMON_FIELDS | {"times", "applyFirst"},
    "stall": _COMMON_FIELDS | {"seconds"},
}


class RequestError(ValueError):
    """The call breaks the protocol; the server answers 400 with this sentence."""


class DirectiveError(RequestError):
    """A ``simulate`` directive is invalid (also a 400: the caller's data is wrong)."""


@dataclass(frozen=True, slots=True)
class Fault:
    """What the server does instead of (or around) a plain success for one call."""

    kind: FailKind
    status: int = 0
    retry_after: int | None = None
    error: str = ""
    seconds: float = 0.0
    apply_first: bool = False
    random: bool = False


@dataclass(frozen=True, slots=True)
class Directive:
    """A parsed per-order, per-step directive."""

    fail: FailKind | None = None
    times: int = 1  # a permanent directive without it refuses every call
    forever: bool = False
    status: int = 0
    retry_after: int | None = None
    error: str = ""
    seconds: float = DEFAULT_HANG_SECONDS
    apply_first: bool = False
    latency_ms: int = 0
    callback: CallbackFault | None = None
    callback_times: int = 1  # "lost": how many callbacks are never sent
    callback_reason: str = ""  # "refuse": what the callback says
    callback_ms: int | None = None  # None: the server's default

    def callback_lost(self, callback_no: int) -> bool:
        """Whether the key's ``callback_no``-th callback (1-based) is never sent."""
        return self.callback == "lost" and callback_no <= self.callback_times

    def fault_for(self, call_no: int, since_first_call: float = 0.0) -> Fault | None:
        """The fault for the key's ``call_no``-th call (1-based), made ``since_first_call``
        seconds after its first, or None to succeed."""
        if self.fail is None:
            return None
        if self.fail == "stall":
            left = self.seconds - since_first_call
            return Fault("hang", seconds=left) if left > 0 else None
        if not self.forever and call_no > self.times:
            return None
        return Fault(
            kind=self.fail,
            status=self.status,
            retry_after=self.retry_after,
            error=self.error,
            seconds=self.seconds,
            apply_first=self.apply_first,
        )


def validate_call(step: str, key: str | None, body: bytes) -> tuple[str, dict[str, Any]]:
    """Check one call against the protocol; return ``(orderId, body)`` or raise RequestError."""
    if not STEP_PATTERN.fullmatch(step):
        raise RequestError(f"Step {step!r} is not a valid step name (expected [a-z0-9-]+).")
    try:
        payload = json.loads(body)
    except ValueError:
        raise RequestError(
            "The body is not valid UTF-8 JSON; send a JSON object (the order, or the step's input)."
        ) from None
    if not isinstance(payload, dict):
        raise RequestError("The body must be a JSON object (the order, or the step's input).")
    if not key:
        raise RequestError("The Idempotency-Key header is missing; send '<orderId>:<step>'.")
    order_id = order_of_key(step, key)
    named = payload.get("orderId", order_id)
    if named != order_id:
        raise RequestError(
            f"The body's orderId {named!r} does not match the Idempotency-Key {key!r}."
        )
    return order_id, payload


def order_of_key(step: str, key: str) -> str:
    """The order id of ``<orderId>:<step>`` or ``<orderId>:<step>:<round>`` (round >= 2),
    or of an item of a ``ForEach`` (docs/contracts.md §3.16), called on its step's path
    ``step`` under the ForEach's name: ``<orderId>:<name>:<i>`` (i 0-99), and
    ``<orderId>:<name>:<i>:<round>``. An item's key names another name than its path (a
    name equal to the path is read as a round)."""
    parts = key.split(":")
    if (
        len(parts) in (2, 3)
        and parts[0]
        and parts[1] == step
        and (len(parts) == 2 or (parts[2].isdigit() and int(parts[2]) >= 2))
    ):
        return parts[0]
    if (
        len(parts) in (3, 4)
        and parts[0]
        and parts[1] != step
        and STEP_PATTERN.fullmatch(parts[1])
        and _whole(parts[2], 0, MAX_ITEM)
        and (len(parts) == 3 or _whole(parts[3], 2, MAX_ROUND))
    ):
        return parts[0]
    raise RequestError(
        f"The Idempotency-Key {key!r} does not match '<orderId>:{step}' (or "
        f"'<orderId>:{step}:<round>', or an item's '<orderId>:<name>:<index>')."
    )


#: The highest item index (``core.item_names.MAX_ITEMS`` - 1) and key round
#: (``core.messages.MAX_KEY_ROUND``) an item's Idempotency-Key may carry.
MAX_ITEM: Final = 99
MAX_ROUND: Final = 99


def _whole(text: str, low: int, high: int) -> bool:
    return text.isdigit() and text.isascii() and low <= int(text) <= high


def directive_for(step: str, order: dict[str, Any]) -> Directive | None:
    """The order's directive for ``step``, or None when it has none."""
    simulate = order.get("simulate")
    if simulate is None:
        return None
    if not isinstance(simulate, dict):
        raise DirectiveError("'simulate' must be an object mapping step names to directives.")
    raw = simulate.get(step)
    return None if raw is None else parse_directive(step, raw)


def parse_directive(step: str, raw: object) -> Directive:
    """Parse a string shorthand or an object directive (see the module docstring)."""
    if isinstance(raw, str):
        return _parse_shorthand(step, raw)
    if isinstance(raw, dict):
        return _parse_object(step, raw)
    raise DirectiveError(f"The directive for step {step!r} must be a string or an object.")


def _parse_shorthand(step: str, text: str) -> Directive:
    kind, _, count = text.partition(":")
    if kind in ("transient", "permanent", "hang", "drop"):
        if not count:
            return _parse_object(step, {"fail": kind})
        if count.isdigit():
            return _parse_object(step, {"fail": kind, "times": int(count)})
    raise DirectiveError(
        f"The directive {text!r} for step {step!r} is not one of "
        "'transient[:N]', 'permanent[:N]', 'hang[:N]', 'drop[:N]'."
    )


def _parse_object(step: str, raw: dict[str, Any]) -> Directive:
    where = f"the directive for step {step!r}"
    fail = raw.get("fail")
    if fail is not None and fail not in ("transient", "permanent", "hang", "drop", "stall"):
        raise DirectiveError(
            f"In {where}, 'fail' must be transient, permanent, hang, drop or stall, not {fail!r}."
        )
    unknown = sorted(set(raw) - _FIELDS[fail])
    if unknown:
        raise DirectiveError(f"In {where}, field(s) {', '.join(unknown)} do not apply to {fail}.")
    latency = _integer(raw, "latencyMs", 0, where)
    callback = _callback_fields(raw, where)
    if fail is None:
        return replace(Directive(latency_ms=latency), **callback)
    return replace(_parse_failure(step, raw, fail, latency, where), **callback)


def _callback_fields(raw: dict[str, Any], where: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if "callbackMs" in raw:
        out["callback_ms"] = _integer(raw, "callbackMs", 0, where)
        if out["callback_ms"] > MAX_CALLBACK_MS:
            raise DirectiveError(f"In {where}, 'callbackMs' is at most {MAX_CALLBACK_MS}.")
    text = raw.get("callback")
    if text is None:
        return out
    if not isinstance(text, str):
        raise DirectiveError(f"In {where}, 'callback' must be 'lost[:N]' or 'refuse[:REASON]'.")
    kind, sep, rest = text.partition(":")
    if kind == "lost" and (not sep or rest.isdigit()):
        return {**out, "callback": "lost", "callback_times": int(rest) if sep else 1}
    if kind == "refuse":
        reason = rest.strip() or "Simulated refusal: the remote will not do it."
        return {**out, "callback": "refuse", "callback_reason": reason}
    raise DirectiveError(
        f"In {where}, 'callback' must be 'lost[:N]' or 'refuse[:REASON]', not {text!r}."
    )


def _parse_failure(
    step: str, raw: dict[str, Any], fail: FailKind, latency: int, where: str
) -> Directive:
    times = _integer(raw, "times", 1, where)
    if fail == "transient":
        status = _integer(raw, "status", DEFAULT_TRANSIENT_STATUS, where)
        if not (status in TRANSIENT_4XX or 500 <= status <= 599):
            raise DirectiveError(f"In {where}, a transient status must be 408, 425, 429 or 5xx.")
        retry_after = _integer(raw, "retryAfter", 0, where) if "retryAfter" in raw else None
        return Directive(
            fail=fail, times=times, status=status, retry_after=retry_after, latency_ms=latency
        )
    if fail == "permanent":
        status = _integer(raw, "status", DEFAULT_PERMANENT_STATUS, where)
        if not 400 <= status <= 499 or status in TRANSIENT_4XX:
            raise DirectiveError(
                f"In {where}, a permanent status must be a 4xx other than 408, 425, 429."
            )
        error = raw.get("error", f"Simulated permanent failure of step {step!r}.")
        if not isinstance(error, str):
            raise DirectiveError(f"In {where}, 'error' must be a string.")
        return Directive(
            fail=fail,
            times=times,
            forever="times" not in raw,
            status=status,
            error=error,
            latency_ms=latency,
        )
    if fail == "stall":
        stall = raw.get("seconds")
        if isinstance(stall, bool) or not isinstance(stall, int | float) or stall < 0:
            raise DirectiveError(f"In {where}, a stall needs 'seconds', a number >= 0.")
        return Directive(fail=fail, seconds=float(stall), latency_ms=latency)
    apply_first = raw.get("applyFirst", fail == "hang")
    if not isinstance(apply_first, bool):
        raise DirectiveError(f"In {where}, 'applyFirst' must be true or false.")
    seconds = raw.get("seconds", DEFAULT_HANG_SECONDS)
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or seconds < 0:
        raise DirectiveError(f"In {where}, 'seconds' must be a number >= 0.")
    return Directive(
        fail=fail,
        times=times,
        seconds=float(seconds),
        apply_first=apply_first,
        latency_ms=latency,
    )


def _integer(raw: dict[str, Any], name: str, default: int, where: str) -> int:
    value = raw.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise DirectiveError(f"In {where}, {name!r} must be an integer >= 0.")
    return value


@dataclass(frozen=True, slots=True)
class RandomFaults:
    """Global random faults for keys without a directive; never permanent.

    Draws are a hash of (seed, key, call number), not a shared generator, so a
    run with a given seed injects the same faults whatever the thread interleaving.
    """

    transient_rate: float = 0.0
    hang_rate: float = 0.0
    drop_rate: float = 0.0
    hang_seconds: float = DEFAULT_HANG_SECONDS
    latency_ms: tuple[int, int] = (0, 0)
    seed: int = 0
    max_per_key: int = 2

    def __post_init__(self) -> None:
        rates = (self.transient_rate, self.hang_rate, self.drop_rate)
        if any(not 0.0 <= rate <= 1.0 for rate in rates) or sum(rates) > 1.0:
            raise ValueError("Fault rates must each be in [0, 1] and add up to at most 1.")
        low, high = self.latency_ms
        if not 0 <= low <= high:
            raise ValueError("Latency must be a range low-high with 0 <= low <= high.")
        if self.hang_seconds < 0 or self.max_per_key < 0:
            raise ValueError("hang_seconds and max_per_key must be >= 0.")

    @property
    def active(self) -> bool:
        rates = self.transient_rate + self.hang_rate + self.drop_rate
        return rates > 0.0 or self.latency_ms[1] > 0

    def draw(self, key: str, call_no: int, faults_so_far: int) -> tuple[Fault | None, int]:
        """The random fault (or None) and latency in ms for the key's ``call_no``-th call."""
        digest = hashlib.blake2b(f"{self.seed}:{key}:{call_no}".encode(), digest_size=12).digest()
        u_fault, u_apply, u_latency = (
            int.from_bytes(digest[i : i + 4]) / 2**32 for i in range(0, 12, 4)
        )
        low, high = self.latency_ms
        latency = low + int(u_latency * (high - low + 1)) if high else 0
        if faults_so_far >= self.max_per_key:
            return None, latency
        fault: Fault | None = None
        if u_fault < self.transient_rate:
            fault = Fault("transient", status=DEFAULT_TRANSIENT_STATUS, random=True)
        elif u_fault < self.transient_rate + self.hang_rate:
            fault = Fault("hang", seconds=self.hang_seconds, apply_first=u_apply < 0.5, random=True)
        elif u_fault < self.transient_rate + self.hang_rate + self.drop_rate:
            fault = Fault("drop", apply_first=u_apply < 0.5, random=True)
        return fault, latency


def parse_latency(text: str) -> tuple[int, int]:
    """``"0-20"`` -> (0, 20); ``"5"`` -> (5, 5)."""
    low, sep, high = text.partition("-")
    try:
        bounds = (int(low), int(high) if sep else int(low))
    except ValueError:
        raise ValueError(f"Latency {text!r} is not 'N' or 'LOW-HIGH' in milliseconds.") from None
    if not 0 <= bounds[0] <= bounds[1]:
        raise ValueError(f"Latency {text!r} must satisfy 0 <= LOW <= HIGH.")
    return bounds
