// The Function App on the Flex Consumption plan (FC1), Python 3.13.
//
// On Flex Consumption the runtime and its version live in functionAppConfig,
// not in FUNCTIONS_WORKER_RUNTIME / FUNCTIONS_EXTENSION_VERSION app settings
// (the platform rejects those). The app settings below are exactly the names
// config/settings.py reads (contract 3.6), in their identity-based form, plus
// the two Application Insights platform settings; tests/infra checks that.

param name string
param planName string
param location string
param tags object

@description('Resource id of the app\'s user-assigned identity.')
param identityId string

@description('Client id of the same identity: the host and the SDKs pick it with __clientId.')
param identityClientId string

param storageAccountName string
param deploymentContainerName string
param serviceBusFullyQualifiedNamespace string
param appInsightsName string

param remoteServiceUrl string

@description('The declared agents (infra/agents.json, generated from declarations/).')
param agents array

@description('Agent name -> base URL (AGENT_<NAME>_URL); an http agent not named gets remoteServiceUrl.')
param agentUrls object = {}

@description('Agent name -> Key Vault secret URI of its key (AGENT_<NAME>_API_KEY, ApiKey agents).')
param agentApiKeySecretUris object = {}

@minValue(1)
@maxValue(270)
param stepTimeoutSeconds int

param maxFailureCount int
param supervisorSchedule string

@minValue(1)
@maxValue(604800)
param deferralWindowSeconds int

@minValue(1)
@maxValue(300)
param maxClockSkewSeconds int

@minValue(1)
@maxValue(86400)
param outageAlertSeconds int

@description('CONSOLE_READ_ONLY: the console shows orders but offers and accepts no action.')
param consoleReadOnly bool

@maxLength(36)
@description('SIGN_IN_CLIENT_ID: the client id of the Entra app registration people sign in to (app/auth.bicep), empty without sign-in. The app believes the signed-in principal and its app roles only when this is set and App Service authentication is on.')
param signInClientId string = ''

@description('REPLY_QUEUES: the queues an order\'s replyTo may name (comma-separated; an entry ending in * is a prefix). Empty: none.')
param replyQueues string

@description('RETENTION: how long finished orders stay before they are archived (core/retention.py).')
param retention string

@description('RETENTION_SCHEDULE: NCRONTAB (six fields) of the retention timer.')
param retentionSchedule string

@description('RETENTION_BATCH: orders archived per retention run at most.')
param retentionBatch int

@description('ARCHIVE_DAYS: how long the archive keeps an order; the lifecycle rule deletes its blob then (the same parameter).')
param archiveDays int

@minValue(1)
@maxValue(36500)
@description('KEPT_DAYS: how long a message kept for an operator stays in the table before retention archives it.')
param keptDays int

@description('DASHBOARD_SCHEDULE: NCRONTAB (six fields) of the dashboard timer.')
param dashboardSchedule string

@description('STUCK_FLOOR_SECONDS: the least time in one state that makes a step stuck.')
param stuckFloorSeconds int

@allowed([
  512
  2048
  4096
])
param instanceMemoryMB int

@minValue(1)
@maxValue(1000)
param maximumInstanceCount int

param zoneRedundant bool = false

@description('Resource id of the subnet (delegated to Microsoft.App/environments) the app\'s outbound traffic goes through, with vnetEnabled; empty for none.')
param virtualNetworkSubnetId string = ''

/* Per-agent app settings, from infra/agents.json (core.workflows.Agent):
   - AGENT_<NAME>_URL for each http agent: agentUrls[<name>], else remoteServiceUrl;
   - AGENT_<NAME>_API_KEY for each ApiKey agent named in agentApiKeySecretUris: a Key
     Vault reference the platform resolves with the app's identity (keyVaultReferenceIdentity
     below); the key itself never passes through Bicep. An ApiKey agent not named there
     gets no setting: the deployment adds it (docs/deployment.md, "Agents").
   (The comparisons are written 'literal' == agent.x, in parentheses: pycep, which
   tests/infra and checkov read this file with, misreads agent.x == 'literal'.) */
var agentUrlSettingLists = [for agent in agents: ('http' == agent.kind) ? [
  {
    name: agent.urlSetting
    value: contains(agentUrls, agent.name) ? agentUrls[agent.name] : remoteServiceUrl
  }
] : []]
var agentApiKeySettingLists = [for agent in agents: (('api-key' == agent.auth) && contains(agentApiKeySecretUris, agent.name)) ? [
  {
    name: agent.apiKeySetting
    value: '@Microsoft.KeyVault(SecretUri=${agentApiKeySecretUris[agent.name]})'
  }
] : []]
/* EntraToken agents get their tokens from the app's managed identity (agents/auth.py),
   which is user-assigned: AZURE_CLIENT_ID names it (there is no system-assigned one to
   fall back on). Set only when some agent authenticates with Entra ID. */
