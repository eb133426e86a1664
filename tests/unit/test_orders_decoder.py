"""The order decoder against hostile input (docs/contracts.md §3.1), the order body split over Table
properties, and the bounded cache of queue clients.

The fuzz tests use a seeded generator and a bounded count (hypothesis is not installed):
whatever they throw, ``decode_order`` returns an ``OrderMessage`` or raises ``InvalidOrder``
with a reason that can itself be sent (UTF-8) to ``orders-rejected``.
"""

from __future__ import annotations

import json
import random
import re
import string
import threading
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import pytest

from bench.decoder import WORST_SHAPES
from core import order_message
from core.errors import InvalidOrder
from core.model import Order
from core.names import Names
from core.order_message import (
    MAX_MESSAGE_CHARS,
    MAX_NESTING,
    MAX_ORDER_DATA_UNITS,
    OrderMessage,
    decode_order,
    strict_json,
    utf16_units,
)
from core.reply_queues import ReplyQueues
from core.workflows import WORKFLOWS, Plan
from messaging.storage_queues import MAX_CACHED_CLIENTS, StorageQueues
from stores.entities import BODY_PART_UNITS, order_entity, parse_order, split_utf16

T0 = datetime(2026, 11, 22, 10, 0, tzinfo=UTC)


def check(raw: bytes | str, **kwargs: Any) -> OrderMessage | InvalidOrder:
    """Decode; anything but an OrderMessage or an InvalidOrder fails the test."""
    try:
        message = decode_order(raw, **kwargs)
    except InvalidOrder as exc:
        reason = str(exc)
        assert reason and reason == exc.message
        reason.encode("utf-8")  # it goes into a JSON record on a queue
        assert exc.order_id is None or isinstance(exc.order_id, str)
        return exc
    # What is accepted can be hashed, stored and sent as it is.
    text = message.data_json
    text.encode("utf-8")
    assert json.loads(text) == message.body
    assert utf16_units(text) <= MAX_ORDER_DATA_UNITS
    assert len(message.content_hash) == 64
    return message


# --- the escapes this guards against -----------------------------------------------------


@pytest.mark.parametrize(
    "raw",
    [
        '{"orderId":"a","x":"\\ud800"}',
        '{"orderId":"a","\\udbff":1}',
        '{"orderId":"\\udc00"}',
        '{"orderId":"a","x":["\\ud83d"]}',
        '{"orderId":"a","x":"\ud800"}',  # a str given directly, with a lone surrogate in it
        '{"orderId":"a","n":' + "7" * 4_301 + "}",
        '{"orderId":"a","n":' + "[" * 100_000 + "]" * 100_000 + "}",
        '{"orderId":"a","n":' + '{"a":' * 50_000 + "0" + "}" * 50_000 + "}",
        "[" * 60_000,  # unclosed
        '{"orderId":"a","n":1e400}',
        '{"orderId":"a","n":-1E+400}',
        '{"orderId":"a","n":1' + "0" * 400 + ".0}",
        "x" * (MAX_MESSAGE_CHARS + 1),
    ],
    ids=lambda raw: raw[:40],
)
def test_what_used_to_escape_the_decoder_is_a_rejection(raw: str) -> None:
    assert isinstance(check(raw), InvalidOrder)


def test_deep_json_inside_base64_does_not_escape_the_base64_hint() -> None:
    import base64

    for inner in (b"[" * 20_000 + b"]" * 20_000, b'{"a":' + b"9" * 5_000 + b"}"):
        error = check(base64.b64encode(inner).decode())
        assert isinstance(error, InvalidOrder)
        assert "base64" in str(error)


