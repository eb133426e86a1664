"""Poison and dead-letter alerts (supervisor/poison.py), quarantine and rejection records
that must fit their queue, and the kept copies of messages too large for them; with fakes."""

from __future__ import annotations

import base64
import json
import logging
from datetime import UTC, datetime
from typing import Any

import pytest
from azure.core.exceptions import HttpResponseError, ResourceNotFoundError

from core.messages import UNDECLARED_STEP, alert_message, alert_step, rejection_message
from core.names import Names
from core.order_message import utf16_units
from messaging.dispatch import DispatchQueue
from messaging.outbox import NoticeSender
from messaging.quarantine import quarantine
from scheduler.service import Scheduler, SchedulerConfig
from stores import entities
from stores import kept as kept_module
from stores.kept import (
    MAX_RECORD_BYTES,
    PART_UNITS,
    PREVIEW_CHARS,
    KeptMessages,
    fits_a_queue_message,
)
from supervisor.poison import MAX_INLINE_CHARS, Poisoned, PoisonWatch

T0 = datetime(2026, 11, 22, 10, 15, 30, 123000, tzinfo=UTC)
QUEUE_LIMIT = 65_536  # bytes of UTF-8 a Storage queue message holds
NAMES = Names()
EMOJI = "\U0001f600"  # outside the BMP: two UTF-16 units, four UTF-8 bytes


class FakeQueues:
    """Records what is sent; refuses what the queue service would (over 64 KiB of UTF-8)."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, str]] = []

    def send(
        self,
        queue: str,
        body: str,
        *,
        delay_seconds: float = 0,
        ttl_seconds: int | None = None,
        create: bool = True,
    ) -> None:
        if len(body.encode("utf-8")) > QUEUE_LIMIT:
            raise HttpResponseError(message="RequestBodyTooLarge")
        self.sent.append((queue, body))

    def exists(self, queue: str) -> bool:
        return True

    def on(self, queue: str) -> list[dict[str, Any]]:
        return [json.loads(body) for q, body in self.sent if q == queue]


class FakeKeeper:
    def __init__(self) -> None:
        self.kept: dict[str, dict[str, Any]] = {}

    def keep(
        self, queue: str, text: str, reason: str, at: datetime, *, encoding: str = "text"
    ) -> str:
        row = f"row{len(self.kept) + 1}"
        self.kept[row] = {"queue": queue, "text": text, "reason": reason, "encoding": encoding}
        return row


class FakeTable:
    """The few TableClient calls KeptMessages makes, with the service's property limit."""

    def __init__(self) -> None:
        self.entities: dict[tuple[str, str], dict[str, Any]] = {}

    def create_entity(self, entity: dict[str, Any]) -> None:
        for value in entity.values():
            if isinstance(value, str):
                assert utf16_units(value) <= 32_768, "a string property holds 64 KiB"
        self.entities[(entity["PartitionKey"], entity["RowKey"])] = dict(entity)

    def get_entity(self, pk: str, rk: str, **_: Any) -> dict[str, Any]:
        try:
            return dict(self.entities[(pk, rk)])
        except KeyError:
            raise ResourceNotFoundError("no such entity") from None

    def delete_entity(self, pk: str, rk: str) -> None:
        self.entities.pop((pk, rk), None)  # like the SDK: a missing entity is no error

    def query_entities(self, _filter: str, **kwargs: Any) -> list[dict[str, Any]]:
        pk = kwargs["parameters"]["pk"]
        return [e for (p, _), e in sorted(self.entities.items()) if p == pk]


def clock() -> datetime:
    return T0


@pytest.fixture
def queues() -> FakeQueues:
    return FakeQueues()


@pytest.fixture
def keeper() -> FakeKeeper:
    return FakeKeeper()


@pytest.fixture
def watch(queues: FakeQueues, keeper: FakeKeeper) -> PoisonWatch:
    return PoisonWatch(queues, NAMES, keeper, clock)


def alert_of(queues: FakeQueues) -> dict[str, Any]:
    [alert] = queues.on(NAMES.operator_alerts)
    return alert


def the_body(queues: FakeQueues) -> str:
    [body] = [b for q, b in queues.sent if q == NAMES.operator_alerts]
    return body


# --- PoisonWatch -----------------------------------------------------------------------------