var entraAgentLists = [for agent in agents: ('entra' == agent.auth) ? [
  agent.name
] : []]
var entraIdentitySettings = empty(flatten(entraAgentLists)) ? [] : [
  {
    name: 'AZURE_CLIENT_ID'
    value: identityClientId
  }
]
/* Settings the platform reads, not the app (PYTHON_THREADPOOL_THREAD_COUNT: the Python
   runtime's thread pool): infra/platform-settings.json, which devhost also reads for its
   defaults (devhost/deployed.py), so the app runs locally as deployed. */
var platformSettings = loadJsonContent('../platform-settings.json').appSettings
var agentSettings = concat(flatten(agentUrlSettingLists), flatten(agentApiKeySettingLists), entraIdentitySettings)

resource storage 'Microsoft.Storage/storageAccounts@2023-05-01' existing = {
  name: storageAccountName
}

resource appInsights 'Microsoft.Insights/components@2020-02-02' existing = {
  name: appInsightsName
}

resource plan 'Microsoft.Web/serverfarms@2024-04-01' = {
  // checkov:skip=CKV_AZURE_225: On Flex Consumption, zone redundancy makes the platform keep at least two always-ready instances per function scale group, billed around the clock, which defeats scale to zero; it is a parameter (zoneRedundant), off by default.
  name: planName
  location: location
  tags: tags
  kind: 'functionapp'
  sku: {
    name: 'FC1'
    tier: 'FlexConsumption'
  }
  properties: {
    reserved: true // Linux, the only OS Flex Consumption runs
    /* Off by default. Zone redundancy on Flex Consumption makes the platform
       keep at least two always-ready instances for every per-function scale
       group, billed as always-ready whatever alwaysReady says below (each
       queue, Service Bus and timer function is a group, the HTTP functions
       one more): two instances per group around the clock.
       The skip of CKV_AZURE_225 records this. */
    zoneRedundant: zoneRedundant
  }
}