@pytest.mark.parametrize(
    ("raw", "value"),
    [
        ('{"orderId":"a","n":1e-400}', 0.0),  # underflow is zero, a fine number
        ('{"orderId":"a","n":-1e-400}', -0.0),
        ('{"orderId":"a","n":1.7976931348623157e308}', 1.7976931348623157e308),
        ('{"orderId":"a","n":' + "9" * 4_300 + "}", int("9" * 4_300)),
        ('{"orderId":"a","n":"\\u0000\\u001f\\u007f"}', "\x00\x1f\x7f"),  # control characters
        ('{"orderId":"a","n":"\\ud83d\\ude00"}', "\U0001f600"),  # a pair is one character
        ('{"orderId":"a","n":"\\uffff\\ufffe"}', "\uffff\ufffe"),  # noncharacters are valid
    ],
)
def test_edge_values_that_are_valid_json_are_kept(raw: str, value: object) -> None:
    message = check(raw)
    assert isinstance(message, OrderMessage)
    assert message.body["n"] == value


def test_nesting_up_to_the_limit_is_accepted() -> None:
    inner = MAX_NESTING - 1  # the order object itself is the first level
    for opener, closer in (("[", "]"), ('{"k":', "}")):
        ok = '{"orderId":"a","n":' + opener * inner + "0" + closer * inner + "}"
        too_deep = '{"orderId":"a","n":' + opener * (inner + 1) + "0" + closer * (inner + 1) + "}"
        assert isinstance(check(ok), OrderMessage)
        assert isinstance(check(too_deep), InvalidOrder)


def test_brackets_inside_strings_do_not_count_as_nesting() -> None:
    raw = json.dumps({"orderId": "a", "s": "[{" * 1_000 + '\\"[' * 100})
    assert isinstance(check(raw), OrderMessage)


@pytest.mark.parametrize(
    "text",
    [
        '{"a":"\\ud800"}',
        '{"\\udfff":1}',
        "[" + "9" * 4_301 + "]",
        "[" * 65 + "]" * 65,
        "[1e400]",
        "[NaN]",
        '{"a":1,"a":2}',
        "{",
    ],
)
def test_strict_json_raises_only_value_error_with_a_sentence(text: str) -> None:
    # For the other decoders of untrusted JSON (agent requests and replies).
    with pytest.raises(ValueError) as info:
        strict_json(text)
    assert str(info.value)


def test_strict_json_fuzz_never_raises_anything_but_value_error() -> None:
    rng = random.Random(3)
    for _ in range(1_000):
        text = "".join(rng.choice(_TOKENS) for _ in range(rng.randrange(0, 40)))
        try:
            strict_json(text)
        except ValueError as exc:
            str(exc).encode("utf-8")


# --- replyTo may not name the app's own queues ---------------------------------------------


@pytest.mark.parametrize("queue", sorted(Names().own_queues()))
def test_reply_to_may_not_name_any_of_the_apps_own_queues(queue: str) -> None:
    error = check(json.dumps({"orderId": "o-1", "replyTo": queue}))
    assert isinstance(error, InvalidOrder)
    assert str(error).startswith(f"replyTo '{queue}' is one of this app's own queues")
    assert error.order_id == "o-1"


def test_the_reserved_queues_are_the_deployments_own_names() -> None:
    names = Names.unique("t1")
    reserved = names.own_queues()
    assert {"operator-alerts-t1", "orders-t1-poison", "agent-replies-t1"} <= reserved

    refused = check(json.dumps({"orderId": "o-1", "replyTo": names.operator_alerts}), names=names)
    allowed = check(json.dumps({"orderId": "o-1", "replyTo": "operator-alerts"}), names=names)

    assert isinstance(refused, InvalidOrder)
    assert isinstance(allowed, OrderMessage)


