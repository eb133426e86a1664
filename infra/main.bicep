// Order supervisor: everything `azd up` creates, in one resource group.
// Layout and parameter names follow the Azure-Samples azd templates.
// Nothing here holds or emits a key, a SAS or a connection string with a
// secret: every client authenticates with Microsoft Entra ID.

targetScope = 'subscription'

@minLength(1)
@maxLength(64)
@description('Name of the azd environment; also seeds the unique suffix of every resource name.')
param environmentName string

@minLength(1)
@description('Region for all resources. It must offer the Flex Consumption plan.')
@metadata({
  azd: {
    type: 'location'
  }
})
param location string

@description('Object id of the deploying user (azd sets AZURE_PRINCIPAL_ID). It gets data roles only with grantDeployerDataAccess.')
param principalId string = ''

@allowed([
  'User'
  'ServicePrincipal'
])
@description('Kind of principal principalId is: User from a workstation, ServicePrincipal from CI.')
param principalType string = 'User'

@description('Grant principalId the app\'s data roles (storage account and Service Bus namespace), for a local run or debugging against the deployed resources and the Service Bus contract tests (GRANT_DEPLOYER_DATA_ACCESS=true). Off by default: whoever deploys keeps no standing access to the orders\' data.')
param grantDeployerDataAccess bool = false

@description('Grant principalId Storage Table Data Reader on the state table only, for the deploy guard to read the orders in flight (DEPLOYER_READS_STATE; read-only, its reads logged). Off: the guard says NOT CHECKED.')
param deployerReadsState bool = true

@minLength(3)
@description('Email address that receives operator and dead-letter alerts.')
param alertEmail string

@minLength(8)
@description('Base URL of the remote services the agents call (REMOTE_SERVICE_URL, contract 3.4).')
param remoteServiceUrl string

@description('Per-agent base URLs: an object mapping an agent\'s name (infra/agents.json) to the URL it calls, e.g. {"carrier": "https://carrier.example.com"}; it becomes the app setting AGENT_<NAME>_URL. An http agent not named here gets remoteServiceUrl. Names of no declared agent are ignored.')
param agentUrls object = {}

@description('Key Vault secret URIs of the ApiKey agents\' keys: an object mapping an agent\'s name to the URI of its secret (https://<vault>.vault.azure.net/secrets/<name>, best without a version), emitted as the Key Vault reference @Microsoft.KeyVault(SecretUri=...) in AGENT_<NAME>_API_KEY, resolved with the app\'s identity. Never a key itself. An ApiKey agent missing here gets no setting: add it before the agent runs (docs/deployment.md).')
param agentApiKeySecretUris object = {}

@minValue(1)
@maxValue(270)
@description('STEP_TIMEOUT_SECONDS: default deadline of a step, from claim to CompleteBy. At most 270: an agent invocation lasts up to a step\'s timeout, and host.json renews a Service Bus message lock for 5 minutes at most (maxAutoLockRenewalDuration; functionTimeout is 10 minutes), so a longer step would be delivered twice. The app refuses more.')
param stepTimeoutSeconds int = 30

@minValue(1)
@description('MAX_FAILURE_COUNT: failed attempts before a step goes to Error and an operator is alerted.')
param maxFailureCount int = 5

@minLength(11)
@description('SUPERVISOR_SCHEDULE: NCRONTAB (six fields) of the supervisor sweep.')
param supervisorSchedule string = '*/10 * * * * *'

@minValue(1)
@maxValue(604800)
@description('DEFERRAL_WINDOW_SECONDS: how long a step may keep waiting for its remote service (circuit open, Retry-After, the service down for everyone) before it fails for good. Outages shorter than this end without an operator alert. At most 7 days.')
param deferralWindowSeconds int = 1800

@minValue(1)
@maxValue(300)
@description('MAX_CLOCK_SKEW_SECONDS: how far apart two instances\' clocks may be. A step in doubt is not undone before its last attempt\'s deadline plus this has passed on every clock.')
param maxClockSkewSeconds int = 10

@minValue(1)
@maxValue(86400)
@description('OUTAGE_ALERT_SECONDS: when every call to an agent\'s remote has failed for this long, one operator alert (kind outage) tells of it for the agent, and one more (kind recovered) when it answers again, however many instances run; the orders that wait get none. At most a day.')
param outageAlertSeconds int = 300

