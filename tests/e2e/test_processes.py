"""The whole pipeline in real processes, including SIGKILLs at the worst moments.

Each test builds its own ``LocalStack`` (Azurite, simulator, devhost
instances; the ``stack`` fixture, tests/e2e/conftest.py) and checks the outcome from
outside: the table, the queues and the simulator's ledger of applied effects.

The mixed batch and the agent killed mid-call run on both agent transports (Storage
queues, and Service Bus on localbus: what the transport changes); the other tests on
Storage queues (what they test does not depend on the transport). Service-Bus-only
behaviour is in test_servicebus_mode.py.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import runpy
import shlex
import sys
import time
from datetime import datetime
from pathlib import Path

import httpx
import pytest

from core.model import Order
from core.workflows import AGENTS
from demo.stack import LocalStack
from demo.verify import drain_alerts_for, verify
from simulator import effects_by_order, load_ledger
from tests.support import wait_for

pytestmark = pytest.mark.timeout(240)

#: Every agent function: one per declared agent.
AGENT_FUNCTIONS = ",".join(sorted(a.function_name for a in AGENTS.values()))
#: ``@pytest.mark.parametrize("transport", TRANSPORTS)``: one body on each agent transport
#: (the ``stack`` fixture's ``transport``, tests/e2e/conftest.py).
TRANSPORTS = ["storage", "servicebus"]


def load(stack: LocalStack, order_id: str) -> Order | None:
    return stack.context.store.load(order_id)


def wait_terminal(stack: LocalStack, order_ids: list[str], quiet: float) -> dict[str, Order]:
    """Until every order has ended. A wait sized by the work, not by a guess at the
    machine's speed: it fails only when ``quiet`` seconds pass in which no order moved (no
    order saved since, none ended), saying which orders were still open, and where."""
    last: dict[str, tuple[datetime, str] | None] = {}
    moved_at = time.monotonic()
    while True:
        orders = {o: load(stack, o) for o in order_ids}
        if all(o is not None and o.status.terminal for o in orders.values()):
            return {k: v for k, v in orders.items() if v is not None}
        now = {k: (v.updated_at, str(v.status)) if v else None for k, v in orders.items()}
        if now != last:
            last, moved_at = now, time.monotonic()
        elif time.monotonic() - moved_at > quiet:
            open_ = {
                k: (str(v.status), [f"{s.step}:{s.process_state}" for s in v.steps])
                if v
                else "not saved"
                for k, v in orders.items()
                if v is None or not v.status.terminal
            }
            raise AssertionError(
                f"{len(open_)} of {len(order_ids)} orders still open after {quiet:.0f} s in "
                f"which none moved: {dict(list(open_.items())[:20])}"
            )
        time.sleep(0.5)


def log_tail(stack: LocalStack) -> str:
    assert stack.workdir is not None
    return "\n".join(
        f"--- {p.name}\n" + "\n".join(p.read_text().splitlines()[-15:])
        for p in sorted(stack.workdir.glob("devhost-*.log"))
    )


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_two_instances_run_a_mixed_batch_to_the_expected_ends(stack: LocalStack) -> None:
    cases = {
        **{f"e2e-ok-{n}": "completed" for n in range(12)},
        "e2e-flaky": "completed",
        "e2e-declined": "error",
        "e2e-ful": "completed",
        "e2e-ful-ship": "compensated",
    }
    for order_id in cases:
        body: dict[str, object] = {"orderId": order_id}
        if order_id == "e2e-flaky":
            body["simulate"] = {"process": "transient:2"}
        if order_id == "e2e-declined":
            body["simulate"] = {"process": "permanent"}
        if order_id.startswith("e2e-ful"):
            body["workflow"] = "fulfilment"
        if order_id == "e2e-ful-ship":
            body["simulate"] = {"ship": "permanent"}
        stack.submit(body)
    orders = wait_terminal(stack, list(cases), 90)
    alerted = [o for o, status in cases.items() if status in ("error", "compensated")]
    alerts = drain_alerts_for(stack.context, alerted)  # they leave after the save
    verdict = verify(dict(orders), load_ledger(stack.ledger_path), alerts, expected=cases)
    assert verdict.ok, (verdict.problems(), log_tail(stack))
    assert effects_by_order(load_ledger(stack.ledger_path))["e2e-ful-ship"] == [
        "reserve-stock",
        "charge-payment",
        "refund-payment",
        "release-stock",
    ]
    # Only the declined order alerted; no message went to a poison or dead-letter queue.
    assert {a["orderId"] for a in alerts} == {"e2e-declined"}, alerts
    assert not [a for a in alerts if a.get("poisonQueue")], alerts


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize(
    "stack",
    [{"devhost_args": [["--only", AGENT_FUNCTIONS], ["--exclude", AGENT_FUNCTIONS]]}],
    indirect=True,
)
def test_agent_killed_mid_call_is_replaced_and_the_effect_applies_once(stack: LocalStack) -> None:
    """SIGKILL while the agent holds the request (a devhost lease, or a Service Bus lock:
    30 s either way): the supervisor retries at the deadline on a new request, and the
    effect applies once."""
    order_id = "e2e-agent-kill"
    # The service applies the effect, then takes 30 s to answer: the agent is mid-call.
    stack.submit(
        {
            "orderId": order_id,
            "simulate": {
                "process": {"fail": "hang", "times": 1, "seconds": 30, "applyFirst": True}
            },
        }
    )
    wait_for(
        lambda: effects_by_order(load_ledger(stack.ledger_path)).get(order_id),
        30,
        what="the remote call to start",
    )
    stack.kill(0)  # SIGKILL the agent instance in the middle of the call
    stack.restart(0)
    [order] = wait_terminal(stack, [order_id], 60).values()
    assert str(order.status) == "completed", log_tail(stack)
    step = order.steps[0]
    assert step.attempt == 2 and step.failure_count == 1
    assert [h["event"] for h in step.history].count("expired") == 1
    assert effects_by_order(load_ledger(stack.ledger_path))[order_id] == ["process"]


@pytest.mark.parametrize(
    "stack",
    [{"devhost_env": [{"ORDERS_FAILPOINTS": "after-claim"}, {}], "autostart": False}],
    indirect=True,
)
def test_scheduler_killed_right_after_a_claim_is_recovered_by_another(stack: LocalStack) -> None:
    order_id = "e2e-claim-kill"
    stack.hosts[0].start()  # the only instance, armed to die right after it claims
    stack.submit({"orderId": order_id})
    assert stack.hosts[0].process is not None
    stack.hosts[0].process.wait(timeout=60)  # it claimed, then SIGKILLed itself
    assert stack.hosts[0].process.returncode == -9
    claimed = load(stack, order_id)
    assert claimed is not None and str(claimed.steps[0].process_state) == "Processing"
    assert not load_ledger(stack.ledger_path)  # the request was never sent
    stack.hosts[1].start()  # a healthy instance: its supervisor finds the expired claim
    [order] = wait_terminal(stack, [order_id], 60).values()
    assert str(order.status) == "completed", log_tail(stack)
    step = order.steps[0]
    assert step.attempt == 2
    first, second = [h for h in step.history if h["event"] == "claimed"]
    assert first["instance"].startswith("devhost-0") and second["instance"].startswith("devhost-1")
    assert effects_by_order(load_ledger(stack.ledger_path))[order_id] == ["process"]


@pytest.mark.parametrize(
    "stack",
    [
        {
            "devhost_env": [{"ORDERS_FAILPOINTS": "after-reply-save"}, {}],
            "devhost_args": [["--only", "handle_agent_reply"], ["--exclude", "handle_agent_reply"]],
            "autostart": False,
        }
    ],
    indirect=True,
)
def test_killed_between_a_reply_and_the_next_step_the_workflow_resumes(stack: LocalStack) -> None:
    order_id = "e2e-reply-kill"
    stack.hosts[1].start()
    stack.hosts[0].start()  # the reply handler, armed to die after its first save
    stack.submit({"orderId": order_id, "workflow": "fulfilment"})
    assert stack.hosts[0].process is not None
    stack.hosts[0].process.wait(timeout=60)
    stack.devhost_env = None
    stack.hosts[0].env.pop("ORDERS_FAILPOINTS")
    stack.hosts[0].start()
    [order] = wait_terminal(stack, [order_id], 90).values()
    assert str(order.status) == "completed", log_tail(stack)
    assert effects_by_order(load_ledger(stack.ledger_path))[order_id] == [
        "reserve-stock",
        "charge-payment",
        "ship",
    ]


def test_operator_api_finds_explains_and_resubmits_over_http(
    stack: LocalStack, monkeypatch: pytest.MonkeyPatch
) -> None:
    order_id = "e2e-http"
    stack.submit({"orderId": order_id, "simulate": {"process": "permanent"}})
    wait_terminal(stack, [order_id], 60)
    base = stack.http_url
    assert base is not None
    listed = httpx.get(f"{base}/api/orders", params={"status": "error"}, timeout=10).json()
    assert order_id in [o["orderId"] for o in listed["orders"]]
    shown = httpx.get(f"{base}/api/orders/{order_id}", timeout=10)
    assert shown.status_code == 200
    step = shown.json()["steps"][0]
    assert step["ProcessState"] == "Error" and "422" in step["lastError"]
    assert step["attempts"][0]["outcome"] == "refused"
    missing = httpx.get(f"{base}/api/orders/nope-404", timeout=10)
    assert missing.status_code == 404 and "nope-404" in missing.json()["error"]
    bad = httpx.get(f"{base}/api/orders", params={"status": "weird"}, timeout=10)
    assert bad.status_code == 400 and "status" in bad.json()["error"]
    again = httpx.post(f"{base}/api/orders/{order_id}/resubmit", timeout=10)
    assert again.status_code == 200 and again.json()["status"] == "processing"
    wait_for(
        lambda: (o := load(stack, order_id)) is not None and o.steps[0].attempt == 2,
        30,
        what="the resubmitted attempt",
    )
    wait_terminal(stack, [order_id], 60)
    # Still declined: back in error, with both attempts on record. The operator gives up.
    cancelled = httpx.post(
        f"{base}/api/orders/{order_id}/cancel", json={"reason": "customer called"}, timeout=10
    )
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    again = httpx.post(f"{base}/api/orders/{order_id}/cancel", timeout=10)
    assert again.status_code == 409 and again.json()["reason"] == "finished"
    done = load(stack, order_id)
    assert done is not None
    assert [h["event"] for h in done.steps[0].history].count("resubmitted") == 1
    assert [
        a["outcome"]
        for a in httpx.get(f"{base}/api/orders/{order_id}", timeout=10).json()["steps"][0][
            "attempts"
        ]
    ] == ["refused", "refused"]
    practise_the_readmes_recipe(stack, monkeypatch)


def practise_the_readmes_recipe(stack: LocalStack, monkeypatch: pytest.MonkeyPatch) -> None:
    """The README's "Practise it locally": its commands, word for word, as a person runs
    them (each one once the order has got where the comment says): a refusal the
    service fixes, then one fixed in the order's data with a patch."""
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    after = readme.split("**Practise it locally.**", 1)[1]
    block = re.search(r"```sh\n(.*?)```", after, re.DOTALL)
    assert block is not None
    commands = block[1].strip().splitlines()
    monkeypatch.setenv("AzureWebJobsStorage", stack.connection_string)
    shown = []
    for line in commands:
        argv = shlex.split(line, comments=True)
        assert argv[:3] == [".venv/bin/python", "-m", "admin"], argv
        order_id = json.loads(argv[4])["orderId"] if argv[3] == "submit" else argv[4]
        if argv[3] == "show":
            wait_terminal(stack, [order_id], 60)
        monkeypatch.setattr(sys, "argv", ["admin", *argv[3:]])
        printed, code = io.StringIO(), 0
        with contextlib.redirect_stdout(printed):
            try:
                runpy.run_module("admin", run_name="__main__", alter_sys=True)
            except SystemExit as exit:
                code = exit.code if isinstance(exit.code, int) else int(exit.code is not None)
        assert code == 0, (line, printed.getvalue())
        if argv[3] == "show":
            shown.append(json.loads(printed.getvalue()))
    failed, fixed, wrong, patched = shown
    assert failed["status"] == "error", failed
    assert "it was not applied" in json.dumps(failed)
    assert fixed["status"] == "completed", fixed
    assert "the service fixed its data" in json.dumps(fixed["steps"][0]["history"])
    assert wrong["status"] == "error", wrong
    assert patched["status"] == "completed", patched
    [change] = [h for h in patched["history"] if h["event"] == "patched"]
    assert change["reason"] == "wrong data"
    assert change["changed"] == [{"field": "simulate", "old": {"process": "permanent"}}]
