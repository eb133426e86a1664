"""The runtime's thread pool holds every function's host.json concurrency at once
(hostrun/pool.py): deployed, locally, and in the example settings."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from devhost.app_loader import FunctionSpec
from hostrun import pool
from hostrun.pool import DEPLOYED_THREADS, SETTING

ROOT = Path(__file__).resolve().parents[2]


#: function_app.py's functions as devhost builds them, in a process of their own: the
#: transport is read when the blueprints are built, and an app indexes once.
NEEDED = """
import json, sys
from devhost import app_loader
from hostrun import pool
app = app_loader.find_app(app_loader.load_module("function_app", "."))
environ = {"SUPERVISOR_SCHEDULE": "*/10 * * * * *", "ServiceBusConnection": "x"}
specs = [app_loader.build_spec(fn, environ) for fn in app.get_functions()]
print(pool.needed(specs, json.load(open("host.json"))))
"""


def app_needs(transport: str) -> int:
    env = {k: v for k, v in os.environ.items() if k != "ORDERS_DECLARATIONS"}
    env["AGENT_TRANSPORT"] = transport  # and the deployment's own declarations
    done = subprocess.run(
        [sys.executable, "-c", NEEDED],
        check=False,
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    return int(done.stdout)


def spec(kind: str) -> FunctionSpec:
    return FunctionSpec(f"f_{kind}", kind, {"name": "x"}, func=lambda **_: None)


def test_needed_sums_each_functions_host_json_limit() -> None:
    host: dict[str, Any] = {
        "extensions": {
            "queues": {"messageEncoding": "none", "batchSize": 4, "newBatchThreshold": 2},
            "serviceBus": {"maxConcurrentCalls": 5},
        }
    }
    kinds = ["queueTrigger", "queueTrigger", "serviceBusTrigger", "timerTrigger"]
    assert pool.needed([spec(k) for k in kinds], host) == 6 + 6 + 5 + 1
    # the HTTP routes count once, whatever their number
    with_http = [spec(k) for k in [*kinds, "httpTrigger", "httpTrigger"]]
    assert pool.needed(with_http, host) == 18 + pool.HTTP_CONCURRENCY
    # host.json's queue options are read only when a queue function runs (devhost refuses
    # base64 messages, host.json's default)
    assert pool.needed([spec("httpTrigger")], {}) == pool.HTTP_CONCURRENCY


def test_a_pool_below_the_need_is_a_warning_naming_the_setting() -> None:
    specs = [spec("queueTrigger")] * 3  # 3 x (16 + 8) with host.json's defaults
    host = {"extensions": {"queues": {"messageEncoding": "none"}}}
    warning = pool.shortfall(specs, host, {SETTING: "10"})
    assert warning is not None
    assert "10 threads" in warning and f"{SETTING}=72" in warning
    assert pool.shortfall(specs, host, {SETTING: "72"}) is None
    # unset: Python's default, min(32, CPUs + 4), well below 72
    unset = pool.shortfall(specs, host, {})
    assert unset is not None and f"{SETTING} unset" in unset


@pytest.mark.deployment
@pytest.mark.parametrize("transport", ["storage", "servicebus"])
def test_the_deployed_pool_holds_every_function_at_once(transport: str) -> None:
    need = app_needs(transport)
    assert need > 32, "the app runs more than Python's default pool at once"
    assert int(DEPLOYED_THREADS) >= need, (transport, need)


def test_bicep_the_example_settings_and_the_local_stack_set_the_same_pool() -> None:
    bicep = (ROOT / "infra" / "app" / "function-app.bicep").read_text(encoding="utf-8")
    (deployed,) = re.findall(rf"name: '{SETTING}'\s+value: '(\d+)'", bicep)
    example = json.loads((ROOT / "local.settings.example.json").read_text(encoding="utf-8"))
    from demo.stack import LocalStack

    stack = LocalStack(azurite=SimpleNamespace(connection_string="x"))  # type: ignore[arg-type]
    assert deployed == example["Values"][SETTING] == stack.env[SETTING] == DEPLOYED_THREADS