@description('RETENTION: how long finished orders stay in the state table before the retention timer archives them to the orders-archive container and deletes them: comma-separated [workflow/]status=duration (s, m, h, d). error orders (waiting for an operator) go 180 days after their last change; a status no rule names stays for ever.')
param retention string = 'completed=30d,compensated=90d,cancelled=90d,error=180d'

@minLength(11)
@description('RETENTION_SCHEDULE: NCRONTAB (six fields) of the retention timer.')
param retentionSchedule string = '0 */15 * * * *'

@minValue(1)
@maxValue(100000)
@description('RETENTION_BATCH: orders archived per retention run at most; the next run goes on where it stopped.')
param retentionBatch int = 1000

@description('DASHBOARD_SCHEDULE: NCRONTAB (six fields) of the dashboard timer (figures and the stuck check).')
param dashboardSchedule string = '30 * * * * *'

@minValue(1)
@maxValue(604800)
@description('STUCK_FLOOR_SECONDS: a step is stuck past its p99 over the last day and never under this.')
param stuckFloorSeconds int = 300

@minValue(1)
@maxValue(36500)
@description('KEPT_DAYS: how long a message kept for an operator (an order or agent message too large to quote in its rejection record or alert) stays in the state table; then the retention timer archives it to orders-archive/_kept/ and deletes it.')
param keptDays int = 30

@minValue(1)
@description('Days after which archived orders (blobs in orders-archive) move to the cool tier.')
param archiveCoolAfterDays int = 30

@minValue(1)
@description('Days after which archived orders are deleted from orders-archive for good. Must be more than archiveCoolAfterDays.')
param archiveDeleteAfterDays int = 730

@description('REPLY_QUEUES: the Storage queues an order\'s replyTo may name, comma-separated; an entry ending in * is a prefix (shop-status,partner-*). Empty: no status messages, and an order naming a replyTo is rejected. The app\'s own queues are never allowed, and it never creates a replyTo queue.')
param replyQueues string = ''

@description('CONSOLE_READ_ONLY: when true the operator console (GET /api/console) only shows orders; it hides every action and the app refuses them, whoever signs in. False lets a signed-in person with the Orders.Operator role act from it.')
param consoleReadOnly bool = false

@maxLength(36)
@description('Client id of the Microsoft Entra app registration people sign in to (App Service authentication, "Easy Auth"), with the app roles Orders.Reader and Orders.Operator (infra/app-roles.json) that decide who may read and who may change orders and agents, on the console and the operator API. Empty (the default) turns sign-in off: the console is closed and the function key alone guards the API. See infra/app/auth.bicep and docs/deployment.md, "Sign-in and roles".')
param authClientId string = ''

@description('Tenant of that app registration; empty means the deployment\'s tenant.')
param authTenantId string = tenant().tenantId

@allowed([
  'Standard'
  'Premium'
])
@description('Service Bus tier. Standard has duplicate detection at a small base charge; Premium adds isolation and zones at a fixed price per messaging unit. With vnetEnabled the namespace is Premium whatever this says: Service Bus private endpoints need Premium.')
param serviceBusSku string = 'Standard'

@description('Close the storage account and the Service Bus namespace to the internet: a virtual network with private endpoints and private DNS zones for blob, queue, table and Service Bus, the Function App integrated with its delegated subnet, and public network access off on the storage account and the namespace. Forces Service Bus Premium (private endpoints need it). The Function App itself (the operator API and console) stays reachable over HTTPS. Off by default (docs/deployment.md, "Private network").')
param vnetEnabled bool = false

@description('Target-based scaling for the agents: grants the app identity Azure Service Bus Data Owner on each agent queue (never the namespace) so the scale controller can read the queue lengths. Off (the default), the app holds Data Sender and Data Receiver only, all its code needs, and the agent functions scale out incrementally under a burst. Data Owner also lets the identity change, purge or delete those queues (docs/deployment.md).')
param serviceBusTargetScaling bool = false

@allowed([
  512
  2048
  4096
])
@description('Memory of each Flex Consumption instance; CPU is allocated in proportion (2048 MB = 1 vCPU).')
param instanceMemoryMB int = 2048

