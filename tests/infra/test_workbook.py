"""(g) The operators' workbook (infra/app/workbook.bicep, its content infra/app/workbook.json).

Its queries read what the app emits, and nothing else: every ``orders.<name>`` counter
and every custom dimension a query reads is one the code writes (found by scanning the
code: tests/infra/emitted.py), each dimension on the counters or the log records that
carry it. The reverse: every figure the console's dashboard shows is in it, and every
alert counter the code emits is charted. The JSON is a workbook (Notebook/1.0), the
Bicep module is wired from main.bicep, linked to Application Insights, named by a GUID
stable per resource group, and its placeholders all become resource ids.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest

from core.messages import OUTCOMES
from core.outcome import REPORTED, Applied, Outcome
from tests.infra.bicep import (
    INFRA,
    MAIN,
    Scope,
    body,
    evaluate,
    load_json,
    module_path,
    parse,
    resources_of_type,
)
from tests.infra.emitted import METRIC_PREFIX, emitted

WORKBOOK = INFRA / "app" / "workbook.bicep"
CONTENT = INFRA / "app" / "workbook.json"
WORKBOOK_TYPE = "Microsoft.Insights/workbooks"
KQL_ITEM, METRICS_ITEM, GROUP_ITEM = 3, 10, 12
HOUR_MS, DAY_MS = 3_600_000, 86_400_000
#: Tables a query may read, and whether their custom dimensions are the app's.
TABLES = {"customMetrics", "traces", "requests"}
PLACEHOLDER = re.compile(r"<[A-Z_]+>")
APP_INSIGHTS = "<APP_INSIGHTS_ID>"
SERVICE_BUS = "<SERVICE_BUS_NAMESPACE_ID>"
QUEUES = "<STORAGE_QUEUE_SERVICE_ID>"

_METRIC = re.compile(r"[\"'](" + re.escape(METRIC_PREFIX) + r"[A-Za-z0-9_]+)[\"']")
_DIMENSION = re.compile(r"customDimensions(?:\.(\w+)|\[\s*[\"'](\w+)[\"']\s*\])")
_EVENT = re.compile(r"customDimensions\.event\s*==\s*[\"']([^\"']+)[\"']")
_FILTER = re.compile(
    r"\|\s*where\s+name\s*(?:==\s*(?P<one>[\"'][^\"']+[\"'])|in\s*\((?P<many>[^)]*)\))"
)
_COMPARED = re.compile(r"\b(outcome|applied)\s*[!=]=\s*[\"']([^\"']+)[\"']")


def _workbook() -> dict[str, Any]:
    content: dict[str, Any] = load_json(CONTENT)
    return content


def _items(items: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for item in items:
        yield item
        if item.get("type") == GROUP_ITEM:
            yield from _items(item["content"].get("items", []))


def _of_type(kind: int) -> list[dict[str, Any]]:
    return [item for item in _items(_workbook()["items"]) if item["type"] == kind]


def _queries() -> list[tuple[str, str]]:
    return [(item["name"], item["content"]["query"]) for item in _of_type(KQL_ITEM)]


def _table(query: str) -> str:
    match = re.match(r"\s*(\w+)", query)
    assert match, f"a query that names no table: {query!r}"
    return match[1]


def _selected(query: str) -> set[str]:
    """The counters a query keeps (``| where name == ...`` or ``| where name in (...)``):
    a name it mentions elsewhere only labels rows it never has."""
    selected: set[str] = set()
    for match in _FILTER.finditer(query):
        selected |= set(_METRIC.findall(match["one"] or match["many"]))
    return selected


def _dimensions(query: str) -> set[str]:
    return {a or b for a, b in _DIMENSION.findall(query)}


QUERIES = _queries()
IDS = [name for name, _ in QUERIES]


# --- the JSON: a workbook --------------------------------------------------------------


def test_the_content_is_a_workbook() -> None:
    workbook = _workbook()  # valid JSON, or this raises
    assert workbook["version"] == "Notebook/1.0"
    assert isinstance(workbook["items"], list) and workbook["items"]
    names = []
    for item in _items(workbook["items"]):
        assert isinstance(item["type"], int) and isinstance(item["content"], dict), item
        names.append(item["name"])
    assert len(names) == len(set(names)), f"item names repeat: {sorted(names)}"
    assert QUERIES, "the workbook has no query"
    assert _of_type(METRICS_ITEM), "the workbook has no metrics chart"


@pytest.mark.parametrize(("name", "query"), QUERIES, ids=IDS)
def test_each_query_reads_the_app_insights_component(name: str, query: str) -> None:
    [item] = [i for i in _of_type(KQL_ITEM) if i["name"] == name]
    content = item["content"]
    assert content["version"] == "KqlItem/1.0"
    assert content["queryType"] == 0  # logs
    assert content["resourceType"] == "microsoft.insights/components"
    assert content["crossComponentResources"] == [APP_INSIGHTS]
    assert _table(query) in TABLES, f"{name} reads {_table(query)}, not one of {TABLES}"
    parameter = content.get("timeContextFromParameter")
    if parameter is not None:
        declared = {
            p["name"]
            for item in _items(_workbook()["items"])
            if item["type"] == 9
            for p in item["content"]["parameters"]
        }
        assert parameter in declared, f"{name} takes its time from no parameter {parameter}"


# --- the queries read what the app emits -------------------------------------------------


@pytest.mark.parametrize(("name", "query"), QUERIES, ids=IDS)
def test_every_counter_a_query_reads_is_emitted(name: str, query: str) -> None:
    found = emitted()
    for metric in _METRIC.findall(query):
        assert metric in found.metrics, (
            f"{name} reads {metric}, which no METRICS.inc call writes"
            + (" (only a name built at run time matches it)" if _patterned(metric) else "")
        )
    if _table(query) == "customMetrics":
        assert _selected(query), f"{name} reads customMetrics but selects no counter by name"


def _patterned(metric: str) -> bool:
    return any(pattern.fullmatch(metric) for pattern in emitted().metric_patterns)


@pytest.mark.parametrize(("name", "query"), QUERIES, ids=IDS)
def test_every_dimension_a_query_reads_is_written_where_it_reads_it(name: str, query: str) -> None:
    found = emitted()
    used = _dimensions(query)
    table = _table(query)
    if table == "customMetrics":
        metrics = sorted(_selected(query))
        carried = set().union(*(found.metrics.get(m, set()) for m in metrics))
        assert used <= carried, (
            f"{name} reads custom dimensions {sorted(used - carried)}, attributes of none of "
            f"{metrics} (they have {sorted(carried)})"
        )
    elif table == "traces":
        assert used <= found.log_dimensions, (
            f"{name} reads custom dimensions {sorted(used - found.log_dimensions)} that no log "
            f"record carries (they carry {sorted(found.log_dimensions)})"
        )
    else:
        assert not used, f"{name} reads custom dimensions of {table}, which the app does not set"
    for event in _EVENT.findall(query):
        assert event in found.events, f"{name} reads event {event!r}, which no record has"


@pytest.mark.parametrize(("name", "query"), QUERIES, ids=IDS)
def test_the_words_a_query_compares_are_the_codes(name: str, query: str) -> None:
    """``outcome`` is a Outcome on the wire (a refusal is "failed"), ``applied``
    is one of core.attempts.Applied."""
    allowed = {"outcome": set(OUTCOMES), "applied": {a.value for a in Applied}}
    for dimension, word in _COMPARED.findall(query):
        assert word in allowed[dimension], f"{name}: {dimension} is never {word!r}"


# --- the reverse: the figures the dashboard shows are there -----------------------------


def _reading(*metrics: str, dimensions: tuple[str, ...] = ()) -> list[str]:
    """The queries that read every one of ``metrics`` and ``dimensions``."""
    return [
        name
        for name, query in QUERIES
        if set(metrics) <= _selected(query) and set(dimensions) <= _dimensions(query)
    ]


def test_orders_started_and_ended_per_minute_by_workflow() -> None:
    for metric in ("orders.orders_accepted", "orders.orders_ended"):
        per_minute = [
            name
            for name in _reading(metric, dimensions=("workflow",))
            if "bin(timestamp, 1m)" in dict(QUERIES)[name]
        ]
        assert per_minute, f"no chart of {metric} per minute by workflow"


@pytest.mark.parametrize("duration", [HOUR_MS, DAY_MS], ids=["last hour", "last day"])
def test_step_and_agent_duration_percentiles(duration: int) -> None:
    items = [
        item
        for item in _of_type(KQL_ITEM)
        if item["content"]["timeContext"] == {"durationMs": duration}
        and "timeContextFromParameter" not in item["content"]
        and {"step", "agent", "durationMs"} <= _dimensions(item["content"]["query"])
        and set(_EVENT.findall(item["content"]["query"])) == {"reply_applied"}
    ]
    assert items, f"no duration table over the last {duration} ms"
    for item in items:
        query = item["content"]["query"]
        for p in (50, 90, 99):
            assert f"percentile(durationMs, {p})" in query, f"{item['name']} lacks p{p}"
        assert re.search(r"by step, agent", query), f"{item['name']} is not by step and agent"


def test_failures_by_agent_and_every_answer_kind() -> None:
    names = _reading("orders.agent_replies", dimensions=("agent", "outcome", "applied"))
    assert names, "no query of the agents' answers by agent, outcome and applied"
    for name in names:
        compared = set(_COMPARED.findall(dict(QUERIES)[name]))
        # what an agent reports, as the metric records it: the wire's words
        for outcome in set(REPORTED) - {Outcome.SUCCEEDED}:
            assert ("outcome", outcome.wire) in compared, f"{name} misses {outcome.wire}"
        assert ("applied", Applied.MAYBE.value) in compared, f"{name} misses may-have-applied"


def test_every_alert_counter_the_code_emits_is_charted() -> None:
    alerting = {m for m in emitted().metrics if m.endswith("alerts") or m.endswith("quarantined")}
    assert {"orders.alerts", "orders.poison_alerts"} <= alerting
    charted = {m for _, query in QUERIES for m in _selected(query)}
    assert alerting <= charted, f"alerts not in the workbook: {sorted(alerting - charted)}"
    listed = [name for name, query in QUERIES if "operator_alert" in _EVENT.findall(query)]
    assert listed, "no list of the operator alerts' records"


def test_requests_per_function() -> None:
    assert any(
        _table(query) == "requests" and re.search(r"by function = name\b", query)
        for _, query in QUERIES
    ), "no count of requests by function name"


@pytest.mark.parametrize(
    ("namespace", "metric", "split", "placeholder"),
    [
        ("microsoft.servicebus/namespaces", "ActiveMessages", "EntityName", SERVICE_BUS),
        ("microsoft.servicebus/namespaces", "DeadletteredMessages", "EntityName", SERVICE_BUS),
        ("microsoft.storage/storageaccounts/queueservices", "QueueMessageCount", None, QUEUES),
    ],
)
def test_queue_depths_from_the_platform_metrics(
    namespace: str, metric: str, split: str | None, placeholder: str
) -> None:
    charts = [
        (item["content"], spec)
        for item in _of_type(METRICS_ITEM)
        for spec in item["content"]["metrics"]
        if spec["metric"] == f"{namespace}--{metric}"
    ]
    assert charts, f"no chart of {metric}"
    for content, spec in charts:
        assert spec["namespace"] == content["resourceType"] == namespace
        assert content["resourceIds"] == [placeholder]
        if split:
            assert spec.get("splitBy") == [split], f"{metric} is not split by {split}"


# --- the Bicep module ------------------------------------------------------------------

FAKE_IDS = {
    "appInsightsId": "/subscriptions/s/resourceGroups/rg/providers/Microsoft.Insights/components/appi-x",
    "serviceBusNamespaceId": "/subscriptions/s/resourceGroups/rg/providers/Microsoft.ServiceBus/namespaces/sb-x",
    "storageAccountId": "/subscriptions/s/resourceGroups/rg/providers/Microsoft.Storage/storageAccounts/stx",
}


def _resource() -> dict[str, Any]:
    (resource,) = resources_of_type(parse(WORKBOOK), WORKBOOK_TYPE).values()
    return body(resource)


def test_main_deploys_the_workbook_with_the_resources_it_charts() -> None:
    modules = parse(MAIN)["modules"]
    [symbol] = [s for s, m in modules.items() if module_path(MAIN, m) == WORKBOOK.resolve()]
    params = body(modules[symbol])["params"]
    expected = {
        "appInsightsId": ("monitoring", "appInsightsId"),
        "serviceBusNamespaceId": ("serviceBus", "id"),
        "storageAccountId": ("storage", "id"),
    }
    for param, (module, output) in expected.items():
        operands = params[param]["operator"]["operands"]
        inner = operands["operand_2"]["operator"]["operands"]
        assert (operands["operand_1"], inner["operand_1"], inner["operand_2"]) == (
            module,
            "outputs",
            output,
        ), f"{param} is not {module}.outputs.{output}"
    assert isinstance(params["displayName"], str) and params["displayName"].strip()


def test_the_workbook_is_shared_linked_to_app_insights_and_named_by_a_stable_guid() -> None:
    resource = _resource()
    assert resource["kind"] == "shared"
    properties = resource["properties"]
    assert properties["category"] == "workbook"
    assert properties["version"] == "Notebook/1.0"
    assert properties["displayName"] == "displayName"  # the parameter
    scope = Scope(WORKBOOK, FAKE_IDS)
    assert evaluate(properties["sourceId"], scope) == FAKE_IDS["appInsightsId"].lower()
    name = resource["name"]["function"]
    assert name["type"] == "guid", "a workbook's name must be a GUID"
    seed = name["parameters"]["base_string"]["function"]
    assert (seed["type"], seed["property_name"]) == ("resource_group", "id")
    assert all(isinstance(v, str) for k, v in name["parameters"].items() if k != "base_string")


def test_the_serialized_data_is_the_json_with_every_placeholder_filled() -> None:
    scope = Scope(WORKBOOK, FAKE_IDS)
    serialized = evaluate(_resource()["properties"]["serializedData"], scope)
    assert isinstance(serialized, str)
    assert not PLACEHOLDER.findall(serialized), PLACEHOLDER.findall(serialized)
    workbook = json.loads(serialized)
    assert workbook["version"] == "Notebook/1.0"
    in_json = set(PLACEHOLDER.findall(CONTENT.read_text(encoding="utf-8")))
    assert in_json == {APP_INSIGHTS, SERVICE_BUS, QUEUES}
    resources = {r for item in _items(workbook["items"]) for r in _resource_ids(item)}
    assert resources == {
        FAKE_IDS["appInsightsId"],
        FAKE_IDS["serviceBusNamespaceId"],
        FAKE_IDS["storageAccountId"] + "/queueServices/default",
    }


def _resource_ids(item: dict[str, Any]) -> list[str]:
    content = item["content"]
    ids: list[str] = content.get("crossComponentResources", []) + content.get("resourceIds", [])
    return ids
