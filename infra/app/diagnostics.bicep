// Diagnostic settings: the data-plane logs (and the metrics) of the storage account, its
// blob, queue and table services, the Service Bus namespace and the Function App, sent
// to the Log Analytics workspace (monitoring.bicep), where they sit beside the app's own
// telemetry: who read, wrote or deleted what, with which identity, from which address.
//
// What each one sends, and why not more:
//   storage account   Transaction metrics (the account has no logs of its own)
//   blob service      StorageRead, StorageWrite, StorageDelete: the deployment package,
//                     the host's keys and locks and the orders archive are read rarely,
//                     and each read of them is worth a record
//   queue service     StorageRead, StorageWrite, StorageDelete: every send, every
//                     message read or taken off
//   table service     StorageRead, StorageWrite, StorageDelete: every read and change
//                     of the state store
//     (Reads of queues and tables are the bulk of the ingestion: the host polls its
//     queues and the timers read the state store many times a minute. They are logged
//     all the same: orders' data read by an identity that holds data access is what an
//     audit asks about first. docs/deployment.md, "Diagnostic settings", says what they
//     cost and how to keep them shorter.)
//   Service Bus       allLogs (operational logs; on Premium also the runtime audit logs of
//                     every send and receive) and AllMetrics
//   Function App      FunctionAppLogs (the host's own record, written by the platform even
//                     when the app's telemetry cannot reach Application Insights) and
//                     AppServiceAuthenticationLogs (sign-ins, when sign-in is on), AllMetrics
// docs/deployment.md, "Diagnostic settings", says where to find them.

param storageAccountName string
param serviceBusNamespaceName string
param functionAppName string

@description('Resource id of the Log Analytics workspace that receives them.')
param workspaceId string

var settingName = 'to-log-analytics'
var storageDataPlaneLogs = [
  {
    category: 'StorageRead'
    enabled: true
  }
  {
    category: 'StorageWrite'
    enabled: true
  }
  {
    category: 'StorageDelete'
    enabled: true
  }
]
var allMetrics = [
  {
    category: 'AllMetrics'
    enabled: true
  }
]

resource storage 'Microsoft.Storage/storageAccounts@2023-05-01' existing = {
  name: storageAccountName
}

resource blobService 'Microsoft.Storage/storageAccounts/blobServices@2023-05-01' existing = {
  parent: storage
  name: 'default'
}

resource queueService 'Microsoft.Storage/storageAccounts/queueServices@2023-05-01' existing = {
  parent: storage
  name: 'default'
}

resource tableService 'Microsoft.Storage/storageAccounts/tableServices@2023-05-01' existing = {
  parent: storage
  name: 'default'
}

resource namespace 'Microsoft.ServiceBus/namespaces@2024-01-01' existing = {
  name: serviceBusNamespaceName
}

resource site 'Microsoft.Web/sites@2024-04-01' existing = {
  name: functionAppName
}

resource storageDiagnostics 'Microsoft.Insights/diagnosticSettings@2021-05-01-preview' = {
  name: settingName
  scope: storage
  properties: {
    workspaceId: workspaceId
    metrics: [
      {
        category: 'Transaction'
        enabled: true
      }
    ]
  }
}

resource blobDiagnostics 'Microsoft.Insights/diagnosticSettings@2021-05-01-preview' = {
  name: settingName
  scope: blobService
  properties: {
    workspaceId: workspaceId
    logs: storageDataPlaneLogs
  }
}

resource queueDiagnostics 'Microsoft.Insights/diagnosticSettings@2021-05-01-preview' = {
  name: settingName
  scope: queueService
  properties: {
    workspaceId: workspaceId
    logs: storageDataPlaneLogs
  }
}

resource tableDiagnostics 'Microsoft.Insights/diagnosticSettings@2021-05-01-preview' = {
  name: settingName
  scope: tableService
  properties: {
    workspaceId: workspaceId
    logs: storageDataPlaneLogs
  }
}

resource serviceBusDiagnostics 'Microsoft.Insights/diagnosticSettings@2021-05-01-preview' = {
  name: settingName
  scope: namespace
  properties: {
    workspaceId: workspaceId
    logs: [
      {
        categoryGroup: 'allLogs'
        enabled: true
      }
    ]
    metrics: allMetrics
  }
}

resource siteDiagnostics 'Microsoft.Insights/diagnosticSettings@2021-05-01-preview' = {
  name: settingName
  scope: site
  properties: {
    workspaceId: workspaceId
    logs: [
      {
        category: 'FunctionAppLogs'
        enabled: true
      }
      {
        category: 'AppServiceAuthenticationLogs'
        enabled: true
      }
    ]
    metrics: allMetrics
  }
}
