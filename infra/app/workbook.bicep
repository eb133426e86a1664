// The operators' workbook: the figures of the console's dashboard in the portal, for
// people who never open the console (docs/operating.md, "Observability"). Its content is
// workbook.json (the workbook schema, Notebook/1.0), kept as a file so that a review
// reads its queries; tests/infra/test_workbook.py checks every metric name and custom
// dimension they read against what the app emits. Its placeholders name the resources
// it charts, filled in here.

@description('Name shown in the portal (Monitor > Workbooks, and the Application Insights component\'s Workbooks).')
param displayName string
param location string
param tags object

@description('Application Insights component the queries read; the workbook is linked to it (sourceId).')
param appInsightsId string

@description('Service Bus namespace whose queue metrics it charts (ActiveMessages, DeadletteredMessages per queue).')
param serviceBusNamespaceId string

@description('Storage account whose queue service metric it charts (QueueMessageCount).')
param storageAccountId string

var content = loadTextContent('workbook.json')
var withAppInsights = replace(content, '<APP_INSIGHTS_ID>', appInsightsId)
var withServiceBus = replace(withAppInsights, '<SERVICE_BUS_NAMESPACE_ID>', serviceBusNamespaceId)
var serializedData = replace(withServiceBus, '<STORAGE_QUEUE_SERVICE_ID>', '${storageAccountId}/queueServices/default')

resource workbook 'Microsoft.Insights/workbooks@2023-06-01' = {
  // A workbook's name must be a GUID: one per resource group, the same on every
  // deployment, so `azd provision` updates it in place.
  name: guid(resourceGroup().id, 'orders-workbook')
  location: location
  tags: tags
  kind: 'shared'
  properties: {
    displayName: displayName
    category: 'workbook'
    version: 'Notebook/1.0'
    serializedData: serializedData
    // The portal lists a workbook under the resource named here (compared in lower case).
    sourceId: toLower(appInsightsId)
  }
}

output id string = workbook.id
output name string = workbook.name