@minValue(1)
@maxValue(1000)
@description('Most instances the app may scale out to.')
param maximumInstanceCount int = 40

@description('Spread the app\'s instances over availability zones. Off by default: on Flex Consumption it makes the platform keep at least two always-ready instances per function scale group, billed around the clock (docs/deployment.md). Needs a region with zones.')
param zoneRedundant bool = false

var abbrs = loadJsonContent('abbreviations.json')
// azd passes an unset AZURE_AUTH_TENANT_ID as '' rather than leaving the default.
var signInTenantId = empty(authTenantId) ? tenant().tenantId : authTenantId
var resourceToken = toLower(uniqueString(subscription().id, environmentName, location))
var tags = {
  'azd-env-name': environmentName
}

// The declared agents (declarations/), generated by `python -m admin agents-json
// --write`: never edit agents.json by hand. Each agent has its own request queue
// (agent-requests-<agent>, on Service Bus), its Storage poison queue, the app
// identity's roles on the queue (rbac.bicep) and its app settings (function-app.bicep).
var agents = loadJsonContent('agents.json').agents
var agentQueueNames = [for agent in agents: agent.queue]
var agentPoisonQueueNames = [for agent in agents: agent.poisonQueue]

// Queue and table names: these are core/names.py, and tests/infra checks that
// the two agree. The agent queues live on Service Bus (AGENT_TRANSPORT =
// servicebus), so they are not created as Storage queues.
var stateTableName = 'OrderState'
var archiveContainerName = 'orders-archive'
// The Functions host's own containers in AzureWebJobsStorage (its locks, its keys):
// created by storage.bicep so that the app's blob role is scoped to them (rbac.bicep).
var hostContainerNames = [
  'azure-webjobs-hosts'
  'azure-webjobs-secrets'
]
var storageQueueNames = concat([
  'orders'
  'orders-rejected'
  'operator-alerts'
  'order-dispatch'
  // Poison queues: the app alerts an operator on each message that lands in one, so
  // they exist from the start. The agent queues' poison queues are Storage queues too.
  'orders-poison'
  'order-dispatch-poison'
  'agent-replies-poison'
], agentPoisonQueueNames)
// The request queues: one per agent (the shared agent-requests of versions before
// agents is no longer deployed; docs/operating.md, "Upgrading"). What expires in them unread is
// dead-lettered and reported as not called (servicebus.bicep).
var serviceBusRequestQueueNames = agentQueueNames
// order-wakeups: an order's wake-ups at a time (a delay's end, a retry after its
// backoff) as scheduled messages, pushed to wake_order when due (messaging/dispatch.py).
var serviceBusQueueNames = concat(serviceBusRequestQueueNames, [
  'agent-replies'
  'order-wakeups'
])

var functionAppName = '${abbrs.webSitesFunctions}orders-${resourceToken}'
// Service Bus private endpoints exist on Premium only: vnetEnabled forces it.
var effectiveServiceBusSku = vnetEnabled ? 'Premium' : serviceBusSku
// Container names: 3-63 lowercase letters, digits and hyphens.
var deploymentContainerName = 'app-package-${take(resourceToken, 12)}'

resource rg 'Microsoft.Resources/resourceGroups@2024-03-01' = {
  name: '${abbrs.resourcesResourceGroups}${environmentName}'
  location: location
  tags: tags
}

module identity 'app/identity.bicep' = {
  name: 'identity'
  scope: rg
  params: {
    appIdentityName: '${abbrs.managedIdentityUserAssignedIdentities}orders-${resourceToken}'
    alertsIdentityName: '${abbrs.managedIdentityUserAssignedIdentities}alerts-${resourceToken}'
    location: location
    tags: tags
  }
}

module storage 'app/storage.bicep' = {
  name: 'storage'
  scope: rg
  params: {
    name: '${abbrs.storageStorageAccounts}${resourceToken}'
    location: location
    tags: tags
    deploymentContainerName: deploymentContainerName
    tableName: stateTableName
    queueNames: storageQueueNames
    archiveContainerName: archiveContainerName
    hostContainerNames: hostContainerNames
    archiveCoolAfterDays: archiveCoolAfterDays
    archiveDeleteAfterDays: archiveDeleteAfterDays
    publicNetworkAccess: vnetEnabled ? 'Disabled' : 'Enabled'
  }
}