def test_a_host_poisoned_order_names_order_queue_and_deliveries_and_carries_it_unchanged(
    watch: PoisonWatch, queues: FakeQueues, keeper: FakeKeeper, caplog: pytest.LogCaptureFixture
) -> None:
    text = ' {"orderId": "o-1001", "sku": "A-1", "note": "caf\u00e9 \\u0000 ' + EMOJI + '"}\n'

    with caplog.at_level(logging.ERROR):
        returned = watch.alert(Poisoned("orders-poison", text.encode(), 5))

    alert = alert_of(queues)
    assert alert == returned
    assert alert["orderId"] == "o-1001" and alert["step"] == ""
    assert alert["failureCount"] == 5
    assert alert["queue"] == "orders" and alert["poisonQueue"] == "orders-poison"
    assert alert["message"] == text  # unchanged, whitespace and escapes included
    assert "orders-poison" in alert["reason"] and "5 times" in alert["reason"]
    assert "send it again to orders" in alert["reason"]
    assert alert["at"] == "2026-11-22T10:15:30.123Z"
    assert not keeper.kept
    [record] = [r for r in caplog.records if r.getMessage().startswith("OPERATOR ALERT")]
    assert record.levelno == logging.ERROR
    assert "order=o-1001" in record.getMessage() and "failureCount=5" in record.getMessage()


def test_a_quarantine_record_gives_its_reason_and_its_inner_message(
    watch: PoisonWatch, queues: FakeQueues
) -> None:
    inner = json.dumps({"orderId": "o-7", "step": "ship", "attempt": 1, "outcome": "maybe"})
    record = {
        "reason": "agent reply: outcome must be one of succeeded, failed, got 'maybe'",
        "message": inner,
        "queue": "agent-replies",
        "at": "2026-11-22T10:15:29.000Z",
    }

    watch.alert(Poisoned("agent-replies-poison", json.dumps(record).encode(), 1))

    alert = alert_of(queues)
    assert alert["message"] == inner  # the message itself, not the record around it
    assert alert["orderId"] == "o-7" and alert["step"] == "ship"
    assert "outcome must be one of" in alert["reason"]
    assert "failed on it" not in alert["reason"]
    assert "supervisor retries" in alert["reason"]  # an agent message: the step is not lost
    assert alert["queue"] == "agent-replies"


def test_a_malformed_reply_cannot_mint_an_alert_dimension(
    watch: PoisonWatch, queues: FakeQueues, caplog: pytest.LogCaptureFixture
) -> None:
    """The alert rule splits by step (one e-mail per value): a reply naming a step no
    workflow declares gets the fixed placeholder, in the alert and its log record, and
    the reason keeps what it said."""
    made_up = [f"made-up-{n}" for n in range(3)]
    with caplog.at_level(logging.ERROR):
        for step in made_up:
            inner = json.dumps({"orderId": "o-7", "step": step, "attempt": 1})
            record = {"reason": "forged", "message": inner, "queue": "agent-replies", "at": "x"}
            watch.alert(Poisoned("agent-replies-poison", json.dumps(record).encode(), 1))
    alerts = queues.on(NAMES.operator_alerts)
    assert {a["step"] for a in alerts} == {UNDECLARED_STEP}
    for step, alert in zip(made_up, alerts, strict=True):
        assert f'it names step "{step}", which no workflow declares' in alert["reason"]
    logged = [r.getMessage() for r in caplog.records if "OPERATOR ALERT" in r.getMessage()]
    assert len(logged) == 3 and all(f"step={UNDECLARED_STEP} " in m for m in logged)
    assert {getattr(r, "step", None) for r in caplog.records} == {UNDECLARED_STEP}


def test_an_alert_step_is_a_declared_name_none_or_the_placeholder() -> None:
    assert alert_step("ship") == ("ship", "")  # declared (tests/fixtures/shop.py)
    assert alert_step("refund-payment") == ("refund-payment", "")  # a compensation
    assert alert_step("") == ("", "") and alert_step(None) == ("", "")
    step, detail = alert_step("x\u202eexe.txt\n" + "y" * 200)
    assert step == UNDECLARED_STEP
    assert "\\u202e" in detail and "\\u000a" in detail and "\u202e" not in detail
    assert len(detail) < 200
    body = json.loads(alert_message("o-1", "nope", "It failed.", 3, T0))
    assert body["step"] == UNDECLARED_STEP
    assert body["reason"] == 'It failed. (it names step "nope", which no workflow declares)'


