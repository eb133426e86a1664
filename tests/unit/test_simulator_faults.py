"""The simulator without a server: directive grammar, call validation, fault counting, ledger."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from simulator.callbacks import callback_url
from simulator.engine import Simulator, confirmation, handed_out
from simulator.faults import (
    DirectiveError,
    RandomFaults,
    RequestError,
    directive_for,
    parse_directive,
    parse_latency,
    record_name,
    validate_call,
)
from simulator.ledger import (
    Ledger,
    double_effects,
    effects_by_order,
    load_ledger,
    standing_effects,
)
from simulator.outage import Phase


def body(order_id: str = "o-1", **fields: object) -> bytes:
    return json.dumps({"orderId": order_id, **fields}).encode()


# --- directive grammar -------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "fail", "times", "status", "apply_first"),
    [
        ("transient", "transient", 1, 503, False),
        ("transient:3", "transient", 3, 503, False),
        ("permanent", "permanent", 1, 422, False),
        ("hang", "hang", 1, 0, True),
        ("hang:2", "hang", 2, 0, True),
        ("drop:4", "drop", 4, 0, False),
    ],
)
def test_shorthands(raw: str, fail: str, times: int, status: int, apply_first: bool) -> None:
    directive = parse_directive("process", raw)
    assert (directive.fail, directive.times, directive.status) == (fail, times, status)
    assert directive.apply_first is apply_first


def test_hang_defaults_outlast_any_deadline() -> None:
    assert parse_directive("process", "hang").seconds == 3600.0


def test_object_directives() -> None:
    transient = parse_directive(
        "pay", {"fail": "transient", "times": 2, "status": 429, "retryAfter": 3, "latencyMs": 7}
    )
    assert (transient.status, transient.retry_after, transient.latency_ms) == (429, 3, 7)
    permanent = parse_directive("pay", {"fail": "permanent", "status": 404, "error": "no card"})
    assert (permanent.status, permanent.error) == (404, "no card")
    hang = parse_directive("pay", {"fail": "hang", "seconds": 0.25, "applyFirst": False})
    assert (hang.seconds, hang.apply_first) == (0.25, False)
    drop = parse_directive("pay", {"fail": "drop", "applyFirst": True})
    assert drop.apply_first is True
    latency_only = parse_directive("pay", {"latencyMs": 20})
    assert (latency_only.fail, latency_only.latency_ms) == (None, 20)


def test_permanent_default_error_names_the_step() -> None:
    assert "charge-payment" in parse_directive("charge-payment", "permanent").error


@pytest.mark.parametrize(
    "raw",
    [
        "explode",
        "transient:x",
        "transient:-1",
        "permanent:x",
        42,
        None,
        ["transient"],
        {"fail": "explode"},
        {"fail": "transient", "status": 404},
        {"fail": "transient", "status": 200},
        {"fail": "permanent", "status": 503},
        {"fail": "permanent", "status": 429},
        {"fail": "permanent", "error": 5},
        {"fail": "hang", "status": 503},
        {"fail": "hang", "seconds": -1},
        {"fail": "hang", "seconds": True},
        {"fail": "drop", "applyFirst": "yes"},
        {"fail": "transient", "times": -1},
        {"fail": "transient", "times": True},
        {"fail": "transient", "retryAfter": 1.5},
        {"latencyMs": -5},
        {"times": 2},
    ],
)
def test_invalid_directives_are_refused(raw: object) -> None:
    with pytest.raises(DirectiveError):
        parse_directive("process", raw)


def test_directive_for_reads_only_this_step() -> None:
    order = {"orderId": "o", "simulate": {"charge-payment": "permanent"}}
    assert directive_for("reserve-stock", order) is None
    assert directive_for("charge-payment", order) is not None
    assert directive_for("process", {"orderId": "o"}) is None
    with pytest.raises(DirectiveError):
        directive_for("process", {"orderId": "o", "simulate": "transient"})


def test_fault_counting_per_call_number() -> None:
    transient = parse_directive("process", "transient:2")
    assert [transient.fault_for(n) is not None for n in (1, 2, 3, 4)] == [True, True, False, False]
    permanent = parse_directive("process", "permanent")
    assert all(permanent.fault_for(n) is not None for n in (1, 2, 50))
    # a refusal whose cause the service fixes: the first N calls, then it applies
    for fixed in ("permanent:2", {"fail": "permanent", "times": 2, "status": 404}):
        refusals = [parse_directive("process", fixed).fault_for(n) for n in (1, 2, 3)]
        assert [f.kind if f else None for f in refusals] == ["permanent", "permanent", None]
    assert parse_directive("process", {"latencyMs": 5}).fault_for(1) is None


# --- call validation -----------------------------------------------------------


def test_valid_call() -> None:
    order_id, order = validate_call("process", "o-1:process", body(amount=3))
    assert order_id == "o-1"
    assert order["amount"] == 3


def test_the_order_id_comes_from_the_key_so_a_body_may_be_a_steps_input() -> None:
    """docs/contracts.md §3.13: the body is what the step's input built (no orderId needed);
    a compensation run again as a new effect has its key's round (§3.11)."""
    assert validate_call("restock", "o-1:restock", b'{"rma": "R-1"}') == ("o-1", {"rma": "R-1"})
    assert validate_call("release-stock", "o-1:release-stock:2", b"{}")[0] == "o-1"


