"""``bench.pipeline``'s options: the agent queues' transport reaches the stack it drains on
(no stack is started; the benchmark asserts no speed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bench import pipeline
from config.settings import OPCOUNT_DIR


def fake_run(calls: list[tuple[Any, ...]]) -> Any:
    def run(*args: Any) -> dict[str, Any]:
        calls.append(args)
        return {"unfinished": 0}

    return run


def test_the_transport_is_storage_queues_unless_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[Any, ...]] = []
    monkeypatch.setattr(pipeline, "run", fake_run(calls))
    assert pipeline.main([]) == 0
    assert calls[-1] == (400, 3, 150, 2, "order", 600, "storage")


def test_service_bus_is_passed_on_to_the_run(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[Any, ...]] = []
    monkeypatch.setattr(pipeline, "run", fake_run(calls))
    assert pipeline.main(["--transport", "servicebus", "--runs", "1"]) == 0
    assert calls[-1][1] == 1
    assert calls[-1][-1] == "servicebus"


def test_an_unknown_transport_is_refused_with_the_choices(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        pipeline.main(["--transport", "rabbit"])
    assert "choose from 'storage', 'servicebus'" in capsys.readouterr().err


@pytest.mark.parametrize("transport", ["storage", "servicebus"])
def test_the_stack_puts_the_agent_queues_on_the_transport(transport: str, tmp_path: Path) -> None:
    stack = pipeline.new_stack(2, transport, tmp_path)  # built, not started
    assert stack.transport == transport
    assert stack.devhosts == 2
    assert stack.settings[OPCOUNT_DIR] == str(tmp_path)