def test_a_dead_lettered_service_bus_message_gives_the_dead_letter_reason(
    watch: PoisonWatch, queues: FakeQueues
) -> None:
    body = json.dumps({"orderId": "o-9", "step": "charge-payment", "attempt": 2}).encode()
    why = "MaxDeliveryCountExceeded - Message could not be consumed after 5 delivery attempts."

    watch.alert(Poisoned("agent-requests/$DeadLetterQueue", body, 5, why))

    alert = alert_of(queues)
    assert alert["orderId"] == "o-9" and alert["step"] == "charge-payment"
    assert alert["queue"] == "agent-requests"
    assert alert["poisonQueue"] == "agent-requests/$DeadLetterQueue"
    assert why in alert["reason"]
    assert alert["message"] == body.decode()
    assert alert["failureCount"] == 5


def test_a_dead_lettered_wake_up_says_its_order_is_still_started_later(
    watch: PoisonWatch, queues: FakeQueues
) -> None:
    """A wake-up (a delay's end, a retry after its backoff) that failed its deliveries is
    alerted like any dead letter, and says what still wakes its order: not "nothing
    retries it", which would send an operator to re-send it by hand."""
    body = json.dumps({"orderId": "o-12"}).encode()
    why = "MaxDeliveryCountExceeded - Message could not be consumed after 5 delivery attempts."

    watch.alert(Poisoned(f"{NAMES.order_wakeups}/$DeadLetterQueue", body, 5, why))

    alert = alert_of(queues)
    assert alert["orderId"] == "o-12" and alert["queue"] == NAMES.order_wakeups
    assert why in alert["reason"]
    assert "The order is not lost" in alert["reason"]
    assert "scheduler's sweep" in alert["reason"] and "supervisor" in alert["reason"]
    assert "Nothing retries it" not in alert["reason"]


def test_a_poisoned_dispatch_says_the_sweep_takes_the_order(
    watch: PoisonWatch, queues: FakeQueues
) -> None:
    watch.alert(Poisoned("order-dispatch-poison", b'{"orderId":"o-3"}', 5))

    alert = alert_of(queues)
    assert alert["orderId"] == "o-3" and "sweep" in alert["reason"]


@pytest.mark.parametrize("body", [b"hello, not JSON", b"[1, 2]", b"", b"{", b"[" * 100_000])
def test_a_message_that_is_not_a_json_object_is_alerted_as_it_is(
    watch: PoisonWatch, queues: FakeQueues, body: bytes
) -> None:
    watch.alert(Poisoned("orders-poison", body, 5))

    alert = alert_of(queues)
    assert alert["orderId"] == "" and alert["step"] == ""
    if "message" in alert:
        assert alert["message"] == body.decode()
    else:
        assert alert["messagePreview"] == body.decode()[:PREVIEW_CHARS]
    assert "messageBase64" not in alert


def test_a_message_that_is_not_utf8_keeps_its_exact_bytes(
    watch: PoisonWatch, queues: FakeQueues
) -> None:
    body = b'{"orderId":"o-1","x":"\xff\xfe"}'

    watch.alert(Poisoned("orders-poison", body, 5))

    alert = alert_of(queues)
    assert alert["message"] == body.decode("utf-8", errors="replace")
    assert base64.b64decode(alert["messageBase64"]) == body
    assert alert["orderId"] == "o-1"


def test_a_long_message_is_kept_whole_and_the_alert_carries_a_preview(
    watch: PoisonWatch, queues: FakeQueues, keeper: FakeKeeper
) -> None:
    # Over 40,000 characters, non-BMP characters across every boundary that matters.
    text = json.dumps({"orderId": "o-big", "blob": (EMOJI + "ab\u00e9") * 10_001})
    assert len(text) > MAX_INLINE_CHARS

    watch.alert(Poisoned("orders-poison", text.encode(), 5))

    alert = alert_of(queues)
    assert "message" not in alert
    assert alert["messagePreview"] == text[:PREVIEW_CHARS]
    row = alert["keptAs"]
    assert keeper.kept[row]["text"] == text
    assert keeper.kept[row]["queue"] == "orders-poison"
    assert f"python -m admin kept show {row}" in alert["reason"]
    assert alert["orderId"] == "o-big"  # read before the message was cut


def test_a_message_under_40000_characters_whose_alert_would_not_fit_is_kept(
    watch: PoisonWatch, queues: FakeQueues, keeper: FakeKeeper
) -> None:
    text = EMOJI * 39_000  # 39,000 characters; 12 bytes each once escaped in the alert

    watch.alert(Poisoned("orders-poison", text.encode(), 5))

    alert = alert_of(queues)
    assert keeper.kept[alert["keptAs"]]["text"] == text


