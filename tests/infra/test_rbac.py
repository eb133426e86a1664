"""The app identity's data roles, each on the entities the app uses and no wider
(docs/deployment.md, "Identity model and roles").

Service Bus, on the agent queues only: agent-requests-<agent> for each agent
(infra/agents.json; test_agents checks main passes them all) and agent-replies.
- Data Sender and Data Receiver on each agent queue: the scheduler and agents send and
  take requests and replies; Receiver on a queue also covers its `$DeadLetterQueue`
  sub-queue, which is not a resource of its own (no narrower scope exists).
- Data Owner only when the deployment asks for target-based scaling
  (serviceBusTargetScaling, off by default): it carries Manage (change, purge or delete
  the queue), which the app's code never needs, and which the scale controller needs to
  read a queue's length; without it the agents scale incrementally (Azure-Functions#2379,
  docs/deployment.md). Never on the namespace.

Storage blobs, per container, never the account: Storage Blob Data Owner on the
deployment package's container and the Functions host's two (locks and timer state,
keys), which storage.bicep creates; Storage Blob Data Contributor on orders-archive.
Queues and tables stay account-wide (replyTo names any queue; the host creates a table
each month).
"""

from __future__ import annotations

import json
from typing import Any

from tests.infra.bicep import INFRA, MAIN, Scope, body, load_json, parse, resources_of_type

RBAC = INFRA / "app" / "rbac.bicep"
SENDER = "Azure Service Bus Data Sender"
RECEIVER = "Azure Service Bus Data Receiver"
OWNER = "Azure Service Bus Data Owner"
BLOB_OWNER = "Storage Blob Data Owner"
BLOB_CONTRIBUTOR = "Storage Blob Data Contributor"
STORAGE = INFRA / "app" / "storage.bicep"
CONTAINER = "Microsoft.Storage/storageAccounts/blobServices/containers"


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


def test_triggers_can_send_and_receive_including_dead_letters() -> None:
    roles = _app_service_bus_roles()
    for role in (SENDER, RECEIVER):
        assert role in roles, f"the app identity lacks {role} on the agent queues"
        assert _is_per_agent_queue(roles[role]), f"{role} must be scoped to each agent queue"
        assert roles[role]["config"].get("condition") is None, f"{role} must always be granted"


def test_app_service_bus_roles_are_send_and_receive_on_the_queues_only() -> None:
    """Data Owner (Manage: change, purge or delete a queue) only when asked for, on the
    agent queues, and no role ever on the namespace."""
    roles = _app_service_bus_roles()
    assert set(roles) == {SENDER, RECEIVER, OWNER}, sorted(roles)
    wide = [role for role, assignment in roles.items() if not _is_per_agent_queue(assignment)]
    assert not wide, f"app Service Bus roles wider than the agent queues: {wide}"
    assert roles[OWNER]["config"]["condition"] == "serviceBusTargetScaling"


def test_data_owner_for_target_based_scaling_is_off_unless_the_deployment_asks() -> None:
    rbac = parse(RBAC)["parameters"]["serviceBusTargetScaling"]
    main = parse(MAIN)["parameters"]["serviceBusTargetScaling"]
    assert (rbac["type"], rbac["default"], main["type"], main["default"]) == (
        "bool",
        False,
        "bool",
        False,
    )
    passed = parse(MAIN)["modules"]["rbac"]["config"]["params"]["serviceBusTargetScaling"]
    assert passed == "serviceBusTargetScaling"
    given = load_json(INFRA / "main.parameters.json")["parameters"]["serviceBusTargetScaling"]
    assert given == {"value": "${SERVICEBUS_TARGET_SCALING=false}"}


# --- blobs ----------------------------------------------------------------------------


def _scope_type(assignment: dict[str, Any]) -> str:
    """The resource type of an assignment's scope (a symbol of rbac.bicep, maybe indexed)."""
    scope = body(assignment)["scope"]
    if isinstance(scope, dict):  # ownedContainers[i]
        scope = scope["operator"]["operands"]["operand_1"]
    resource: dict[str, Any] = parse(RBAC)["resources"][scope]
    return str(resource["type"])


def _app_blob_roles() -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = {}
    for assignment in _app_assignments().values():
        role = _role_name(assignment)
        if role and role.startswith("Storage Blob"):
            assert role not in found, f"{role} is assigned to the app identity twice"
            found[role] = assignment
    return found


def _account_wide_app_roles() -> set[str]:
    """The role names of roles.json the app holds on the whole account (a loop over ids)."""
    rbac = parse(RBAC)
    for symbol, assignment in _app_assignments().items():
        if _scope_type(assignment) == "Microsoft.Storage/storageAccounts":
            loop = assignment["config"]["loop_type"]["detail"]["array_name"]
            ids = rbac["variables"][loop]["value"]
            names = {item["operator"]["operands"]["operand_2"] for item in ids}
            assert symbol == "appStorage", symbol
            return {str(name) for name in names}
    return set()


def test_no_blob_role_of_the_app_is_account_wide() -> None:
    assert _account_wide_app_roles() == {
        "Storage Queue Data Contributor",
        "Storage Table Data Contributor",
    }