def test_an_item_of_a_for_each_is_called_on_its_path_under_the_for_eachs_name() -> None:
    """docs/contracts.md §3.16: ``<orderId>:<name>:<i>`` (and a compensation of it run
    again, ``...:<round>``) on the path of the item's step, a name other than the key's."""
    assert validate_call("pick-line", "o-1:pick:0", b"{}")[0] == "o-1"
    assert validate_call("pick-line", "o-1:pick:99", b"{}")[0] == "o-1"
    assert validate_call("unpick-line", "o-1:unpick:7:2", b"{}")[0] == "o-1"
    for key in ("o-1:pick:100", "o-1:pick:-1", "o-1:pick:x", "o-1:pick:3:1", "o-1:Pick:3"):
        with pytest.raises(RequestError, match="an item's"):
            validate_call("pick-line", key, b"{}")


@pytest.mark.parametrize(
    ("step", "key", "payload", "words"),
    [
        ("process", None, body(), "missing"),
        ("process", "", body(), "missing"),
        ("process", "o-1", body(), "does not match"),
        ("process", "o-1:other", body(), "does not match"),
        ("process", "o-2:process", body(), "does not match"),
        ("process", "o-1:process", b"not json", "not valid"),
        ("process", "o-1:process", b"\xff\xfe", "not valid"),
        ("process", "o-1:process", b"[1, 2]", "JSON object"),
        ("process", "o-1:process", b'{"orderId": 7}', "orderId"),
        ("process", "o-1:process", b'{"orderId": "o-2"}', "orderId"),
        ("process", "o-1:process:1:1", body(), "does not match"),  # a round is 2 or more
        ("process", "o-1:process:01:2", body(), "does not match"),  # an item's index is 0-99
        ("process", "o-1:other:100", body(), "does not match"),
        ("process", "o-1:process:x", body(), "does not match"),
        ("process", ":process", body(), "does not match"),
        ("process", "o-1:process", body(callback="http://x"), "callback"),
        ("process", "o-1:process", body(callback={"url": "ftp://x/y"}), "callback"),
        ("process", "o-1:process", body(callback={"url": "/api/x"}), "callback"),
        ("process", "o-1:process", body(callback={"url": "http://x", "ms": 1}), "callback"),
        ("Process", "o-1:Process", body(), "step name"),
    ],
)
def test_invalid_calls(step: str, key: str | None, payload: bytes, words: str) -> None:
    with pytest.raises(RequestError, match=words):
        _, order = validate_call(step, key, payload)
        callback_url(order)


def test_callback_directives() -> None:
    lost = parse_directive("ship", {"callback": "lost:2", "callbackMs": 50})
    assert (lost.fail, lost.callback, lost.callback_ms) == (None, "lost", 50)
    assert [lost.callback_lost(n) for n in (1, 2, 3)] == [True, True, False]
    refuse = parse_directive("ship", {"callback": "refuse:no driver today"})
    assert (refuse.callback, refuse.callback_reason) == ("refuse", "no driver today")
    assert not refuse.callback_lost(1)
    both = parse_directive("ship", {"fail": "transient", "times": 1, "callback": "lost"})
    assert (both.fail, both.callback, both.callback_times) == ("transient", "lost", 1)
    for bad in ({"callback": "late"}, {"callback": 3}, {"callback": "lost:x"},
                {"callbackMs": -1}, {"callbackMs": 600_001}):  # fmt: skip
        with pytest.raises(DirectiveError):
            parse_directive("ship", bad)


