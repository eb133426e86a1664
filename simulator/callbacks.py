"""Remotes that answer later: a call that asks for a callback is accepted now and called
back when its work is done (docs/contracts.md §3.13, ``completes_on``).

What the remote sees and does (as carriers, payment providers and the like with an
asynchronous API do):

- The call's body carries ``"callback": {"url": "<absolute http(s) URL>"}``: where to
  say how it ended. In this app that is the order's event route,
  ``<app>/api/orders/<orderId>/events/<event>`` (``core.links.events_url``).
- The call is answered ``202 Accepted`` with the JSON a ``200`` would carry (the effect is
  applied then, once per idempotency key, as for any call).
- ``callbackMs`` later (a directive's ``callbackMs``, else the server's default, 200 ms)
  the remote POSTs ``{"result": <that same JSON>}`` to the URL, ``Content-Type:
  application/json``. A connection error, a timeout (5 s), 408, 425, 429 or 5xx is tried
  again, at most ``TRIES`` times in all, 0.25, 0.5, 1 and 2 s apart; a 2xx ends it, and
  so does any other answer (a 4xx: the app will not take it; the caller's deadline and
  retry are what recover).
- A repeat of the call (the same idempotency key: a caller whose deadline passed with no
  callback asks again) gets the stored answer, again ``202``, and calls back again,
  with the same body: the app takes the first and answers the same event again with a
  ``200`` that changes nothing.

Faults (the step's directive, ``simulator.faults``): ``"callback": "lost"`` (or
``"lost:N"``): the first (N) callbacks of the key are never sent; ``"callback":
"refuse:<reason>"``: the effect is not applied and the callback says
``{"refused": "<reason>"}``: the remote will not do it.

The ledger gets one ``"kind": "callback"`` entry per callback, once it is settled:
``"callback": {"url", "body", "answer": <status> | "unreachable" | null, "tries",
"fault": null | "lost"}`` (``answer`` null: never sent).
"""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import urlsplit

from simulator.faults import RequestError
from simulator.ledger import Ledger

#: Tries of one callback, and the waits between them (the last one repeats).
TRIES: Final = 5
WAITS: Final = (0.25, 0.5, 1.0, 2.0)
TRY_SECONDS: Final = 5.0
DEFAULT_CALLBACK_MS: Final = 200
_AGAIN: Final = frozenset({408, 425, 429})


@dataclass(frozen=True, slots=True)
class Callback:
    """One callback to send: where, what, when."""

    order_id: str
    step: str
    key: str
    url: str
    body: dict[str, Any]
    after_ms: int
    lost: bool = False


def callback_url(body: dict[str, Any]) -> str | None:
    """The URL a call's body asks to be called back on (None: it asks for none);
    ``RequestError`` for a ``callback`` that is not ``{"url": "<http(s) URL>"}``."""
    callback = body.get("callback")
    if callback is None:
        return None
    url = callback.get("url") if isinstance(callback, dict) else None
    extra = sorted(set(callback) - {"url"}) if isinstance(callback, dict) else []
    parts = urlsplit(url) if isinstance(url, str) else None
    if parts is None or parts.scheme not in ("http", "https") or not parts.netloc or extra:
        raise RequestError(
            'The callback must be {"url": "<absolute http(s) URL>"}, where the result is '
            f"posted; got {json.dumps(callback)[:200]}."
        )
    return str(url)


class Callbacks:
    """Sends callbacks from threads of their own; settles each in the ledger."""

    def __init__(self, ledger: Ledger, stopping: threading.Event) -> None:
        self._ledger = ledger
        self._stopping = stopping
        self._lock = threading.Lock()
        self._pending = 0
        # No proxy from the environment: the app is called directly, as a remote would.
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def send(self, callback: Callback) -> None:
        with self._lock:
            self._pending += 1
        threading.Thread(
            target=self._run, args=(callback,), name="simulator-callback", daemon=True
        ).start()

    @property
    def pending(self) -> int:
        """Callbacks not settled yet."""
        with self._lock:
            return self._pending

    def _run(self, callback: Callback) -> None:
        answer: int | str | None = None
        tries = 0
        try:
            if self._stopping.wait(callback.after_ms / 1000):
                return
            if not callback.lost:
                answer, tries = self._deliver(callback)
            self._ledger.append_callback(
                order_id=callback.order_id,
                step=callback.step,
                key=callback.key,
                url=callback.url,
                body=callback.body,
                answer=answer,
                tries=tries,
                fault="lost" if callback.lost else None,
            )
        finally:
            with self._lock:
                self._pending -= 1

    def _deliver(self, callback: Callback) -> tuple[int | str, int]:
        data = json.dumps(callback.body).encode()
        answer: int | str = "unreachable"
        for number in range(1, TRIES + 1):
            request = urllib.request.Request(  # noqa: S310 - callback_url allows http(s) only
                callback.url,
                data=data,
                headers={"Content-Type": "application/json"},
                method="POST",
            )
            try:
                with self._opener.open(request, timeout=TRY_SECONDS) as response:
                    return int(response.status), number
            except urllib.error.HTTPError as exc:
                answer = exc.code
                if exc.code not in _AGAIN and exc.code < 500:
                    return answer, number
            except (urllib.error.URLError, OSError):
                answer = "unreachable"
            wait = WAITS[min(number, len(WAITS)) - 1]
            if number == TRIES or self._stopping.wait(wait):
                return answer, number
        return answer, TRIES
