// Every role assignment of the deployment, least privilege, data roles only, each at
// the narrowest scope that works. The built-in role ids, with their names, are in
// roles.json.
//
// App identity (principalType ServicePrincipal):
//   each of its blob containers, never the account:
//     app-package-<t>, azure-webjobs-hosts, azure-webjobs-secrets
//                    Storage Blob Data Owner         the deployment package; the host's
//                                                    locks, timer state and keys
//     orders-archive Storage Blob Data Contributor   the retention timer's archive (3.12)
//   storage account  Storage Queue Data Contributor  orders, replyTo, alert and poison queues
//                    Storage Table Data Contributor  OrderState, host diagnostic-event tables
//   each Service Bus queue (agent-requests-<agent> for each agent in agents.json,
//   agent-replies, order-wakeups: main.bicep's serviceBusQueueNames), never the namespace
//                    Azure Service Bus Data Sender   scheduler sends requests and wake-ups, agents replies
//                    Azure Service Bus Data Receiver agents take requests, scheduler replies and wake-ups
//                                                    (and the queue's $DeadLetterQueue)
//                    Azure Service Bus Data Owner    only with serviceBusTargetScaling: the
//                                                    scale controller reads queue length
//   App Insights     Monitoring Metrics Publisher    Entra-authenticated telemetry ingestion
// Alerts identity:
//   workspace        Log Analytics Reader            the operator alert rule's query
// Deploying user: by default only, with a principalId,
//   the state table     Storage Table Data Reader      the deploy guard reads the orders in
//                                                      flight (infra/hooks/deploy-check.sh);
//                                                      read-only, its reads logged
// and nothing more. Only with grantDeployerDataAccess and a
// principalId (for a local run or debugging against the deployed resources, and the
// Service Bus contract tests; off again with the next deployment without it):
//   storage account  Storage Blob Data Owner, Storage Queue Data Contributor and
//                    Storage Table Data Contributor
//   namespace        Data Sender and Data Receiver (namespace-wide: the
//                    contract tests may use their own queues)
//
// The queue and table roles stay account-wide: replyTo names any queue the submitting
// application chose, the app creates missing poison queues, and the Functions host
// creates a diagnostic-event table each month. The blob containers are all known in
// advance (storage.bicep creates the host's two), so no blob role needs the account.

param storageAccountName string

@description('The order state table (OrderState): the deploy guard reads it.')
param stateTableName string

@description('Blob containers the app identity owns: the deployment package and the Functions host\'s own (storage.bicep creates them all).')
param appOwnedContainerNames array

@description('The orders archive container, which the app reads and writes (contract 3.12).')
param archiveContainerName string

param serviceBusNamespaceName string
param serviceBusQueueNames array
param appInsightsName string
param workspaceName string

param appPrincipalId string
param alertsPrincipalId string

@description('Object id of the deploying user or CI principal; empty to grant nothing.')
param principalId string = ''

@allowed([
  'User'
  'ServicePrincipal'
])
param principalType string = 'User'

@description('Grant principalId the data roles on the storage account and the Service Bus namespace (read, write and delete every order, message and blob), for a local run or debugging against the deployed resources. Off: whoever deploys keeps no standing data access.')
param grantDeployerDataAccess bool = false

@description('Grant principalId Storage Table Data Reader on the state table only, so that the deploy guard can read the orders in flight before a deployment (read-only; the reads are logged). Off: the guard says NOT CHECKED.')
param deployerReadsState bool = true

@description('Grant the app identity Azure Service Bus Data Owner on each agent queue, so that target-based scaling can read the queue lengths (docs/deployment.md). Off: Send and Listen only, and the agents scale incrementally.')
param serviceBusTargetScaling bool = false

var roles = loadJsonContent('roles.json')

// The app's account-wide storage roles: queues and tables only (the blob roles are
// per container, below).
var appStorageRoleIds = [
  roles['Storage Queue Data Contributor']
  roles['Storage Table Data Contributor']
]

// The deploying user's, for local runs and tests against the account, when asked for.
var userStorageRoleIds = [
  roles['Storage Blob Data Owner']
  roles['Storage Queue Data Contributor']
  roles['Storage Table Data Contributor']
]
var grantsDeployer = grantDeployerDataAccess && !empty(principalId)
var readsState = deployerReadsState && !empty(principalId)

var serviceBusRoleIds = [
  roles['Azure Service Bus Data Sender']
  roles['Azure Service Bus Data Receiver']
]


resource storage 'Microsoft.Storage/storageAccounts@2023-05-01' existing = {
  name: storageAccountName
}

resource tableService 'Microsoft.Storage/storageAccounts/tableServices@2023-05-01' existing = {
  parent: storage
  name: 'default'
}

resource stateTable 'Microsoft.Storage/storageAccounts/tableServices/tables@2023-05-01' existing = {
  parent: tableService
  name: stateTableName
}

resource blobService 'Microsoft.Storage/storageAccounts/blobServices@2023-05-01' existing = {
  parent: storage
  name: 'default'
}

resource ownedContainers 'Microsoft.Storage/storageAccounts/blobServices/containers@2023-05-01' existing = [
  for containerName in appOwnedContainerNames: {
    parent: blobService
    name: containerName
  }
]

resource archiveContainer 'Microsoft.Storage/storageAccounts/blobServices/containers@2023-05-01' existing = {
  parent: blobService
  name: archiveContainerName
}