# --- random faults -------------------------------------------------------------


def test_random_faults_are_validated() -> None:
    with pytest.raises(ValueError):
        RandomFaults(transient_rate=0.6, drop_rate=0.6)
    with pytest.raises(ValueError):
        RandomFaults(hang_rate=-0.1)
    with pytest.raises(ValueError):
        RandomFaults(latency_ms=(10, 5))
    assert not RandomFaults().active
    assert RandomFaults(latency_ms=(0, 3)).active


def test_random_draws_are_deterministic_and_bounded_per_key() -> None:
    faults = RandomFaults(transient_rate=0.3, hang_rate=0.3, drop_rate=0.3, seed=7)
    draws = [faults.draw(f"o{i}:process", 1, 0) for i in range(200)]
    assert draws == [faults.draw(f"o{i}:process", 1, 0) for i in range(200)]
    kinds = {fault.kind for fault, _ in draws if fault is not None}
    assert kinds == {"transient", "hang", "drop"}
    assert all(fault is None or fault.random for fault, _ in draws)
    always = RandomFaults(transient_rate=1.0, max_per_key=2)
    assert always.draw("o:process", 3, faults_so_far=2)[0] is None


def test_random_latency_stays_in_range() -> None:
    faults = RandomFaults(latency_ms=(5, 9))
    latencies = {faults.draw(f"o{i}:s", 1, 0)[1] for i in range(300)}
    assert latencies == {5, 6, 7, 8, 9}


def test_parse_latency() -> None:
    assert parse_latency("0-20") == (0, 20)
    assert parse_latency("5") == (5, 5)
    for bad in ("a", "5-1", "-3", "1-2-3"):
        with pytest.raises(ValueError):
            parse_latency(bad)


# --- the engine: counting, dedup, compensation (no HTTP) ------------------------


def call(sim: Simulator, order_id: str, step: str, **fields: object) -> tuple[int, dict[str, Any]]:
    outcome = sim.handle(step, f"{order_id}:{step}", body(order_id, **fields))
    return outcome.status, json.loads(outcome.body) if outcome.body else {}


def test_transient_then_success_then_duplicate() -> None:
    sim = Simulator()
    simulate = {"process": "transient:2"}
    statuses = [call(sim, "o", "process", simulate=simulate)[0] for _ in range(4)]
    assert statuses == [503, 503, 200, 200]
    assert len(sim.effects()) == 1
    stats = sim.stats()
    assert stats["byFault"] == {"transient": 2}
    assert stats["duplicatesSuppressed"] == 1
    assert stats["byStatus"] == {"503": 2, "200": 2}


def test_success_body() -> None:
    status, answer = call(Simulator(), "o-9", "reserve-stock")
    assert status == 200
    assert answer["confirmation"] == confirmation("reserve-stock", "o-9:reserve-stock")
    assert answer["confirmation"].startswith("reserve-stock-")
    assert len(answer["confirmation"].rsplit("-", 1)[1]) == 8
    assert answer["appliedAt"].endswith("Z")


def test_permanent_never_applies() -> None:
    sim = Simulator()
    for _ in range(3):
        status, answer = call(sim, "o", "process", simulate={"process": "permanent"})
        assert status == 422
        assert "process" in answer["error"]
    assert sim.effects() == []


def test_drop_apply_first_applies_then_loses_the_answer() -> None:
    sim = Simulator()
    simulate = {"process": {"fail": "drop", "applyFirst": True}}
    assert sim.handle("process", "o:process", body("o", simulate=simulate)).dropped
    assert len(sim.effects()) == 1
    status, answer = call(sim, "o", "process", simulate=simulate)
    assert status == 200
    assert answer == sim.effects()[0]["response"]
    assert sim.stats()["noResponse"] == 1