@pytest.mark.parametrize(
    "queue",
    [
        "agent-requests",  # the shared request queue of versions before per-agent queues
        "agent-requests-shipping",  # an agent not declared (yet)
        "agent-requests-shipping-poison",
        "agent-requests-poison",
        "orders-rejected-poison",
    ],
)
def test_reply_to_may_not_name_a_queue_the_app_has_or_may_have(queue: str) -> None:
    """Not only the queues declared today: an agent declared tomorrow gets
    ``agent-requests-<agent>``, and the legacy shared queue is still drained by the CLI."""
    assert queue not in Names().own_queues()
    error = check(
        json.dumps({"orderId": "o-1", "replyTo": queue}), reply_queues=ReplyQueues.parse("*")
    )
    assert isinstance(error, InvalidOrder)
    assert "one of this app's own queues" in str(error)


def test_an_ordinary_reply_queue_is_still_accepted() -> None:
    message = check(json.dumps({"orderId": "o-1", "replyTo": "shop-status"}))
    assert isinstance(message, OrderMessage) and message.reply_to == "shop-status"


# --- replyTo must be a queue REPLY_QUEUES lists ---------------------------------------------


def test_by_default_no_reply_queue_is_allowed_and_the_reason_names_the_setting() -> None:
    error = check(
        json.dumps({"orderId": "o-1", "replyTo": "anything-new"}), reply_queues=ReplyQueues()
    )
    assert isinstance(error, InvalidOrder) and error.order_id == "o-1"
    assert str(error) == (
        "replyTo 'anything-new' is not allowed: this deployment sends status messages to no "
        "queue (REPLY_QUEUES is empty); send the order without replyTo, or ask the operator "
        "to add the queue to REPLY_QUEUES"
    )
    # An order without replyTo is what it was.
    assert isinstance(check('{"orderId": "o-1"}', reply_queues=ReplyQueues()), OrderMessage)


def test_reply_queues_names_and_prefixes() -> None:
    allowed = ReplyQueues.parse(" shop-status , partner-* ")
    assert str(allowed) == "shop-status,partner-*"
    for queue in ("shop-status", "partner-a", "partner-status-7"):
        message = check(json.dumps({"orderId": "o-1", "replyTo": queue}), reply_queues=allowed)
        assert isinstance(message, OrderMessage), queue
    for queue in ("shop-status-2", "shop", "partne-r", "anything-new"):
        error = check(json.dumps({"orderId": "o-1", "replyTo": queue}), reply_queues=allowed)
        assert isinstance(error, InvalidOrder), queue
        assert "REPLY_QUEUES (shop-status,partner-*) does not list it" in str(error)


def test_a_prefix_never_opens_the_apps_own_queues() -> None:
    for queue in ("agent-requests-shipping", "operator-alerts", "orders-poison"):
        error = check(
            json.dumps({"orderId": "o-1", "replyTo": queue}), reply_queues=ReplyQueues.parse("*")
        )
        assert isinstance(error, InvalidOrder) and "own queues" in str(error), queue


@pytest.mark.parametrize("bad", ["Shop", "a_b", "ab", "a*b", "**", "x" * 64, "shop/*"])
def test_reply_queues_refuses_what_is_not_a_queue_name_or_prefix(bad: str) -> None:
    with pytest.raises(ValueError, match="REPLY_QUEUES: "):
        ReplyQueues.parse(f"ok-queue,{bad}")


# --- fuzz: random bytes, random JSON, mutated orders ----------------------------------------

_TOKENS = [
    "{", "}", "[", "]", ":", ",", '"', '"orderId"', '"o-1"', '"replyTo"', '"workflow"',
    '"order"', "0", "-", "1", "9" * 30, "e", "E+", "400", ".", "1e400", "-1e400", "NaN",
    "Infinity", "true", "null", "\\u", "\\ud800", "\\udc00", "\\ud83d\\ude00", "\\\\", "\\",
    " ", "\n", "\t", "\x00", "\ud800", "é", "\U0001f600", "\u2028", "\ufeff",
]  # fmt: skip


def _random_string(rng: random.Random) -> str:
    pool = string.printable + "é中\U0001f600\x00\x7f\u2028\ud800\udfff"
    return "".join(rng.choice(pool) for _ in range(rng.randrange(0, 12)))