module serviceBus 'app/servicebus.bicep' = {
  name: 'servicebus'
  scope: rg
  params: {
    name: '${abbrs.serviceBusNamespaces}${resourceToken}'
    location: location
    tags: tags
    skuName: effectiveServiceBusSku
    queueNames: serviceBusQueueNames
    publicNetworkAccess: vnetEnabled ? 'Disabled' : 'Enabled'
  }
}

// The private network (vnetEnabled): the app's subnet, the private endpoints of the
// storage services and the namespace, and their private DNS zones (app/network.bicep).
module network 'app/network.bicep' = if (vnetEnabled) {
  name: 'network'
  scope: rg
  params: {
    vnetName: '${abbrs.networkVirtualNetworks}${resourceToken}'
    location: location
    tags: tags
    nameSuffix: resourceToken
    storageAccountName: storage.outputs.name
    serviceBusNamespaceName: serviceBus.outputs.name
  }
}

module monitoring 'app/monitoring.bicep' = {
  name: 'monitoring'
  scope: rg
  params: {
    workspaceName: '${abbrs.operationalInsightsWorkspaces}${resourceToken}'
    appInsightsName: '${abbrs.insightsComponents}${resourceToken}'
    location: location
    tags: tags
  }
}

module rbac 'app/rbac.bicep' = {
  name: 'rbac'
  scope: rg
  params: {
    storageAccountName: storage.outputs.name
    stateTableName: storage.outputs.tableName
    // The blob containers the app identity may use, each with its own role: the
    // deployment package and the host's own (Data Owner), the archive (Data Contributor).
    appOwnedContainerNames: concat([
      deploymentContainerName
    ], hostContainerNames)
    archiveContainerName: archiveContainerName
    serviceBusNamespaceName: serviceBus.outputs.name
    serviceBusQueueNames: serviceBusQueueNames
    appInsightsName: monitoring.outputs.appInsightsName
    workspaceName: monitoring.outputs.workspaceName
    appPrincipalId: identity.outputs.appPrincipalId
    alertsPrincipalId: identity.outputs.alertsPrincipalId
    principalId: principalId
    principalType: principalType
    grantDeployerDataAccess: grantDeployerDataAccess
    deployerReadsState: deployerReadsState
    serviceBusTargetScaling: serviceBusTargetScaling
  }
}

module functionApp 'app/function-app.bicep' = {
  name: 'function-app'
  scope: rg
  // The identity's roles exist before the app starts, so its first run can
  // already read the deployment package and its queues.
  dependsOn: [
    rbac
  ]
  params: {
    name: functionAppName
    planName: '${abbrs.webServerFarms}${resourceToken}'
    location: location
    tags: tags
    identityId: identity.outputs.appIdentityId
    identityClientId: identity.outputs.appClientId
    storageAccountName: storage.outputs.name
    deploymentContainerName: deploymentContainerName
    serviceBusFullyQualifiedNamespace: serviceBus.outputs.fullyQualifiedNamespace
    appInsightsName: monitoring.outputs.appInsightsName
    remoteServiceUrl: remoteServiceUrl
    agents: agents
    agentUrls: agentUrls
    agentApiKeySecretUris: agentApiKeySecretUris
    stepTimeoutSeconds: stepTimeoutSeconds
    maxFailureCount: maxFailureCount
    supervisorSchedule: supervisorSchedule
    deferralWindowSeconds: deferralWindowSeconds
    maxClockSkewSeconds: maxClockSkewSeconds
    outageAlertSeconds: outageAlertSeconds
    consoleReadOnly: consoleReadOnly
    signInClientId: authClientId
    replyQueues: replyQueues
    retention: retention
    retentionSchedule: retentionSchedule
    retentionBatch: retentionBatch
    archiveDays: archiveDeleteAfterDays
    keptDays: keptDays
    dashboardSchedule: dashboardSchedule
    stuckFloorSeconds: stuckFloorSeconds
    instanceMemoryMB: instanceMemoryMB
    maximumInstanceCount: maximumInstanceCount
    zoneRedundant: zoneRedundant
    // With vnetEnabled the app starts after its network, endpoints and DNS exist.
    virtualNetworkSubnetId: vnetEnabled ? network.outputs.appSubnetId : ''
  }
}