def test_random_faults_never_exceed_the_bound() -> None:
    sim = Simulator(random_faults=RandomFaults(transient_rate=1.0, max_per_key=2))
    assert [call(sim, "o", "process")[0] for _ in range(3)] == [503, 503, 200]
    # An order's directive wins over random faults for that step.
    assert call(sim, "p", "process", simulate={"process": {"latencyMs": 0}})[0] == 200


def test_invalid_directive_is_a_400() -> None:
    status, answer = call(Simulator(), "o", "process", simulate={"process": "explode"})
    assert status == 400
    assert "explode" in answer["error"]


def test_compensation_undoes_only_what_was_applied() -> None:
    sim = Simulator()
    reservation = call(sim, "a", "reserve-stock")[1]["reservation"]
    call(sim, "a", "release-stock", reservation=reservation)
    call(sim, "b", "release-stock")
    compensations = [e for e in sim.effects() if e["kind"] == "compensation"]
    assert [(e["orderId"], e["compensates"], e["undid"]) for e in compensations] == [
        ("a", "reserve-stock", True),
        ("b", "reserve-stock", False),
    ]
    assert sim.stats()["compensations"] == 2


def test_steps_hand_out_ids_and_their_compensations_must_name_them() -> None:
    sim = Simulator()
    status, reserved = call(sim, "a", "reserve-stock")
    assert status == 200 and reserved["reservation"] == handed_out("reservation", "a:reserve-stock")
    assert call(sim, "a", "reserve-stock")[1] == reserved  # deterministic: the stored answer
    assert call(sim, "a", "charge-payment")[1]["charge"].startswith("charge-")
    assert "reservation" not in call(sim, "a", "process")[1]  # no id for a step not in the map
    # without the id, or with another: refused, nothing undone, every time
    for named in ({}, {"reservation": None}, {"reservation": "reservation-00000000"}):
        status, answer = call(sim, "a", "release-stock", **named)
        assert status == 422 and "reservation" in answer["error"], answer
        assert "Nothing was undone" in answer["error"]
    assert [e["step"] for e in sim.effects()] == ["reserve-stock", "charge-payment", "process"]
    assert sim.calls()[-1]["fault"] == "refused"
    status, released = call(sim, "a", "release-stock", reservation=reserved["reservation"])
    assert status == 200 and released["reservation"] == reserved["reservation"]
    [entry] = [e for e in sim.effects() if e["step"] == "release-stock"]
    assert (entry["undid"], entry["ids"]) == (True, {"reservation": reserved["reservation"]})
    assert entry["request"]["reservation"] == reserved["reservation"]
    # a step that never applied handed out nothing: its undo names none and undoes nothing
    assert call(sim, "b", "refund-payment", charge=None)[0] == 200
    status, answer = call(sim, "c", "refund-payment", charge="charge-12345678")
    assert status == 422 and "handed out none" in answer["error"]


def test_ids_can_be_configured_or_turned_off() -> None:
    sim = Simulator(ids={}, compensations={"unbook": "book"})
    call(sim, "a", "book")
    assert call(sim, "a", "unbook")[0] == 200  # no ids: undone by order
    assert "reservation" not in call(sim, "a", "reserve-stock")[1]
    sim = Simulator(ids={"book": "booking"}, compensations={"unbook": "book"})
    booking = call(sim, "a", "book")[1]["booking"]
    assert call(sim, "a", "unbook")[0] == 422
    assert call(sim, "a", "unbook", booking=booking)[0] == 200


def test_an_items_key_names_its_record_and_its_round() -> None:
    """docs/contracts.md §3.16: item ``i`` of ForEach ``name`` is keyed
    ``<orderId>:<name>:<i>`` (``...:<round>`` run again), whatever its step's path."""
    assert validate_call("receive", "o-1:receive-line:0", b"{}")[0] == "o-1"
    assert validate_call("send-back", "o-1:send-back:1", b"{}")[0] == "o-1"
    assert validate_call("send-back", "o-1:send-back:7:2", b"{}")[0] == "o-1"
    assert record_name("receive", "o-1:receive-line:0") == "receive-line[0]"
    assert record_name("send-back", "o-1:send-back:1") == "send-back[1]"
    assert record_name("send-back", "o-1:send-back:7:2") == "send-back[7]"
    assert record_name("send-back", "o-1:send-back") == "send-back"
    # <orderId>:<step>:<n>, n >= 2: a round, or item n (the engine knows which)
    assert record_name("send-back", "o-1:send-back:3", as_round=True) == "send-back"
    assert record_name("send-back", "o-1:send-back:3") == "send-back[3]"
    assert record_name("send-back", "o-1:send-back:100") == "send-back"  # no item 100