def _random_value(rng: random.Random, depth: int) -> Any:
    kind = rng.randrange(10 if depth < 80 else 6)
    if kind == 0:
        return _random_string(rng)
    if kind == 1:
        return rng.choice([0, -1, 2**53 + 1, -(10**30), int("9" * rng.randrange(1, 4_301))])
    if kind == 2:
        return rng.choice([0.5, -0.0, 1e308, 5e-324, 1.5e-300])
    if kind == 3:
        return rng.choice([True, False, None])
    if kind in (4, 5):
        return "ok"
    if kind in (6, 7):
        return [_random_value(rng, depth + 1) for _ in range(rng.randrange(0, 3))]
    return {_random_string(rng): _random_value(rng, depth + 1) for _ in range(rng.randrange(0, 3))}


def _mutate(rng: random.Random, text: str) -> str:
    chars = list(text)
    for _ in range(rng.randrange(1, 4)):
        at = rng.randrange(len(chars) + 1)
        op = rng.randrange(3)
        if op == 0 and chars:
            del chars[min(at, len(chars) - 1)]
        elif op == 1:
            chars.insert(at, rng.choice(_TOKENS))
        elif chars:
            chars[min(at, len(chars) - 1)] = rng.choice(_TOKENS)
    return "".join(chars)


def test_fuzz_random_bytes() -> None:
    rng = random.Random(20261122)
    for _ in range(1_500):
        raw = bytes(rng.randrange(256) for _ in range(rng.randrange(0, 64)))
        if rng.random() < 0.5:
            raw = b'{"orderId":"f' + raw + b'"}'
        check(raw)


def test_fuzz_random_token_soup() -> None:
    rng = random.Random(7)
    for _ in range(1_500):
        text = "".join(rng.choice(_TOKENS) for _ in range(rng.randrange(0, 40)))
        check(text)
        check(text.encode("utf-8", "surrogatepass"))  # bytes with an encoded surrogate


def test_fuzz_random_json_values() -> None:
    rng = random.Random(42)
    accepted = rejected = 0
    for _ in range(800):
        body = {"orderId": f"f-{rng.randrange(10**6)}", "data": _random_value(rng, 1)}
        if rng.random() < 0.3:
            body["replyTo"] = rng.choice(["shop-status", "operator-alerts", "ab", "orders-poison"])
        text = json.dumps(body, ensure_ascii=rng.random() < 0.5)
        result = check(text)
        if isinstance(result, OrderMessage):
            accepted += 1
        else:
            rejected += 1
    assert accepted > 100 and rejected > 100  # both sides were exercised


def test_fuzz_mutated_orders() -> None:
    rng = random.Random(99)
    seed = json.dumps(
        {"orderId": "m-1", "replyTo": "shop-status", "items": [{"sku": "A", "qty": 2.5e3}],
         "note": "Zo\u00eb \U0001f600", "n": [None, True, -0.0]},
        ensure_ascii=False,
    )  # fmt: skip
    for _ in range(2_000):
        check(_mutate(rng, seed))


class _Counted:
    """A compiled pattern of the decoder's nesting scan, with the positions it was asked
    to look from, per text."""

    def __init__(self, pattern: re.Pattern[str], looks: list[tuple[int, int]]):
        self._pattern = pattern
        self._looks = looks

    def search(self, text: str, pos: int = 0) -> re.Match[str] | None:
        self._looks.append((id(text), pos))
        return self._pattern.search(text, pos)

    def match(self, text: str, pos: int = 0) -> re.Match[str] | None:
        self._looks.append((id(text), pos))
        return self._pattern.match(text, pos)


