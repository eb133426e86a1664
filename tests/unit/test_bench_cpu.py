"""bench.cpu's split of a profile: the runtime's pool threads' CPU goes to the functions
that ran on them, in proportion to the CPU each spent there (bench/cpuhost.py)."""

from __future__ import annotations

from bench.cpu import ROOT, split

APP = f"{ROOT}/stores/tables.py"
SDK = "/x/lib/python3.13/site-packages/azure/core/pipeline/_base.py"


def test_the_runtimes_pool_is_split_between_the_functions_it_ran() -> None:
    profile = {
        "threads": [
            {"name": "ThreadPoolExecutor-0_0", "cpu": 3.0, "modules": {APP: 1.0, SDK: 2.0}},
            {"name": "ThreadPoolExecutor-0_1", "cpu": 1.0, "modules": {SDK: 1.0}},
            {"name": "devhost-submit_order_0", "cpu": 1.0, "modules": {SDK: 1.0}},
            {"name": "poll-submit_order", "cpu": 1.0, "modules": {SDK: 1.0}},
        ],
        "top": [],
        "pool": {
            "functions": {"submit_order": 0.3, "run_agent_orders": 0.1},
            "threads": ["ThreadPoolExecutor-0_0", "ThreadPoolExecutor-0_1"],
        },
    }
    out = split(profile, scale_ms=6.0, orders=1)
    by_function = {name: entry["ms"] for name, entry in out["byFunction"].items()}
    # pool 4 s: 3 to submit_order, 1 to run_agent_orders; devhost's side 1 s to submit_order
    assert by_function == {
        "submit_order": 4.0,
        "run_agent_orders": 1.0,
        "host polling and leases": 1.0,
    }
    assert out["byFunctionAndKind"]["run_agent_orders"]["app"]["ms"] == 0.25
    assert out["otherThreadsSeconds"] == {}


def test_without_the_pools_figures_a_pool_thread_is_another_thread() -> None:
    profile = {
        "threads": [{"name": "ThreadPoolExecutor-0_0", "cpu": 1.0, "modules": {SDK: 1.0}}],
        "top": [],
    }
    out = split(profile, scale_ms=1.0, orders=1)
    assert list(out["byFunction"]) == ["other threads"]