def item(sim: Simulator, order_id: str, name: str, i: int, **fields: object) -> Any:
    outcome = sim.handle(name, f"{order_id}:{name}:{i}", body(order_id, **fields))
    return outcome.status, json.loads(outcome.body)


def test_items_apply_once_each_hand_out_their_own_id_and_are_undone_by_it() -> None:
    sim = Simulator(ids={"pick": "pickId"}, compensations={"unpick": "pick"})
    picked = [item(sim, "o", "pick", i)[1]["pickId"] for i in range(3)]
    assert len(set(picked)) == 3
    assert item(sim, "o", "pick", 2)[1]["pickId"] == picked[2]  # the stored answer
    # latest first, each naming its own item's id; another item's is refused
    assert item(sim, "o", "unpick", 2, pickId=picked[1])[0] == 422
    for i in (2, 1, 0):
        assert item(sim, "o", "unpick", i, pickId=picked[i])[0] == 200
    ledger = [(e["step"], e["compensates"], e["undid"]) for e in sim.effects()]
    assert ledger == [
        ("pick[0]", None, None),
        ("pick[1]", None, None),
        ("pick[2]", None, None),
        ("unpick[2]", "pick[2]", True),
        ("unpick[1]", "pick[1]", True),
        ("unpick[0]", "pick[0]", True),
    ]
    assert double_effects(sim.effects()) == []
    assert standing_effects(sim.effects()) == {}


def test_a_key_that_could_be_a_round_or_an_item_is_told_apart_by_the_calls_before() -> None:
    """``<orderId>:<step>:<n>`` (n >= 2): a round of a step the order called itself (its
    first key answered by an outage too), or of a compensation whose target's item ``n``
    was never called; otherwise an item."""
    sim = Simulator(ids={}, compensations={"unpick": "pick"})
    sim.outage.set_error(Phase.error(60, 503))
    assert sim.handle("pick", "a:pick", body("a")).status == 503  # answered by the outage
    sim.outage.clear()
    sim.handle("pick", "a:pick:2", body("a"))  # a forward step's new key, after a fix
    sim.handle("unpick", "b:unpick:2", body("b"))  # a plain undo run again
    item(sim, "c", "pick", 2)  # an item: the order never called pick itself
    item(sim, "c", "unpick", 2)  # and its undo
    named = [(e["orderId"], e["step"], e["compensates"]) for e in sim.effects()]
    assert named == [
        ("a", "pick", None),
        ("b", "unpick", "pick"),
        ("c", "pick[2]", None),
        ("c", "unpick[2]", "pick[2]"),
    ]


def test_a_directive_for_one_item_applies_to_it_alone() -> None:
    sim = Simulator()
    simulate = {"pick[1]": "permanent", "pick": "transient:1"}
    statuses = [item(sim, "o", "pick", i, simulate=simulate)[0] for i in (0, 1, 0)]
    assert statuses == [503, 422, 200]
    assert [e["step"] for e in sim.effects()] == ["pick[0]"]


def test_a_call_that_asks_for_a_callback_is_accepted_202() -> None:
    """The callback itself (over HTTP) is tested in tests/integration/test_simulator_http.py;
    here a lost one: never sent, settled in the ledger."""
    sim = Simulator()
    asked = {"url": "http://127.0.0.1:9/api/orders/o/events/left"}
    simulate = {"ship": {"callback": "lost", "callbackMs": 0}}
    status, answer = call(sim, "o", "ship", callback=asked, simulate=simulate)
    assert status == 202 and answer["parcel"].startswith("parcel-")
    deadline = time.monotonic() + 5
    while sim.callbacks.pending and time.monotonic() < deadline:
        time.sleep(0.01)
    [effect, lost] = sim.effects()
    assert (effect["kind"], lost["kind"]) == ("effect", "callback")
    assert lost["callback"] == {
        "url": asked["url"],
        "body": {"result": answer},
        "answer": None,
        "tries": 0,
        "fault": "lost",
    }
    assert (sim.stats()["effects"], sim.stats()["callbacks"]) == (1, 1)
    assert effects_by_order(sim.effects()) == {"o": ["ship"]}


