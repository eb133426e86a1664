// User-assigned managed identities.
//
// `app` is the Function App's only identity: it reads and writes the state
// table, the Storage queues and the deployment container, sends and receives
// on the Service Bus queues and publishes telemetry. Nothing else uses it.
//
// `alerts` is the identity the log search alert rule queries the workspace
// with. It is separate on purpose: the app writes telemetry and has no reason
// to read it back, and the alert rule has no reason to touch order data.
// A user-assigned identity (rather than system-assigned) lets the role
// assignments be created before the resources that use them, so the first
// start of the app and the first evaluation of the rule already have access.

param appIdentityName string
param alertsIdentityName string
param location string
param tags object

resource app 'Microsoft.ManagedIdentity/userAssignedIdentities@2023-01-31' = {
  name: appIdentityName
  location: location
  tags: tags
}

resource alerts 'Microsoft.ManagedIdentity/userAssignedIdentities@2023-01-31' = {
  name: alertsIdentityName
  location: location
  tags: tags
}

output appIdentityId string = app.id
output appIdentityName string = app.name
output appClientId string = app.properties.clientId
output appPrincipalId string = app.properties.principalId
output alertsIdentityId string = alerts.id
output alertsPrincipalId string = alerts.properties.principalId