@pytest.mark.parametrize("shape", sorted(WORST_SHAPES))
def test_the_decoder_bounds_its_work_on_the_worst_shapes_a_queue_can_carry(
    shape: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One forward scan for nesting (each look starts past the last one, at most one per
    bracket or quote: the string pattern is unrolled, so each look is linear too), at
    most one parse, and nesting refused before any parse. The time each takes is a
    figure of ``bench/decoder.py``."""
    raw = WORST_SHAPES[shape]
    looks: list[tuple[int, int]] = []
    parses: list[int] = []

    def loads(text: str, **kwargs: Any) -> Any:
        parses.append(len(text))
        return json.loads(text, **kwargs)

    monkeypatch.setattr(order_message, "_STRUCTURE", _Counted(order_message._STRUCTURE, looks))
    monkeypatch.setattr(order_message, "_STRING_REST", _Counted(order_message._STRING_REST, looks))
    monkeypatch.setattr(
        order_message,
        "json",
        SimpleNamespace(loads=loads, dumps=json.dumps, JSONDecodeError=json.JSONDecodeError),
    )

    result = check(raw)

    assert {text for text, _ in looks} == {id(raw)}  # the message itself, no copy of it
    positions = [pos for _, pos in looks]
    assert positions == sorted(set(positions)), "the nesting scan looked back"
    assert len(looks) <= sum(raw.count(c) for c in '[]{}"') + 1
    assert len(parses) <= 1
    if shape == "open-brackets":
        assert isinstance(result, InvalidOrder) and "levels deep" in result.message
        assert parses == [] and len(looks) == MAX_NESTING + 1  # stopped at the first too deep


def test_a_message_longer_than_a_queue_carries_is_refused_before_it_is_scanned(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    looks: list[tuple[int, int]] = []
    monkeypatch.setattr(order_message, "_STRUCTURE", _Counted(order_message._STRUCTURE, looks))

    result = check("[" * (MAX_MESSAGE_CHARS + 1))

    assert isinstance(result, InvalidOrder) and "holds at most" in result.message
    assert looks == []


# --- the order body over several Table properties -----------------------------------------


def _accept(body: dict[str, Any]) -> Order:
    message = decode_order(json.dumps(body, separators=(",", ":"), ensure_ascii=False))
    return Order.accept(message, Plan.of(WORKFLOWS["order"], 30), T0)


class _Entity(dict[str, Any]):
    """What the Table SDK returns: a dict with ``metadata``."""

    def __init__(self, values: dict[str, Any]):
        super().__init__(values)
        self.metadata = {"etag": "W/1"}


def _round_trip(order: Order) -> tuple[dict[str, Any], Order]:
    entity = order_entity(order, "w-1")
    loaded = parse_order([_Entity(entity)])
    assert loaded is not None
    return entity, loaded


def test_a_large_body_is_split_over_properties_each_within_the_table_limit() -> None:
    body = {"orderId": "big-1", "notes": [f"\U0001f600 line {n} \u00e9" for n in range(4_000)]}
    order = _accept(body)

    entity, loaded = _round_trip(order)

    parts = [k for k in entity if k == "Body" or (k.startswith("Body") and k[4:].isdigit())]
    assert parts == ["Body", "Body1", "Body2"][: len(parts)] and len(parts) >= 2
    assert entity["BodyParts"] == len(parts)
    assert all(utf16_units(entity[k]) <= BODY_PART_UNITS for k in parts)
    assert loaded.body == body


def test_the_worst_case_body_fits_an_entity() -> None:
    count = (MAX_MESSAGE_CHARS - 40) // 5
    order = Order.accept(
        decode_order('{"orderId":"w-1","a":[' + ",".join(["1e15"] * count) + "]}"),
        Plan.of(WORKFLOWS["order"], 30),
        T0,
    )

    entity, loaded = _round_trip(order)

    assert loaded.body == order.body
    assert entity["BodyParts"] <= 10
    # An entity holds 1 MiB; strings count 2 bytes a unit. Leave room for the rest.
    units = sum(utf16_units(v) for v in entity.values() if isinstance(v, str))
    assert units * 2 < 768 * 1024


def test_a_small_body_is_one_property() -> None:
    entity, loaded = _round_trip(_accept({"orderId": "s-1", "x": 1}))
    assert entity["Body"] == '{"orderId":"s-1","x":1}'
    assert entity["BodyParts"] == 1 and "Body1" not in entity
    assert loaded.body == {"orderId": "s-1", "x": 1}


def test_a_record_written_before_bodies_were_split_is_still_read() -> None:
    entity = order_entity(_accept({"orderId": "old-1", "x": "\U0001f600"}), "w-1")
    del entity["BodyParts"]

    loaded = parse_order([_Entity(entity)])

    assert loaded is not None and loaded.body == {"orderId": "old-1", "x": "\U0001f600"}


def test_a_missing_body_part_is_an_error_not_a_cut_body() -> None:
    order = _accept({"orderId": "cut-1", "blob": "y" * 40_000})
    entity = order_entity(order, "w-1")
    del entity["Body1"]

    with pytest.raises(ValueError, match="lacks body part"):
        parse_order([_Entity(entity)])


@pytest.mark.parametrize("limit", [2, 3, 7, 30_000])
def test_split_never_cuts_a_surrogate_pair_and_joins_back(limit: int) -> None:
    rng = random.Random(limit)
    alphabet = ["a", "\u00e9", "\u4e2d", "\U0001f600", "\U00010348"]
    for _ in range(50 if limit < 100 else 3):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, limit * 3)))

        parts = split_utf16(text, limit)

        assert "".join(parts) == text
        assert all(0 < utf16_units(p) <= limit for p in parts)
        for part in parts:  # each part stands alone as valid UTF-16
            part.encode("utf-16-le")


def test_split_packs_parts_full() -> None:
    text = "\U0001f600" * 10 + "a"  # 21 units
    assert [utf16_units(p) for p in split_utf16(text, 4)] == [4, 4, 4, 4, 4, 1]
    assert [utf16_units(p) for p in split_utf16(text, 5)] == [4, 4, 4, 4, 5]
    assert split_utf16("", 5) == []


# --- the cache of queue clients is bounded -----------------------------------------------


class _Client:
    def __init__(self, queue: str):
        self.queue_name = queue


class _Service:
    def __init__(self) -> None:
        self.made: list[str] = []

    def get_queue_client(self, queue: str) -> Any:
        self.made.append(queue)
        return _Client(queue)


def test_queue_clients_are_reused_and_the_least_recently_used_is_dropped() -> None:
    service = _Service()
    queues = StorageQueues(service, max_clients=3)  # type: ignore[arg-type]

    a = queues.client("q-a")
    queues.client("q-b")
    queues.client("q-c")
    assert queues.client("q-a") is a  # a hit, and now the most recent
    queues.client("q-d")  # drops q-b, the least recently used

    assert len(queues._clients) == 3
    assert set(queues._clients) == {"q-a", "q-c", "q-d"}
    assert queues.client("q-a") is a
    queues.client("q-b")
    assert service.made == ["q-a", "q-b", "q-c", "q-d", "q-b"]


def test_many_reply_queues_do_not_grow_the_cache_without_bound() -> None:
    queues = StorageQueues(_Service())  # type: ignore[arg-type]
    for n in range(5_000):
        queues.client(f"reply-{n}")
    assert len(queues._clients) == MAX_CACHED_CLIENTS == 256


def test_the_client_cache_is_thread_safe() -> None:
    service = _Service()
    queues = StorageQueues(service, max_clients=16)  # type: ignore[arg-type]
    errors: list[BaseException] = []

    def work(seed: int) -> None:
        rng = random.Random(seed)
        try:
            for _ in range(2_000):
                name = f"q-{rng.randrange(40)}"
                assert queues.client(name).queue_name == name
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert not errors
    assert len(queues._clients) <= 16
