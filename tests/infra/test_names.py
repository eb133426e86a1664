"""(e) The queues and the table Bicep creates are the ones core.names names.

With AGENT_TRANSPORT = servicebus (what Bicep deploys), the agent request and
reply queues live on Service Bus and every other queue is a Storage queue.
"""

from __future__ import annotations

import json

from core import names
from tests.infra.bicep import INFRA, MAIN, body, parse, resources_of_type

AGENT_QUEUES = (names.AGENT_REQUESTS, names.AGENT_REPLIES)


def _var(name: str) -> object:
    return parse(MAIN)["variables"][name]["value"]


def _module_params(module: str) -> dict[str, object]:
    return parse(MAIN)["modules"][module]["config"]["params"]


def test_storage_queues_are_core_names_without_the_agent_queues() -> None:
    expected = [q for q in names.Names().storage_queues() if q not in AGENT_QUEUES]
    declared = _var("storageQueueNames")
    assert sorted(declared) == sorted(expected)
    assert len(declared) == len(set(declared))


def test_service_bus_queues_are_the_agent_queues() -> None:
    declared = _var("serviceBusQueueNames")
    assert sorted(declared) == sorted(AGENT_QUEUES)


def test_state_table_is_core_names() -> None:
    assert _var("stateTableName") == names.STATE_TABLE


def test_modules_receive_the_names() -> None:
    storage = _module_params("storage")
    assert storage["queueNames"] == "storageQueueNames"
    assert storage["tableName"] == "stateTableName"
    assert _module_params("serviceBus")["queueNames"] == "serviceBusQueueNames"
    assert _module_params("rbac")["serviceBusQueueNames"] == "serviceBusQueueNames"


def test_modules_create_one_queue_per_name() -> None:
    storage = parse(INFRA / "app" / "storage.bicep")
    (queues,) = resources_of_type(
        storage, "Microsoft.Storage/storageAccounts/queueServices/queues"
    ).values()
    assert queues["config"]["loop_type"]["detail"]["array_name"] == "queueNames"
    (table,) = resources_of_type(
        storage, "Microsoft.Storage/storageAccounts/tableServices/tables"
    ).values()
    assert body(table)["name"] == "tableName"

    service_bus = parse(INFRA / "app" / "servicebus.bicep")
    (sb_queues,) = resources_of_type(service_bus, "Microsoft.ServiceBus/namespaces/queues").values()
    assert sb_queues["config"]["loop_type"]["detail"]["array_name"] == "queueNames"


def test_service_bus_queues_detect_duplicates_and_dead_letter() -> None:
    service_bus = parse(INFRA / "app" / "servicebus.bicep")
    (queues,) = resources_of_type(service_bus, "Microsoft.ServiceBus/namespaces/queues").values()
    props = body(queues)["properties"]
    assert props["requiresDuplicateDetection"] is True
    assert props["duplicateDetectionHistoryTimeWindow"]
    # replies that expire unapplied are dead-lettered (an alert); expired requests are not
    # (the supervisor owns their steps; an alert each would page for a busy agent pool)
    rule = json.dumps(props["deadLetteringOnMessageExpiration"])
    assert "queueName" in rule and "requestQueueName" in rule, rule
    assert _var("serviceBusQueueNames")[0] == names.AGENT_REQUESTS
    assert _module_params("serviceBus")["requestQueueName"] is not None
    assert props["lockDuration"] and props["maxDeliveryCount"] >= 1