// Diagnostic settings of the storage account and its services, the Service Bus
// namespace and the Function App, into the Log Analytics workspace (app/diagnostics.bicep).
module diagnostics 'app/diagnostics.bicep' = {
  name: 'diagnostics'
  scope: rg
  params: {
    storageAccountName: storage.outputs.name
    serviceBusNamespaceName: serviceBus.outputs.name
    functionAppName: functionApp.outputs.name
    workspaceId: monitoring.outputs.workspaceId
  }
}

// Sign-in with Microsoft Entra ID (App Service authentication) for the console and
// the operator API, only when an app registration is given; its app roles decide who
// may do what (app/auth.bicep says what the registration needs).
module auth 'app/auth.bicep' = if (!empty(authClientId)) {
  name: 'function-app-auth'
  scope: rg
  params: {
    functionAppName: functionApp.outputs.name
    clientId: authClientId
    tenantId: signInTenantId
  }
}

module alerts 'app/alerts.bicep' = {
  name: 'alerts'
  scope: rg
  // The rule's identity can query the workspace before the rule first runs.
  dependsOn: [
    rbac
  ]
  params: {
    actionGroupName: '${abbrs.actionGroups}orders-${resourceToken}'
    operatorAlertRuleName: '${abbrs.insightsScheduledQueryRules}operator-alert-${resourceToken}'
    outageAlertRuleName: '${abbrs.insightsScheduledQueryRules}outage-alert-${resourceToken}'
    deadLetterAlertName: '${abbrs.insightsMetricAlerts}dead-letters-${resourceToken}'
    location: location
    tags: tags
    alertEmail: alertEmail
    workspaceId: monitoring.outputs.workspaceId
    alertsIdentityId: identity.outputs.alertsIdentityId
    serviceBusNamespaceId: serviceBus.outputs.id
  }
}

// The operators' workbook (docs/operating.md, "Observability"): the console dashboard's figures in
// the portal, linked to Application Insights.
module workbook 'app/workbook.bicep' = {
  name: 'workbook'
  scope: rg
  params: {
    displayName: 'Orders (${environmentName})'
    location: location
    tags: tags
    appInsightsId: monitoring.outputs.appInsightsId
    serviceBusNamespaceId: serviceBus.outputs.id
    storageAccountId: storage.outputs.id
  }
}

// azd stores these in .azure/<env>/.env (`azd env get-values`).
output AZURE_LOCATION string = location
output AZURE_TENANT_ID string = tenant().tenantId
output AZURE_RESOURCE_GROUP string = rg.name
output AZURE_FUNCTION_APP_NAME string = functionApp.outputs.name
output AZURE_FUNCTION_APP_URL string = 'https://${functionApp.outputs.defaultHostName}'
// The operator console: people sign in (AZURE_AUTH_CLIENT_ID); it takes no function key.
output CONSOLE_URL string = functionApp.outputs.consoleUrl
output CONSOLE_SIGN_IN_ENABLED bool = !empty(authClientId)
// Grant this principal Key Vault Secrets User on the ApiKey agents' secrets.
output AZURE_FUNCTION_APP_IDENTITY_PRINCIPAL_ID string = identity.outputs.appPrincipalId
output AZURE_STORAGE_ACCOUNT_NAME string = storage.outputs.name
output SERVICEBUS_FULLY_QUALIFIED_NAMESPACE string = serviceBus.outputs.fullyQualifiedNamespace
// The tier deployed: Premium whenever vnetEnabled, whatever SERVICEBUS_SKU says.
output SERVICEBUS_SKU_DEPLOYED string = effectiveServiceBusSku
output APPLICATIONINSIGHTS_NAME string = monitoring.outputs.appInsightsName
output AZURE_LOG_ANALYTICS_WORKSPACE_ID string = monitoring.outputs.workspaceId
// The operators' workbook (Monitor > Workbooks).
output WORKBOOK_ID string = workbook.outputs.id