def test_a_quarantine_record_that_kept_its_message_passes_the_key_on(
    watch: PoisonWatch, queues: FakeQueues, keeper: FakeKeeper
) -> None:
    record = {
        "reason": "agent request: attempt must be a whole number >= 1, got 0",
        "at": "2026-11-22T10:15:29.000Z",
        "queue": "agent-requests",
        "orderId": "o-5",
        "step": "process",
        "messagePreview": '{"orderId":"o-5","step":"process","attempt":0,"order":{"x":"',
        "keptAs": "20261122T101529.000000Z-agent-requests-poison-abc",
    }

    watch.alert(Poisoned("agent-requests-poison", json.dumps(record).encode(), 1))

    alert = alert_of(queues)
    assert alert["keptAs"] == record["keptAs"] and not keeper.kept  # not kept twice
    assert alert["messagePreview"] == record["messagePreview"]
    assert alert["orderId"] == "o-5" and alert["step"] == "process"
    assert "attempt must be" in alert["reason"]


def test_an_order_with_record_like_fields_on_the_orders_poison_queue_is_an_order(
    watch: PoisonWatch, queues: FakeQueues
) -> None:
    order = json.dumps(
        {"orderId": "o-2", "reason": "gift", "message": "happy birthday", "queue": "q", "at": 1}
    )

    watch.alert(Poisoned("orders-poison", order.encode(), 5))

    alert = alert_of(queues)
    assert alert["message"] == order and "gift" not in alert["reason"]


