"""The runtime's thread pool holds every synchronous function's host.json concurrency at
once (devhost/pool.py): deployed, locally (devhost applies the deployed value when unset:
devhost/deployed.py), and in the example settings."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from devhost import deployed, pool
from devhost.app_loader import FunctionSpec
from devhost.pool import SETTING
from devhost.settings import ConfigError

ROOT = Path(__file__).resolve().parents[2]
DEPLOYED_THREADS = deployed.settings(ROOT)[SETTING]


#: function_app.py's functions as devhost builds them, in a process of their own: the
#: transport is read when the blueprints are built, and an app indexes once.
NEEDED = """
import json, sys
from devhost import app_loader
from devhost import pool
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


def test_async_functions_take_no_pool_thread() -> None:
    async def agent(**_: Any) -> None:
        return None

    specs = [spec("queueTrigger"), FunctionSpec("run_agent_x", "queueTrigger", {}, func=agent)]
    host = {"extensions": {"queues": {"messageEncoding": "none"}}}
    assert pool.needed(specs, host) == 24  # the sync function's 16 + 8 only


def test_bicep_reads_the_deployed_pool_from_the_file_devhost_reads() -> None:
    bicep = (ROOT / "infra" / "app" / "function-app.bicep").read_text(encoding="utf-8")
    assert f"'{SETTING}'" not in bicep, "set in infra/platform-settings.json, not here"
    assert "loadJsonContent('../platform-settings.json').appSettings" in bicep
    assert "platformSettings" in bicep.split("appSettings: concat(", 1)[1]
    example = json.loads((ROOT / "local.settings.example.json").read_text(encoding="utf-8"))
    assert example["Values"][SETTING] == DEPLOYED_THREADS  # func start reads no Bicep


def test_devhost_applies_the_deployed_settings_where_the_environment_sets_none() -> None:
    environ: dict[str, str] = {}
    applied = deployed.apply(environ, ROOT)
    assert environ[SETTING] == DEPLOYED_THREADS and applied.defaults == {SETTING: DEPLOYED_THREADS}
    assert applied.overridden == {}
    # an explicit value wins, and is reported beside the deployed one
    environ = {SETTING: "8"}
    applied = deployed.apply(environ, ROOT)
    assert environ[SETTING] == "8" and applied.defaults == {}
    assert applied.overridden == {SETTING: ("8", DEPLOYED_THREADS)}
    # an empty value is no value (the runtime would take Python's default)
    environ = {SETTING: " "}
    assert deployed.apply(environ, ROOT).defaults == {SETTING: DEPLOYED_THREADS}
    # an app folder without the file: nothing applied (a test app, another app)
    environ = {}
    assert deployed.apply(environ, ROOT / "tests").defaults == {} and environ == {}


def test_a_broken_settings_file_is_a_config_error(tmp_path: Path) -> None:
    (tmp_path / "infra").mkdir()
    (tmp_path / "infra" / "platform-settings.json").write_text('{"appSettings": [{"name": 1}]}')
    with pytest.raises(ConfigError, match=r"platform-settings\.json"):
        deployed.settings(tmp_path)


def test_the_local_stack_leaves_the_pool_to_devhost() -> None:
    from demo.stack import LocalStack

    stack = LocalStack(azurite=SimpleNamespace(connection_string="x"))  # type: ignore[arg-type]
    assert SETTING not in stack.env or SETTING in os.environ
