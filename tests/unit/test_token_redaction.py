"""An agent message's per-attempt ``token`` (core/messages.py) is a secret: no alert,
quarantine record, kept copy, preview or log line carries its value, whichever path quotes
the message (core/redact.py). An order's own data is not an agent message: a rejected or
poisoned order is quoted unchanged (docs/contracts.md §3.1)."""

from __future__ import annotations

import base64
import json
import logging
from datetime import timedelta

import pytest

from core.messages import AgentRequest
from core.names import Names
from core.redact import MARKER, without_tokens, without_tokens_bytes
from messaging.quarantine import quarantine
from stores.kept import KeptMessage
from supervisor.poison import Poisoned, PoisonWatch
from tests.unit.test_poison import T0, FakeKeeper, FakeQueues, clock

SECRET = "s3cr3t-Attempt_Token-0123456789"
NAMES = Names()


def request(**order: object) -> AgentRequest:
    return AgentRequest(
        "o-1", "process", 2, T0 + timedelta(seconds=30), "process", dict(order), token=SECRET
    )


def large(filler: str) -> bytes:
    """An agent request too large to quote in its record (an order too large to travel
    in a request is left out of it, so this one is written by hand)."""
    body = {**request().to_json(), "order": {"note": filler * 40_000}}
    return json.dumps(body, separators=(",", ":")).encode()


def nowhere(*texts: object) -> None:
    for text in texts:
        assert SECRET not in str(text), str(text)[:300]


# --- the rule ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('{"orderId":"o","token":"abc"}', '{"orderId":"o","token":"(removed)"}'),
        ('{"token" : "a\\"b", "x": 1}', '{"token" : "(removed)", "x": 1}'),
        # not JSON: cut short, invalid, or a record's quoted message
        ('{"orderId":"o","token":"abc","ord', '{"orderId":"o","token":"(removed)","ord'),
        ('{"m":"{\\"token\\":\\"abc\\"}"}', '{"m":"{\\"token\\":\\"(removed)\\"}"}'),
        ('{"tok\\u0065n": "abc", "n": [1]}', '{"token": "(removed)", "n": [1]}'),  # rewritten
        ("no token here", "no token here"),
    ],
)
def test_every_token_value_becomes_the_marker(text: str, expected: str) -> None:
    assert without_tokens(text) == expected
    assert without_tokens_bytes(text.encode()) == expected.encode()


def test_a_token_in_bytes_that_are_not_utf8_is_removed_too() -> None:
    raw = b'\xff{"token":"' + SECRET.encode() + b'","orderId":"o"}\xfe'
    assert without_tokens_bytes(raw) == b'\xff{"token":"(removed)","orderId":"o"}\xfe'


def test_a_token_under_a_key_spelled_with_escapes_is_removed_from_valid_json() -> None:
    text = json.dumps({"a": {"\u0074oken": SECRET}}, ensure_ascii=True).replace("t", "\\u0074", 1)
    assert json.loads(without_tokens(text)) == {"a": {"token": MARKER}}


# --- quarantine -------------------------------------------------------------------------


def test_a_quarantined_agent_message_keeps_no_token(caplog: pytest.LogCaptureFixture) -> None:
    queues = FakeQueues()
    raw = request().encode().encode()
    assert SECRET.encode() in raw
    with caplog.at_level(logging.DEBUG):
        quarantine(queues, "agent-replies", raw, f"forged: {raw.decode()}", clock, FakeKeeper())
    [record] = queues.on("agent-replies-poison")
    assert json.loads(record["message"])["token"] == MARKER
    nowhere(queues.sent, [r.getMessage() for r in caplog.records])


def test_a_large_quarantined_message_is_kept_without_its_token() -> None:
    queues, keeper = FakeQueues(), FakeKeeper()
    raw = large('"')
    quarantine(queues, "agent-requests-orders", raw, "bad", clock, keeper)
    [record] = queues.on("agent-requests-orders-poison")
    assert record["keptAs"] in keeper.kept and MARKER in record["messagePreview"]
    nowhere(queues.sent, keeper.kept)


# --- poison and dead-letter alerts ------------------------------------------------------


@pytest.fixture
def watched() -> tuple[PoisonWatch, FakeQueues, FakeKeeper]:
    queues, keeper = FakeQueues(), FakeKeeper()
    return PoisonWatch(queues, NAMES, keeper, clock), queues, keeper