resource namespace 'Microsoft.ServiceBus/namespaces@2024-01-01' existing = {
  name: serviceBusNamespaceName
}

resource agentQueues 'Microsoft.ServiceBus/namespaces/queues@2024-01-01' existing = [
  for queueName in serviceBusQueueNames: {
    parent: namespace
    name: queueName
  }
]

resource appInsights 'Microsoft.Insights/components@2020-02-02' existing = {
  name: appInsightsName
}

resource workspace 'Microsoft.OperationalInsights/workspaces@2023-09-01' existing = {
  name: workspaceName
}

/* Storage Blob Data Owner, the role Microsoft documents for the Functions host's
   storage, on each container the app and the platform write to: the Flex Consumption
   deployment package (the platform reads and writes it with this identity) and the
   host's two containers. Nothing else in the account is reachable with it. */
resource appOwnedBlobs 'Microsoft.Authorization/roleAssignments@2022-04-01' = [
  for i in range(0, length(appOwnedContainerNames)): {
    name: guid(ownedContainers[i].id, appPrincipalId, roles['Storage Blob Data Owner'])
    scope: ownedContainers[i]
    properties: {
      principalId: appPrincipalId
      principalType: 'ServicePrincipal'
      roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles['Storage Blob Data Owner'])
    }
  }
]

// The archive: the retention timer writes one blob per run, a restore reads it back.
resource appArchive 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(archiveContainer.id, appPrincipalId, roles['Storage Blob Data Contributor'])
  scope: archiveContainer
  properties: {
    principalId: appPrincipalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles['Storage Blob Data Contributor'])
  }
}

resource appStorage 'Microsoft.Authorization/roleAssignments@2022-04-01' = [
  for roleId in appStorageRoleIds: {
    name: guid(storage.id, appPrincipalId, roleId)
    scope: storage
    properties: {
      principalId: appPrincipalId
      principalType: 'ServicePrincipal'
      roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roleId)
    }
  }
]

resource appSender 'Microsoft.Authorization/roleAssignments@2022-04-01' = [
  for i in range(0, length(serviceBusQueueNames)): {
    name: guid(agentQueues[i].id, appPrincipalId, roles['Azure Service Bus Data Sender'])
    scope: agentQueues[i]
    properties: {
      principalId: appPrincipalId
      principalType: 'ServicePrincipal'
      roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles['Azure Service Bus Data Sender'])
    }
  }
]

resource appReceiver 'Microsoft.Authorization/roleAssignments@2022-04-01' = [
  for i in range(0, length(serviceBusQueueNames)): {
    name: guid(agentQueues[i].id, appPrincipalId, roles['Azure Service Bus Data Receiver'])
    scope: agentQueues[i]
    properties: {
      principalId: appPrincipalId
      principalType: 'ServicePrincipal'
      roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles['Azure Service Bus Data Receiver'])
    }
  }
]

/* Off by default: Data Sender and Data Receiver are all the app's code needs. Target-based
   scaling reads each queue's runtime properties (active and dead-letter counts), which
   needs the Manage right; with Send and Listen only the scale controller logs
   "unauthorized access" and scales incrementally (Azure/Azure-Functions#2379). Data Owner
   is the only built-in Service Bus role with Manage, and Manage also lets its holder
   change, purge or delete the queue: serviceBusTargetScaling grants it, on the agent
   queues only, never the namespace (docs/deployment.md, "Identity model and roles"). */
resource appQueueOwner 'Microsoft.Authorization/roleAssignments@2022-04-01' = [
  for i in range(0, length(serviceBusQueueNames)): if (serviceBusTargetScaling) {
    name: guid(agentQueues[i].id, appPrincipalId, roles['Azure Service Bus Data Owner'])
    scope: agentQueues[i]
    properties: {
      principalId: appPrincipalId
      principalType: 'ServicePrincipal'
      roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles['Azure Service Bus Data Owner'])
    }
  }
]

resource appTelemetry 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(appInsights.id, appPrincipalId, roles['Monitoring Metrics Publisher'])
  scope: appInsights
  properties: {
    principalId: appPrincipalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles['Monitoring Metrics Publisher'])
  }
}

resource alertsQuery 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(workspace.id, alertsPrincipalId, roles['Log Analytics Reader'])
  scope: workspace
  properties: {
    principalId: alertsPrincipalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles['Log Analytics Reader'])
  }
}

resource userStorage 'Microsoft.Authorization/roleAssignments@2022-04-01' = [
  for roleId in userStorageRoleIds: if (grantsDeployer) {
    name: guid(storage.id, principalId, roleId)
    scope: storage
    properties: {
      principalId: principalId
      principalType: principalType
      roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roleId)
    }
  }
]

resource userServiceBus 'Microsoft.Authorization/roleAssignments@2022-04-01' = [
  for roleId in serviceBusRoleIds: if (grantsDeployer) {
    name: guid(namespace.id, principalId, roleId)
    scope: namespace
    properties: {
      principalId: principalId
      principalType: principalType
      roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roleId)
    }
  }
]

// The deploy guard's read of the orders in flight: the state table, read-only.
resource userReadsState 'Microsoft.Authorization/roleAssignments@2022-04-01' = if (readsState) {
  name: guid(stateTable.id, principalId, roles['Storage Table Data Reader'])
  scope: stateTable
  properties: {
    principalId: principalId
    principalType: principalType
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles['Storage Table Data Reader'])
  }
}
