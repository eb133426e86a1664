"""``make start`` writes the settings to reach its stack to a file a shell sources
(``run/stack.env``): one line to paste, whatever the terminal's width, and the settings it
runs with that differ from the defaults."""

from __future__ import annotations

import subprocess
from pathlib import Path
from types import SimpleNamespace

from demo.__main__ import stack_env

CONNECTION = (
    "DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey=Eby8vdM02xNO"
    "cqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==;"
    "QueueEndpoint=http://127.0.0.1:41234/devstoreaccount1;"
    "TableEndpoint=http://127.0.0.1:41235/devstoreaccount1;"
)
SETTINGS = {"STEP_TIMEOUT_SECONDS": "5", "MAX_FAILURE_COUNT": "3"}


def sourced(text: str, tmp_path: Path, *names: str) -> list[str]:
    env = tmp_path / "stack.env"
    env.write_text(text, encoding="utf-8")
    echo = "; ".join(f'printf "%s\\n" "${name}"' for name in names)
    done = subprocess.run(
        ["bash", "-c", f"source {env}; {echo}"],
        env={"PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.splitlines()


def test_a_shell_that_sources_it_has_exactly_the_stacks_settings(tmp_path: Path) -> None:
    stack = SimpleNamespace(
        connection_string=CONNECTION,
        simulator_url="http://127.0.0.1:41236",
        service_bus_connection=None,
    )
    text = stack_env(stack, SETTINGS)  # type: ignore[arg-type]
    names = ("AzureWebJobsStorage", "REMOTE_SERVICE_URL", "ServiceBusConnection")
    assert sourced(text, tmp_path, *names) == [CONNECTION, "http://127.0.0.1:41236", ""]
    # what it runs with, for the person reading it, and that declarations are read at start
    assert "#   MAX_FAILURE_COUNT=3" in text and "#   STEP_TIMEOUT_SECONDS=5" in text
    assert "declarations/" in text


def test_on_service_bus_it_names_the_bus_and_the_transport(tmp_path: Path) -> None:
    bus = "Endpoint=sb://127.0.0.1:5672;SharedAccessKeyName=localbus;SharedAccessKey=x y'z"
    stack = SimpleNamespace(
        connection_string=CONNECTION, simulator_url="http://s", service_bus_connection=bus
    )
    text = stack_env(stack, {})  # type: ignore[arg-type]
    assert sourced(text, tmp_path, "ServiceBusConnection", "AGENT_TRANSPORT") == [
        bus,
        "servicebus",
    ]