def test_the_app_owns_the_package_and_host_containers_and_writes_the_archive() -> None:
    roles = _app_blob_roles()
    assert set(roles) == {BLOB_OWNER, BLOB_CONTRIBUTOR}, sorted(roles)
    owner, contributor = roles[BLOB_OWNER], roles[BLOB_CONTRIBUTOR]
    assert _scope_type(owner) == CONTAINER and _scope_type(contributor) == CONTAINER
    # Owner: one assignment per container of appOwnedContainerNames
    loop = owner["config"]["loop_type"]["detail"]
    assert loop["count"]["function"] == {
        "type": "length",
        "parameters": {"arg_1": "appOwnedContainerNames"},
    }
    containers = parse(RBAC)["resources"]
    assert containers["ownedContainers"]["config"]["loop_type"]["detail"]["array_name"] == (
        "appOwnedContainerNames"
    )
    assert body(contributor)["scope"] == "archiveContainer"
    assert body(containers["archiveContainer"])["name"] == "archiveContainerName"

    # main: the deployment container and the host's two are owned, the archive is not
    main = Scope(MAIN)
    passed = main.module_params("rbac")
    owned = passed["appOwnedContainerNames"]
    assert owned == [main["deploymentContainerName"], *main["hostContainerNames"]]
    assert set(main["hostContainerNames"]) == {"azure-webjobs-hosts", "azure-webjobs-secrets"}
    assert passed["archiveContainerName"] == "orders-archive"
    assert "orders-archive" not in owned


def test_every_container_a_role_is_scoped_to_is_created_by_storage_bicep() -> None:
    """A role on a container that does not exist fails the deployment, and a host
    container the host had to create itself would need a role on the account."""
    main = Scope(MAIN)
    storage = main.module_params("storage")
    created = {storage["deploymentContainerName"], storage["archiveContainerName"]}
    created |= set(storage["hostContainerNames"])
    loops = resources_of_type(parse(STORAGE), CONTAINER)
    assert {body(c)["name"] for c in loops.values()} == {
        "deploymentContainerName",
        "archiveContainerName",
        "containerName",  # the loop over hostContainerNames
    }
    assert loops["hostContainers"]["config"]["loop_type"]["detail"]["array_name"] == (
        "hostContainerNames"
    )
    rbac = main.module_params("rbac")
    assert {*rbac["appOwnedContainerNames"], rbac["archiveContainerName"]} <= created


# --- the deploying user ---------------------------------------------------------------


def _deployer_assignments() -> dict[str, dict[str, Any]]:
    assignments = resources_of_type(parse(RBAC), "Microsoft.Authorization/roleAssignments")
    return {
        symbol: assignment
        for symbol, assignment in assignments.items()
        if body(assignment)["properties"]["principalId"] == "principalId"
    }


def test_the_deployer_gets_data_roles_only_when_the_deployment_asks() -> None:
    """Whoever runs `azd up` keeps no standing data access: the storage and Service Bus
    data roles of the deploying principal exist only with grantDeployerDataAccess (off by
    default) and a principal id."""
    deployer = _deployer_assignments()
    assert set(deployer) == {"userStorage", "userServiceBus", "userReadsState"}, sorted(deployer)
    for symbol in ("userStorage", "userServiceBus"):
        assert deployer[symbol]["config"].get("condition") == "grantsDeployer", symbol

    def granted(**params: Any) -> Any:
        return Scope(RBAC, params)["grantsDeployer"]

    assert granted(principalId="0000-user") is False  # the default: off
    assert granted(principalId="0000-user", grantDeployerDataAccess=False) is False
    assert granted(principalId="", grantDeployerDataAccess=True) is False  # no one named
    assert granted(principalId="0000-user", grantDeployerDataAccess=True) is True

    rbac = parse(RBAC)["parameters"]["grantDeployerDataAccess"]
    main = parse(MAIN)["parameters"]["grantDeployerDataAccess"]
    assert (rbac["type"], rbac["default"], main["type"], main["default"]) == (
        "bool",
        False,
        "bool",
        False,
    )
    passed = parse(MAIN)["modules"]["rbac"]["config"]["params"]["grantDeployerDataAccess"]
    assert passed == "grantDeployerDataAccess"
    given = load_json(INFRA / "main.parameters.json")["parameters"]["grantDeployerDataAccess"]
    assert given == {"value": "${GRANT_DEPLOYER_DATA_ACCESS=false}"}


def test_the_deployer_reads_the_state_table_alone_for_the_deploy_guard() -> None:
    """By default the deploying principal gets one data role: Storage Table Data Reader on
    the state table alone (the deploy guard reads the orders in flight; nothing it can
    change), unless deployerReadsState is off (DEPLOYER_READS_STATE=false)."""
    reads = _deployer_assignments()["userReadsState"]
    assert reads["config"].get("condition") == "readsState"

    def granted(**params: Any) -> Any:
        return Scope(RBAC, params)["readsState"]

    assert granted(principalId="0000-user") is True  # the default: on
    assert granted(principalId="0000-user", deployerReadsState=False) is False
    assert granted(principalId="", deployerReadsState=True) is False  # no one named
    assert "Storage Table Data Reader" in json.dumps(body(reads)["properties"])
    assert body(reads)["scope"] == "stateTable"
    roles = load_json(INFRA / "app" / "roles.json")
    assert roles["Storage Table Data Reader"] == "76199698-9eea-4c19-bc75-cec21354c6b6"
    rbac = parse(RBAC)["parameters"]["deployerReadsState"]
    assert (rbac["type"], rbac["default"]) == ("bool", True)
    given = load_json(INFRA / "main.parameters.json")["parameters"]["deployerReadsState"]
    assert given == {"value": "${DEPLOYER_READS_STATE=true}"}
    passed = parse(MAIN)["modules"]["rbac"]["config"]["params"]
    assert passed["deployerReadsState"] == "deployerReadsState"
    assert "tableName" in json.dumps(passed["stateTableName"])  # storage.outputs.tableName
