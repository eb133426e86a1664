"""``bench.trace``'s parts that run without a stack: the probe (what it wraps, what it
records) and the split of an order's time into segments. No speed is asserted."""

from __future__ import annotations

import asyncio
import base64
import importlib
import importlib.util
import json
from pathlib import Path
from types import ModuleType, SimpleNamespace

import pytest

from bench.trace import HOOK, SEGMENTS, read_calls, split, summarise


def probe() -> ModuleType:
    """The probe module as a devhost process loads it (it is no package: by path)."""
    spec = importlib.util.spec_from_file_location("bench_probe", HOOK / "sitecustomize.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_traced_call_still_exists_in_the_app() -> None:
    # The probe wraps by name: a rename must fail here, not leave a benchmark blind.
    targets = probe().TARGETS
    for module_name, methods in targets.items():
        module = importlib.import_module(module_name)
        for cls, method, _event in methods:
            assert callable(getattr(getattr(module, cls), method)), (module_name, cls, method)
    events = {event for methods in targets.values() for _, _, event in methods}
    assert events >= {"receive", "submit", "create", "send_request", "agent"}


def test_the_probe_records_a_call_with_its_orders_and_returns_what_the_call_returned(
    tmp_path: Path,
) -> None:
    module = probe()
    record = module.Recorder(str(tmp_path))

    def submit(self: object, raw: bytes) -> str:
        return "accepted"

    async def handle(self: object, request: object) -> str:
        return "replied"

    def receive(self: object, count: int) -> list[SimpleNamespace]:
        plain = SimpleNamespace(content=json.dumps({"orderId": "o-1"}))
        encoded = base64.b64encode(json.dumps({"orderId": "o-2"}).encode()).decode()
        unreadable = SimpleNamespace(content="a poison message, no JSON")
        return [plain, unreadable, SimpleNamespace(content=encoded)]

    assert module.traced(submit, "submit", record)(None, b'{"orderId": "o-9"}') == "accepted"
    wrapped = module.traced(handle, "agent", record)
    assert asyncio.run(wrapped(None, SimpleNamespace(order_id="o-3"))) == "replied"
    assert len(module.traced(receive, "receive", record)(None, 16)) == 3

    lines = [
        json.loads(line) for path in tmp_path.iterdir() for line in path.read_text().splitlines()
    ]
    assert [(line["event"], line["orders"]) for line in lines] == [
        ("submit", ["o-9"]),
        ("agent", ["o-3"]),
        ("receive", ["o-1", "o-2"]),  # the unreadable one hides neither
    ]
    assert all(line["end"] >= line["start"] for line in lines)


def test_a_probe_that_cannot_read_a_call_records_why_and_never_breaks_it(tmp_path: Path) -> None:
    module = probe()
    record = module.Recorder(str(tmp_path))

    def failing(self: object, raw: bytes) -> None:
        raise ValueError("the app's own error")

    with pytest.raises(ValueError, match="the app's own error"):
        module.traced(failing, "submit", record)(None, b"not json")
    (line,) = [json.loads(x) for p in tmp_path.iterdir() for x in p.read_text().splitlines()]
    assert line["orders"] == [] and "JSONDecodeError" in line["error"]


def write(directory: Path, name: str, records: list[dict[str, object]]) -> None:
    (directory / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def test_an_order_is_split_at_the_first_of_each_call_across_processes(tmp_path: Path) -> None:
    # Two devhosts: the order's message was received by one, an empty-handed earlier
    # receive and a later redelivery must not move the points.
    write(
        tmp_path,
        "101",
        [
            {"event": "receive", "start": 9.0, "end": 9.5, "orders": []},
            {"event": "receive", "start": 10.04, "end": 10.05, "orders": ["o", "p"]},
            {"event": "submit", "start": 10.06, "end": 10.2, "orders": ["o"]},
            {"event": "create", "start": 10.07, "end": 10.09, "orders": ["o"]},
            {"event": "send_request", "start": 10.092, "end": 10.095, "orders": ["o"]},
        ],
    )
    write(
        tmp_path,
        "102",
        [
            {"event": "agent", "start": 10.1, "end": 10.2, "orders": ["o"]},
            {"event": "receive", "start": 11.0, "end": 11.01, "orders": ["o"]},
        ],
    )
    calls = read_calls(str(tmp_path))
    segments = split("o", 10.0, calls, remote_call=10.11, succeeded=10.12, done=10.12)
    assert segments is not None and list(segments) == list(SEGMENTS)
    expected = [0.05, 0.01, 0.01, 0.02, 0.005, 0.005, 0.01, 0.01, 0.0]
    assert [round(segments[name], 3) for name in SEGMENTS] == expected
    assert sum(segments.values()) == pytest.approx(0.12)
    assert split("p", 10.0, calls, 10.11, 10.12, 10.12) is None  # p's calls are missing


def test_the_summary_keeps_the_segments_in_their_order() -> None:
    one = dict.fromkeys(SEGMENTS, 0.010)
    two = {**one, "create": 0.030}
    summary = summarise([one, two])
    assert list(summary) == list(SEGMENTS)
    assert summary["create"]["max"] == 30 and summary["create"]["mean"] == 20