def test_a_refused_callback_applies_nothing() -> None:
    sim = Simulator()
    asked = {"url": "http://127.0.0.1:9/api/orders/o/events/left"}
    simulate = {"ship": {"callback": "refuse:no driver", "callbackMs": 60_000}}
    status, answer = call(sim, "o", "ship", callback=asked, simulate=simulate)
    assert status == 202 and answer == {"orderId": "o", "step": "ship", "accepted": True}
    assert sim.effects() == [] and sim.calls()[-1]["applied"] is False
    sim.stop()


def test_concurrent_calls_with_one_key_apply_once() -> None:
    sim = Simulator()
    barrier = threading.Barrier(20)
    answers: list[bytes] = []

    def worker() -> None:
        barrier.wait()
        answers.append(sim.handle("process", "o:process", body("o")).body)

    threads = [threading.Thread(target=worker) for _ in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(5)
    assert len(set(answers)) == 1 and len(answers) == 20
    assert len(sim.effects()) == 1
    assert sim.stats()["duplicatesSuppressed"] == 19


def test_stop_wakes_a_hung_call() -> None:
    sim = Simulator()
    outcomes = []
    worker = threading.Thread(
        target=lambda: outcomes.append(
            sim.handle("process", "o:process", body("o", simulate={"process": "hang"}))
        )
    )
    worker.start()
    deadline = time.monotonic() + 5
    while sim.stats()["byFault"].get("hang") != 1 and time.monotonic() < deadline:
        time.sleep(0.005)
    sim.stop()
    worker.join(30)  # the hang is an hour's
    assert not worker.is_alive(), "the stop did not wake the hung call"
    assert outcomes[0].dropped
    assert len(sim.effects()) == 1  # applyFirst: the effect happened, the answer was lost


def test_reset_forgets_everything() -> None:
    sim = Simulator()
    call(sim, "o", "process")
    sim.reset()
    assert sim.effects() == []
    assert sim.stats()["calls"] == 0
    assert call(sim, "o", "process")[0] == 200
    assert sim.effects()[0]["seq"] == 1


# --- ledger helpers -------------------------------------------------------------


def effect(seq: int, order_id: str, step: str, **extra: object) -> dict[str, object]:
    return {"seq": seq, "orderId": order_id, "step": step, "kind": "effect", **extra}


def test_double_effects_and_effects_by_order() -> None:
    effects = [
        effect(1, "a", "reserve-stock"),
        effect(2, "b", "process"),
        effect(3, "a", "charge-payment"),
        effect(4, "a", "reserve-stock"),
    ]
    assert double_effects(effects) == [("a", "reserve-stock")]
    assert effects_by_order(effects) == {
        "a": ["reserve-stock", "charge-payment", "reserve-stock"],
        "b": ["process"],
    }


def test_standing_effects() -> None:
    effects = [
        effect(1, "a", "reserve-stock"),
        effect(2, "a", "charge-payment"),
        effect(3, "b", "reserve-stock"),
        {
            "seq": 4,
            "orderId": "a",
            "step": "refund-payment",
            "kind": "compensation",
            "compensates": "charge-payment",
            "undid": True,
        },
    ]
    assert standing_effects(effects) == {"a": ["reserve-stock"], "b": ["reserve-stock"]}


def test_ledger_file_round_trip_and_torn_last_line(tmp_path: Path) -> None:
    path = tmp_path / "ledger.jsonl"
    ledger = Ledger(path)
    response = {"orderId": "o", "step": "process"}
    ledger.append(at="t", order_id="o", step="process", key="o:process", response=response,
                  compensates=None)  # fmt: skip
    assert load_ledger(path) == ledger.entries()
    ledger.close()
    with path.open("a", encoding="utf-8") as file:
        file.write('{"seq": 2, "orderId"')
    assert len(load_ledger(path)) == 1
    path.write_text('garbage\n{"seq": 1}\n', encoding="utf-8")
    with pytest.raises(ValueError, match=":1:"):
        load_ledger(path)