def test_a_poisoned_agent_request_is_alerted_without_its_token(
    watched: tuple[PoisonWatch, FakeQueues, FakeKeeper], caplog: pytest.LogCaptureFixture
) -> None:
    watch, queues, keeper = watched
    raw = request().encode().encode()
    with caplog.at_level(logging.DEBUG):
        alert = watch.alert(Poisoned("agent-requests-orders-poison", raw, 5))
        # a dead letter whose description quotes the message
        watch.alert(Poisoned("agent-replies/$DeadLetterQueue", raw, 10, f"bad: {raw.decode()}"))
    assert json.loads(alert["message"])["token"] == MARKER
    assert alert["orderId"] == "o-1" and alert["step"] == "process"
    nowhere(queues.sent, keeper.kept, [r.getMessage() for r in caplog.records])


def test_a_large_or_binary_poisoned_message_keeps_and_previews_no_token(
    watched: tuple[PoisonWatch, FakeQueues, FakeKeeper],
) -> None:
    watch, queues, keeper = watched
    alert = watch.alert(Poisoned("agent-replies-poison", large("xy"), 5))
    assert alert["keptAs"] in keeper.kept and MARKER in alert["messagePreview"]
    binary = b"\xff" + request().encode().encode()
    alert = watch.alert(Poisoned("agent-replies-poison", binary, 5))
    assert MARKER.encode() in base64.b64decode(alert["messageBase64"])
    nowhere(queues.sent, keeper.kept, base64.b64decode(alert["messageBase64"]))


def test_a_quarantine_record_written_before_quotes_no_token_in_its_alert(
    watched: tuple[PoisonWatch, FakeQueues, FakeKeeper],
) -> None:
    watch, queues, _ = watched
    record = {"reason": "forged", "message": request().encode(), "queue": "agent-replies"}
    watch.alert(Poisoned("agent-replies-poison", json.dumps({**record, "at": "x"}).encode(), 1))
    nowhere(queues.sent)


def test_a_poisoned_order_is_quoted_unchanged_even_with_a_field_named_token(
    watched: tuple[PoisonWatch, FakeQueues, FakeKeeper],
) -> None:
    watch, _, _ = watched
    order = json.dumps({"orderId": "o-2", "token": "card-tok-1"})
    alert = watch.alert(Poisoned("orders-poison", order.encode(), 5))
    assert alert["message"] == order  # business data: the contract keeps it as it came


# --- what an operator reads -------------------------------------------------------------


def test_a_kept_agent_message_is_shown_without_its_token() -> None:
    text = request().encode()
    kept = KeptMessage("r", "agent-replies-poison", "why", text, T0, length=len(text))
    shown = kept.without_tokens()
    assert json.loads(shown.text)["token"] == MARKER and shown.length == len(text)
    raw = b"\xff" + text.encode()
    binary = KeptMessage("r", "q-poison", "why", base64.b64encode(raw).decode(), T0, "base64")
    nowhere(base64.b64decode(binary.without_tokens().text))


def test_admin_kept_show_and_list_print_no_token_of_an_agent_message(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from types import SimpleNamespace

    from admin import __main__ as cli
    from stores.kept import KeptMessages
    from tests.unit.test_poison import FakeTable

    table = FakeTable()
    kept = KeptMessages(table)  # type: ignore[arg-type]
    agent = kept.keep("agent-replies-poison", request().encode(), "forged", T0)
    order_text = json.dumps({"orderId": "o-2", "token": "card-tok-1"})
    order = kept.keep("orders-rejected", order_text, "too large", T0)
    ctx = SimpleNamespace(store=SimpleNamespace(table=table), names=NAMES)

    for row in (agent, order):
        assert cli._kept(ctx, SimpleNamespace(kept_command="show", row=row)) == 0  # type: ignore[arg-type]
    printed = capsys.readouterr().out
    shown_agent, end = json.JSONDecoder().raw_decode(printed)
    shown_order = json.loads(printed[end:])
    assert json.loads(shown_agent["text"])["token"] == MARKER
    assert shown_order["text"] == order_text  # an order's own data, unchanged
    assert cli._kept(ctx, SimpleNamespace(kept_command="list", limit=10)) == 0  # type: ignore[arg-type]
    listed = capsys.readouterr().out
    nowhere(listed)
    assert "card-tok-1" in listed
