"""The app identity's Service Bus roles: what the triggers and the scale controller need,
on the agent queues only (docs/deployment.md, "Identity model and roles"): agent-requests,
agent-requests-<agent> for each agent (infra/agents.json; test_agents checks main passes
them all) and agent-replies.

- Data Sender and Data Receiver on each agent queue: the scheduler and agents send and
  take requests and replies; Receiver on a queue also covers its `$DeadLetterQueue`
  sub-queue, which is not a resource of its own (no narrower scope exists).
- Data Owner on each agent queue: target-based scaling reads the queue's runtime
  properties (active and dead-letter counts), which needs the Manage right; without it the
  scale controller falls back to incremental scaling (Azure/Azure-Functions#2379). No other
  built-in role carries Manage, so it is granted, but never on the namespace.
"""

from __future__ import annotations

from typing import Any

from tests.infra.bicep import INFRA, MAIN, body, parse, resources_of_type

RBAC = INFRA / "app" / "rbac.bicep"
SENDER = "Azure Service Bus Data Sender"
RECEIVER = "Azure Service Bus Data Receiver"
OWNER = "Azure Service Bus Data Owner"


def _role_name(assignment: dict[str, Any]) -> str | None:
    """The roles.json name of a `roles['<name>']` role definition, else None (a loop var)."""
    role = body(assignment)["properties"]["roleDefinitionId"]["function"]["parameters"]
    name = role["resource_name_1"]
    if isinstance(name, dict) and name.get("operator", {}).get("type") == "index_accessor":
        operands = name["operator"]["operands"]
        if operands["operand_1"] == "roles":
            return str(operands["operand_2"])
    return None


def _app_assignments() -> dict[str, dict[str, Any]]:
    assignments = resources_of_type(parse(RBAC), "Microsoft.Authorization/roleAssignments")
    return {
        symbol: assignment
        for symbol, assignment in assignments.items()
        if body(assignment)["properties"]["principalId"] == "appPrincipalId"
    }


def _is_per_agent_queue(assignment: dict[str, Any]) -> bool:
    """One assignment per agent queue, each scoped to `agentQueues[i]`."""
    loop = assignment["config"].get("loop_type") or {}
    if loop.get("type") != "range":
        return False
    count = loop["detail"]["count"]["function"]
    index = loop["detail"]["index_name"]
    scope = body(assignment)["scope"]
    return (
        count == {"type": "length", "parameters": {"arg_1": "serviceBusQueueNames"}}
        and isinstance(scope, dict)
        and scope.get("operator", {}).get("type") == "index_accessor"
        and scope["operator"]["operands"] == {"operand_1": "agentQueues", "operand_2": index}
    )


def _app_service_bus_roles() -> dict[str, dict[str, Any]]:
    """role name -> assignment, for the app identity's Service Bus roles."""
    found: dict[str, dict[str, Any]] = {}
    for assignment in _app_assignments().values():
        role = _role_name(assignment)
        if role and role.startswith("Azure Service Bus"):
            assert role not in found, f"{role} is assigned to the app identity twice"
            found[role] = assignment
    return found


def test_agent_queues_are_the_service_bus_queues_main_deploys() -> None:
    (queues,) = resources_of_type(parse(RBAC), "Microsoft.ServiceBus/namespaces/queues").values()
    assert queues["existing"] is True
    assert queues["config"]["loop_type"]["detail"]["array_name"] == "serviceBusQueueNames"
    assert body(queues)["parent"] == "namespace"
    params = parse(MAIN)["modules"]["rbac"]["config"]["params"]
    assert params["serviceBusQueueNames"] == "serviceBusQueueNames"


def test_scale_controller_can_read_agent_queue_metadata() -> None:
    """Data Owner (the only built-in role with Manage) on each agent queue, not wider."""
    roles = _app_service_bus_roles()
    assert OWNER in roles, (
        "the app identity has no Azure Service Bus Data Owner on the agent queues: the scale "
        "controller cannot read their length and scales incrementally (Azure-Functions#2379)"
    )
    assert _is_per_agent_queue(roles[OWNER]), "Data Owner must be scoped to each agent queue"


def test_triggers_can_send_and_receive_including_dead_letters() -> None:
    roles = _app_service_bus_roles()
    for role in (SENDER, RECEIVER):
        assert role in roles, f"the app identity lacks {role} on the agent queues"
        assert _is_per_agent_queue(roles[role]), f"{role} must be scoped to each agent queue"


def test_app_service_bus_roles_are_queue_scoped_never_the_namespace() -> None:
    roles = _app_service_bus_roles()
    assert set(roles) == {SENDER, RECEIVER, OWNER}, sorted(roles)
    wide = [role for role, assignment in roles.items() if not _is_per_agent_queue(assignment)]
    assert not wide, f"app Service Bus roles wider than the agent queues: {wide}"
