// Log Analytics workspace and workspace-based Application Insights.
//
// Local authentication is off on both: the instrumentation key in the
// connection string no longer authorises ingestion, only a Microsoft Entra
// token does (the app's identity holds Monitoring Metrics Publisher on the
// component; APPLICATIONINSIGHTS_AUTHENTICATION_STRING tells the host which
// identity to use). Python ERROR records land in `traces` / `AppTraces` with
// severityLevel 3, which the operator alert rule (alerts.bicep) queries.

param workspaceName string
param appInsightsName string
param location string
param tags object

@description('Days the workspace keeps logs. 30 is included in the ingestion price.')
@minValue(30)
@maxValue(730)
param retentionInDays int = 30

resource workspace 'Microsoft.OperationalInsights/workspaces@2023-09-01' = {
  name: workspaceName
  location: location
  tags: tags
  properties: {
    sku: {
      name: 'PerGB2018'
    }
    retentionInDays: retentionInDays
    features: {
      disableLocalAuth: true
      enableLogAccessUsingOnlyResourcePermissions: true
    }
    publicNetworkAccessForIngestion: 'Enabled'
    publicNetworkAccessForQuery: 'Enabled'
  }
}

resource appInsights 'Microsoft.Insights/components@2020-02-02' = {
  name: appInsightsName
  location: location
  tags: tags
  kind: 'web'
  properties: {
    Application_Type: 'web'
    WorkspaceResourceId: workspace.id
    IngestionMode: 'LogAnalytics'
    DisableLocalAuth: true
    publicNetworkAccessForIngestion: 'Enabled'
    publicNetworkAccessForQuery: 'Enabled'
  }
}

output workspaceId string = workspace.id
output workspaceName string = workspace.name
output appInsightsId string = appInsights.id
output appInsightsName string = appInsights.name
// Not a secret: with DisableLocalAuth the instrumentation key it carries
// identifies the component but cannot be used to send data.
output appInsightsConnectionString string = appInsights.properties.ConnectionString