resource site 'Microsoft.Web/sites@2024-04-01' = {
  // checkov:skip=CKV_AZURE_222: The operator API (contract 3.7) is called over the internet with function keys, with vnetEnabled too (that closes storage and Service Bus, not the app); closing the app needs a private endpoint for it and a network for operators to call from, which this template does not create.
  // checkov:skip=CKV_AZURE_17: The operator API is authenticated with function keys (contract 3.7); requiring client certificates would break its clients, and every other trigger is a queue or a timer, not HTTP.
  // checkov:skip=CKV_AZURE_212: Scale from zero is the design (alwaysReady is empty): a minimum instance count is an always-ready baseline billed around the clock, and queued work simply waits out a cold start.
  // checkov:skip=CKV_AZURE_213: The Flex Consumption plan does not support the App Service health check; the platform replaces unhealthy instances itself.
  name: name
  // checkov:skip=CKV_AZURE_78: Flex Consumption rejects siteConfig.ftpsState (ARM BadRequest 51021, Azure/azure-cli#31414); FTP and basic-auth publishing are turned off by the ftp and scm basicPublishingCredentialsPolicies resources in the same file instead.
  location: location
  // azd finds the app to deploy the `orders` service to by this tag.
  tags: union(tags, {
    'azd-service-name': 'orders'
  })
  kind: 'functionapp,linux'
  identity: {
    type: 'UserAssigned'
    userAssignedIdentities: {
      '${identityId}': {}
    }
  }
  properties: {
    serverFarmId: plan.id
    // Key Vault references (the ApiKey agents' AGENT_<NAME>_API_KEY) resolve with the
    // app's user-assigned identity: there is no system-assigned one to default to.
    keyVaultReferenceIdentity: identityId
    httpsOnly: true
    publicNetworkAccess: 'Enabled'
    // With vnetEnabled: VNet integration, so the app reaches the storage account and the
    // namespace through their private endpoints (network.bicep).
    virtualNetworkSubnetId: empty(virtualNetworkSubnetId) ? null : virtualNetworkSubnetId
    clientCertEnabled: false
    functionAppConfig: {
      deployment: {
        storage: {
          type: 'blobContainer'
          value: '${storage.properties.primaryEndpoints.blob}${deploymentContainerName}'
          authentication: {
            type: 'UserAssignedIdentity'
            userAssignedIdentityResourceId: identityId
          }
        }
      }
      scaleAndConcurrency: {
        // Zero always-ready instances: the app scales to zero and costs
        // nothing while idle but for supervisor ticks. A cold start delays only
        // the first message after an idle spell; orders wait in a queue, and a
        // step's deadline starts at its claim, not at enqueue.
        alwaysReady: []
        /* 2048 MB buys about one vCPU (CPU is allocated in proportion to
           memory). The Python SDKs' own CPU (~0.9 ms per storage call) is this
           app's bottleneck: 512 MB instances would cost about the same per
           order under load (a quarter of the GB-s rate, four times the
           seconds) but quadruple its latency. They do make idle supervisor
           ticks four times cheaper: FUNCTION_INSTANCE_MEMORY_MB=512 suits a
           mostly idle environment. */
        instanceMemoryMB: instanceMemoryMB
        /* A cap, not a reservation. 40 instances at ~500 storage calls/s each
           already reach the storage account's 20,000 requests/s target;
           beyond that more instances only earn HTTP 503 throttling from Table
           Storage and a bigger bill. Raise it together with more accounts or
           shards, not alone. */
        maximumInstanceCount: maximumInstanceCount
        // HTTP per-instance concurrency is left at the platform default: the
        // only HTTP routes are the low-traffic operator API (contract 3.7).
        // Queue and Service Bus concurrency per instance is set in host.json.
      }
      runtime: {
        name: 'python'
        version: '3.13'
      }
    }
    siteConfig: {
      minTlsVersion: '1.2'
      scmMinTlsVersion: '1.2'
      // No ftpsState: Flex Consumption rejects it (BadRequest 51021). FTP and basic-auth
      // publishing are off through the two policies at the end of this file.
      http20Enabled: true
      // The settings below, then each agent's (agentSettings, above).
      appSettings: concat([
        // Host storage and the app's own table/queue clients: identity-based.
        {
          name: 'AzureWebJobsStorage__accountName'
          value: storage.name
        }
        {
          name: 'AzureWebJobsStorage__credential'
          value: 'managedidentity'
        }
        {
          name: 'AzureWebJobsStorage__clientId'
          value: identityClientId
        }
        // Agent request/reply transport: identity-based.
        {
          name: 'ServiceBusConnection__fullyQualifiedNamespace'
          value: serviceBusFullyQualifiedNamespace
        }
        {
          name: 'ServiceBusConnection__credential'
          value: 'managedidentity'
        }
        {
          name: 'ServiceBusConnection__clientId'
          value: identityClientId
        }
        {
          name: 'AGENT_TRANSPORT'
          value: 'servicebus'
        }
        {
          name: 'REMOTE_SERVICE_URL'
          value: remoteServiceUrl
        }
        {
          name: 'STEP_TIMEOUT_SECONDS'
          value: string(stepTimeoutSeconds)
        }
        {
          name: 'MAX_FAILURE_COUNT'
          value: string(maxFailureCount)
        }
        {
          name: 'SUPERVISOR_SCHEDULE'
          value: supervisorSchedule
        }
        {
          name: 'DEFERRAL_WINDOW_SECONDS'
          value: string(deferralWindowSeconds)
        }
        {
          name: 'MAX_CLOCK_SKEW_SECONDS'
          value: string(maxClockSkewSeconds)
        }
        {
          name: 'OUTAGE_ALERT_SECONDS'
          value: string(outageAlertSeconds)
        }
        {
          // Written out: string() of a bool gives 'True'/'False'.
          name: 'CONSOLE_READ_ONLY'
          value: consoleReadOnly ? 'true' : 'false'
        }
        {
          name: 'SIGN_IN_CLIENT_ID'
          value: signInClientId
        }
        {
          name: 'REPLY_QUEUES'
          value: replyQueues
        }
        {
          name: 'RETENTION'
          value: retention
        }
        {
          name: 'RETENTION_SCHEDULE'
          value: retentionSchedule
        }
        {
          name: 'RETENTION_BATCH'
          value: string(retentionBatch)
        }
        {
          name: 'ARCHIVE_DAYS'
          value: string(archiveDays)
        }
        {
          name: 'KEPT_DAYS'
          value: string(keptDays)
        }
        {
          name: 'DASHBOARD_SCHEDULE'
          value: dashboardSchedule
        }
        {
          name: 'STUCK_FLOOR_SECONDS'
          value: string(stuckFloorSeconds)
        }
        // Telemetry: the connection string names the component; ingestion is
        // authorised by the identity's Entra token, not by the key in it.
        {
          name: 'APPLICATIONINSIGHTS_CONNECTION_STRING'
          value: appInsights.properties.ConnectionString
        }
        {
          name: 'APPLICATIONINSIGHTS_AUTHENTICATION_STRING'
          value: 'Authorization=AAD;ClientId=${identityClientId}'
        }
      ], platformSettings, agentSettings)
    }
  }
}

// No FTP and no basic-auth (publishing profile) deployments: azd deploys with
// the deploying user's Entra token.
resource ftpPublishing 'Microsoft.Web/sites/basicPublishingCredentialsPolicies@2024-04-01' = {
  parent: site
  name: 'ftp'
  properties: {
    allow: false
  }
}

resource scmPublishing 'Microsoft.Web/sites/basicPublishingCredentialsPolicies@2024-04-01' = {
  parent: site
  name: 'scm'
  properties: {
    allow: false
  }
}

output name string = site.name
output id string = site.id
output defaultHostName string = site.properties.defaultHostName
// The operator console (console/): people sign in (app/auth.bicep); it takes no function key.
output consoleUrl string = 'https://${site.properties.defaultHostName}/api/console'
