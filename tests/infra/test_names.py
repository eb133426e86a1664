"""(e) The queues and the table Bicep creates are the ones core.names names.

With AGENT_TRANSPORT = servicebus (what Bicep deploys), the agent request and
reply queues live on Service Bus (the legacy agent-requests, one
agent-requests-<agent> per declared agent, agent-replies) and every other queue,
the agent queues' poison queues included, is a Storage queue. The agents come
from infra/agents.json (generated from the declarations); the variables are
evaluated from pycep's tree (tests/infra/bicep.py, "evaluating expressions").
"""

from __future__ import annotations

from core import names
from tests.infra.bicep import (
    INFRA,
    MAIN,
    REGENERATE,
    Scope,
    body,
    evaluate,
    parse,
    resources_of_type,
)

SERVICE_BUS = INFRA / "app" / "servicebus.bicep"


def _var(name: str) -> object:
    return Scope(MAIN)[name]


def _service_bus_queues() -> tuple[str, ...]:
    """What core.names puts on Service Bus: every agent queue, request and reply, and the
    orders' wake-ups."""
    return names.Names().service_bus_queues()


def _request_queues() -> tuple[str, ...]:
    return names.Names().agent_queues()


def _module_params(module: str) -> dict[str, object]:
    params: dict[str, object] = parse(MAIN)["modules"][module]["config"]["params"]
    return params


def test_storage_queues_are_core_names_without_the_service_bus_queues() -> None:
    expected = [q for q in names.Names().storage_queues() if q not in _service_bus_queues()]
    declared = _var("storageQueueNames")
    assert isinstance(declared, list)
    assert sorted(declared) == sorted(expected), (
        f"storage queues differ from core.names; if the agents changed, run `{REGENERATE}`"
    )
    assert len(declared) == len(set(declared))


def test_service_bus_queues_are_the_agent_queues() -> None:
    declared = _var("serviceBusQueueNames")
    assert isinstance(declared, list)
    assert sorted(declared) == sorted(_service_bus_queues()), (
        f"Service Bus queues differ from core.names; if the agents changed, run `{REGENERATE}`"
    )
    assert len(declared) == len(set(declared))
    requests = _var("serviceBusRequestQueueNames")
    assert isinstance(requests, list)
    assert sorted(requests) == sorted(_request_queues())


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

    service_bus = parse(SERVICE_BUS)
    (sb_queues,) = resources_of_type(service_bus, "Microsoft.ServiceBus/namespaces/queues").values()
    assert sb_queues["config"]["loop_type"]["detail"]["array_name"] == "queueNames"


def _queue_properties(queue: str) -> dict[str, object]:
    """The properties servicebus.bicep gives ``queue``, as main.bicep deploys it."""
    (queues,) = resources_of_type(
        parse(SERVICE_BUS), "Microsoft.ServiceBus/namespaces/queues"
    ).values()
    item = queues["config"]["loop_type"]["detail"]["item_name"]
    scope = Scope(SERVICE_BUS, Scope(MAIN).module_params("serviceBus")).with_local(item, queue)
    properties = evaluate(body(queues)["properties"], scope)
    assert isinstance(properties, dict)
    return properties


def test_service_bus_queues_detect_duplicates_and_dead_letter() -> None:
    (queues,) = resources_of_type(
        parse(SERVICE_BUS), "Microsoft.ServiceBus/namespaces/queues"
    ).values()
    props = body(queues)["properties"]
    assert props["requiresDuplicateDetection"] is True
    assert props["duplicateDetectionHistoryTimeWindow"]
    assert props["lockDuration"] and props["maxDeliveryCount"] >= 1
    # Replies that expire unapplied are dead-lettered (an alert); so are requests that expire
    # unread, which their dead-letter trigger reports as "not called" (supervisor/expired.py).
    assert _queue_properties(names.AGENT_REPLIES)["deadLetteringOnMessageExpiration"] is True
    for queue in _request_queues():
        assert _queue_properties(queue)["deadLetteringOnMessageExpiration"] is True, queue


def test_every_agent_queue_is_deployed_alike() -> None:
    """Each agent's request queue has the same properties, exactly; the shared queue of
    versions before agents is not deployed (docs/operating.md, "Upgrading")."""
    first, *others = names.Names().agent_queues()
    for queue in others:
        assert _queue_properties(queue) == _queue_properties(first), queue
    assert names.AGENT_REQUESTS not in _service_bus_queues()
