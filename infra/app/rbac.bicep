// Every role assignment of the deployment, least privilege, data roles only
// (Service Bus Data Owner, on the agent queues, is the one that also carries
// management rights: see appQueueOwner). The built-in role ids, with their names,
// are in roles.json.
//
// App identity (principalType ServicePrincipal):
//   storage account  Storage Blob Data Owner         host leases/locks, deployment package
//                    Storage Queue Data Contributor  orders, replyTo, alert and poison queues
//                    Storage Table Data Contributor  OrderState, host diagnostic-event tables
//   each agent queue (agent-requests, agent-requests-<agent> for each agent in
//   agents.json, agent-replies: main.bicep's serviceBusQueueNames)
//                    Azure Service Bus Data Sender   scheduler sends requests, agents replies
//                    Azure Service Bus Data Receiver agents take requests, scheduler replies
//                                                    (and the queue's $DeadLetterQueue)
//                    Azure Service Bus Data Owner    the scale controller reads queue length
//   App Insights     Monitoring Metrics Publisher    Entra-authenticated telemetry ingestion
// Alerts identity:
//   workspace        Log Analytics Reader            the operator alert rule's query
// Deploying user (only when principalId is given, so local runs and the
// Service Bus contract tests can reach the deployed resources):
//   storage account  the same three storage roles
//   namespace        Data Sender and Data Receiver (namespace-wide: the
//                    contract tests may use their own queues)
//
// The storage roles are account-wide, not per table or queue, because the
// Functions host creates its own containers, poison queues and diagnostic
// tables, and replyTo names any queue the submitting application chose.

param storageAccountName string
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

var roles = loadJsonContent('roles.json')

var storageRoleIds = [
  roles['Storage Blob Data Owner']
  roles['Storage Queue Data Contributor']
  roles['Storage Table Data Contributor']
]

var serviceBusRoleIds = [
  roles['Azure Service Bus Data Sender']
  roles['Azure Service Bus Data Receiver']
]

var userStorageRoleIds = empty(principalId) ? [] : storageRoleIds
var userServiceBusRoleIds = empty(principalId) ? [] : serviceBusRoleIds

resource storage 'Microsoft.Storage/storageAccounts@2023-05-01' existing = {
  name: storageAccountName
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

resource appStorage 'Microsoft.Authorization/roleAssignments@2022-04-01' = [
  for roleId in storageRoleIds: {
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

/* Target-based scaling reads each queue's runtime properties (active and dead-letter
   counts), which needs the Manage right; with Send and Listen only, the scale controller
   logs "unauthorized access" and falls back to incremental scaling, one instance at a
   time (Azure/Azure-Functions#2379). Data Owner is the only built-in Service Bus role with
   Manage, so it is granted here on the agent queues only, never on the namespace.
   docs/deployment.md says what it allows there. */
resource appQueueOwner 'Microsoft.Authorization/roleAssignments@2022-04-01' = [
  for i in range(0, length(serviceBusQueueNames)): {
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
  for roleId in userStorageRoleIds: {
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
  for roleId in userServiceBusRoleIds: {
    name: guid(namespace.id, principalId, roleId)
    scope: namespace
    properties: {
      principalId: principalId
      principalType: principalType
      roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roleId)
    }
  }
]