def _largest_inputs() -> list[tuple[str, Poisoned]]:
    sb_body = json.dumps({"orderId": "o", "blob": "\u00e9" * 130_000}).encode()  # 256 KB
    return [
        ("64 KiB of quotes", Poisoned("orders-poison", b'"' * QUEUE_LIMIT, 5)),
        ("64 KiB of non-BMP", Poisoned("orders-poison", EMOJI.encode() * (QUEUE_LIMIT // 4), 5)),
        ("64 KiB of control characters", Poisoned("orders-poison", b"\x01" * QUEUE_LIMIT, 5)),
        ("64 KiB of invalid UTF-8", Poisoned("orders-poison", b"\xff" * QUEUE_LIMIT, 5)),
        ("40,000 non-BMP", Poisoned("orders-poison", EMOJI.encode() * MAX_INLINE_CHARS, 5)),
        ("huge orderId and step", Poisoned("agent-requests-poison", _huge_ids(), 5)),
        (
            "a record with a huge keptAs",
            Poisoned("agent-replies-poison", _record_with_a_huge_kept_as(), 1),
        ),
        ("a 256 KB dead letter", Poisoned("agent-replies/$DeadLetterQueue", sb_body, 10)),
        (
            "a dead letter with a huge reason",
            Poisoned("agent-requests/$DeadLetterQueue", b"{}", 10, EMOJI * 100_000),
        ),
        (
            "a quarantine record with a huge reason and message",
            Poisoned(
                "agent-replies-poison",
                json.dumps(
                    {
                        "reason": EMOJI * 30_000,
                        "message": "\x02" * 30_000,
                        "queue": "agent-replies",
                        "at": "x",
                    }
                ).encode(),
                1,
            ),
        ),
    ]


def _record_with_a_huge_kept_as() -> bytes:
    return json.dumps(
        {"reason": "r", "queue": "agent-replies", "at": "x", "keptAs": "k" * 70_000}
    ).encode()


def _huge_ids() -> bytes:
    return json.dumps({"orderId": "o" * 30_000, "step": "s" * 30_000}).encode()


@pytest.mark.parametrize(("kind", "poisoned"), _largest_inputs(), ids=lambda x: str(x)[:40])
def test_the_alert_always_fits_a_storage_queue_message(
    watch: PoisonWatch, queues: FakeQueues, keeper: FakeKeeper, kind: str, poisoned: Poisoned
) -> None:
    watch.alert(poisoned)  # FakeQueues refuses anything over 64 KiB

    body = the_body(queues)
    assert len(body.encode("utf-8")) <= MAX_RECORD_BYTES, kind
    alert = json.loads(body)
    assert {"orderId", "step", "reason", "failureCount", "at"} <= alert.keys()
    if "keptAs" in alert:
        kept = keeper.kept[alert["keptAs"]]
        if kept["encoding"] == "base64":
            assert base64.b64decode(kept["text"]) == poisoned.body
        else:
            assert kept["text"] == _inner(poisoned.body.decode())
    else:
        assert alert["message"] == _inner(poisoned.body.decode())


def _inner(text: str) -> str:
    """The message a poisoned body stands for: itself, or a quarantine record's message."""
    record = json.loads(text) if text.startswith('{"reason"') else None
    return record.get("message", text) if isinstance(record, dict) else text


# --- quarantine ----------------------------------------------------------------------------


def test_a_quarantine_record_carries_reason_message_queue_and_at(queues: FakeQueues) -> None:
    quarantine(queues, "agent-replies", b'{"orderId":"o"}', "bad reply", clock, FakeKeeper())

    [record] = queues.on("agent-replies-poison")
    assert record == {
        "reason": "bad reply",
        "message": '{"orderId":"o"}',
        "queue": "agent-replies",
        "at": "2026-11-22T10:15:30.123Z",
    }


def test_a_large_malformed_agent_message_is_kept_and_its_record_fits(
    queues: FakeQueues, keeper: FakeKeeper
) -> None:
    text = json.dumps(
        {"orderId": "o-big", "step": "process", "attempt": 0, "order": {"x": '"' * 28_000}}
    )
    assert len(text.encode()) < QUEUE_LIMIT  # the message fits; quoted, it would not

    quarantine(queues, "agent-requests", text.encode(), "attempt must be >= 1", clock, keeper)

    [record] = queues.on("agent-requests-poison")
    assert set(record) == {
        "reason",
        "at",
        "queue",
        "orderId",
        "step",
        "messagePreview",
        "keptAs",
    }
    assert record["reason"] == "attempt must be >= 1" and record["queue"] == "agent-requests"
    assert record["messagePreview"] == text[:PREVIEW_CHARS]
    assert (record["orderId"], record["step"]) == ("o-big", "process")
    assert keeper.kept[record["keptAs"]]["text"] == text
    assert keeper.kept[record["keptAs"]]["queue"] == "agent-requests-poison"


def test_a_large_malformed_message_that_is_not_utf8_keeps_its_exact_bytes(
    queues: FakeQueues, keeper: FakeKeeper
) -> None:
    raw = b"\xff" * 40_000

    quarantine(queues, "agent-replies", raw, "not UTF-8", clock, keeper)

    [record] = queues.on("agent-replies-poison")
    kept = keeper.kept[record["keptAs"]]
    assert kept["encoding"] == "base64" and base64.b64decode(kept["text"]) == raw


def test_without_a_keeper_quarantine_sends_the_whole_record_as_before(queues: FakeQueues) -> None:
    with pytest.raises(HttpResponseError):  # too large: the host's retries take over
        quarantine(queues, "agent-requests", b'"' * 40_000, "bad", clock)


# --- Scheduler.reject ----------------------------------------------------------------------


class FakeStore:
    def __init__(self) -> None:
        self.table = FakeTable()


def scheduler(queues: FakeQueues, store: FakeStore) -> Scheduler:
    fake: Any = store
    keeper = KeptMessages(store.table)  # type: ignore[arg-type]
    notices = NoticeSender(fake, queues, NAMES)
    later = DispatchQueue(queues, NAMES, clock)
    config = SchedulerConfig("test", 30)
    return Scheduler(fake, queues, fake, NAMES, config, clock, keeper, notices, later)


def test_a_rejection_reason_shows_bidi_and_control_characters_escaped(
    queues: FakeQueues,
) -> None:
    """A reason quotes what the message said: controls and bidi characters are written
    out (``\\u202e``) there; the message itself stays the original, unchanged."""
    original = '{"orderId": "o-1"}'
    body = json.loads(rejection_message("got \u202eexe.txt\n", original, T0))
    assert body["reason"] == "got \\u202eexe.txt\\u000a"
    assert body["message"] == original
    message = '{"orderId":"o-1","replyTo":"\u202eshop-status"}'
    scheduler(queues, FakeStore()).submit(message.encode())
    [record] = queues.on(NAMES.orders_rejected)
    assert "\u202e" not in record["reason"] and record["message"] == message


def test_a_rejection_that_fits_is_unchanged(queues: FakeQueues) -> None:
    store = FakeStore()

    scheduler(queues, store).submit(b'{"orderId":"has space"}')

    [record] = queues.on(NAMES.orders_rejected)
    assert set(record) == {"reason", "message", "at"}
    assert record["message"] == '{"orderId":"has space"}'
    assert not store.table.entities


def test_a_60_kb_order_with_a_bad_order_id_is_rejected_with_a_kept_copy(
    queues: FakeQueues,
) -> None:
    store = FakeStore()
    text = json.dumps(
        {"orderId": "not valid!", "note": ('say "hi" ' + EMOJI) * 4_000}, ensure_ascii=False
    )
    assert 55_000 < len(text.encode()) < QUEUE_LIMIT

    scheduler(queues, store).submit(text.encode())

    [record] = queues.on(NAMES.orders_rejected)
    assert set(record) == {"reason", "at", "messagePreview", "keptAs"}
    assert "orderId must be" in record["reason"]
    assert record["messagePreview"] == text[:PREVIEW_CHARS]
    kept = KeptMessages(store.table).get(record["keptAs"])  # type: ignore[arg-type]
    assert kept is not None and kept.text == text and kept.queue == NAMES.orders_rejected
    assert kept.encoding == "text" and "orderId must be" in kept.reason


def test_a_large_rejection_that_is_not_utf8_keeps_the_exact_bytes(queues: FakeQueues) -> None:
    store = FakeStore()
    raw = b'{"orderId":"o-1","x":"' + b"\xfe" * 30_000 + b'"}'

    scheduler(queues, store).submit(raw)

    [record] = queues.on(NAMES.orders_rejected)
    assert "not UTF-8" in record["reason"] and "messageBase64" not in record
    kept = KeptMessages(store.table).get(record["keptAs"])  # type: ignore[arg-type]
    assert kept is not None and kept.encoding == "base64"
    assert base64.b64decode(kept.text) == raw


def test_the_kept_record_cuts_a_huge_reason_but_keeps_the_contract_fields() -> None:
    body = rejection_message("r" * 70_000, "m" * 70_000, T0, kept_as="row-1")

    assert fits_a_queue_message(body)
    record = json.loads(body)
    assert set(record) == {"reason", "at", "messagePreview", "keptAs"}
    assert record["reason"].startswith("r" * 2_000) and len(record["reason"]) == 2_001


# --- KeptMessages ------------------------------------------------------------------------------


def test_kept_text_is_split_between_code_points_and_joins_back_exactly(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    text = ("a" + EMOJI * 3 + "\u00e9") * 40_000  # 200,000 characters, 320,000 UTF-16 units
    table = FakeTable()
    kept = KeptMessages(table)  # type: ignore[arg-type]
    measured: list[int] = []

    def counted(part: str) -> int:
        measured.append(len(part))
        return utf16_units(part)

    monkeypatch.setattr(entities, "utf16_units", counted)
    row = kept.keep("orders-poison", text, "why", T0)

    entity = table.entities[("kept", row)]
    parts = [entity[k] for k in sorted(entity) if k.startswith("Text")]
    assert all(utf16_units(p) <= PART_UNITS for p in parts)
    # The split's work is bounded: each part is measured a few times (the excess at least
    # halves with each cut), never more than a part's length at a time.
    assert len(measured) <= len(parts) * PART_UNITS.bit_length()
    assert max(measured) <= PART_UNITS
    got = kept.get(row)
    assert got is not None and got.text == text and not got.truncated and got.length == len(text)


def test_a_text_larger_than_an_entity_keeps_its_beginning_and_says_so() -> None:
    text = "x" * (kept_module.MAX_KEPT_UNITS + 10)
    kept = KeptMessages(FakeTable())  # type: ignore[arg-type]

    got = kept.get(kept.keep("agent-requests/$DeadLetterQueue", text, "why", T0))

    assert got is not None and got.truncated and got.length == len(text)
    assert text.startswith(got.text) and len(got.text) == kept_module.MAX_KEPT_UNITS


def test_kept_row_keys_are_safe_and_unknown_keys_are_not_found() -> None:
    kept = KeptMessages(FakeTable())  # type: ignore[arg-type]

    row = kept.keep("agent-requests/$DeadLetterQueue", "x", "why", T0)

    assert row.startswith("20261122T101530.123000Z-agent-requests-DeadLetterQueue-")
    assert all(c.isalnum() or c in "._-" for c in row)
    [summary] = kept.summaries()
    assert summary.row == row and summary.queue == "agent-requests/$DeadLetterQueue"
    assert kept.get("no/such#row?") is None and kept.get("missing") is None
    assert kept.delete("missing") is False
    assert kept.delete(row) is True and kept.get(row) is None
