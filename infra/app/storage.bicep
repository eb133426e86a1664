// The one storage account: the Functions host's storage (AzureWebJobsStorage:
// timer leases, host locks, diagnostic events), the deployment package
// container, the state table and the Storage queues of contract 3.1/3.5.
//
// Keys are off: every client (the app, the Functions host, the deploying user)
// authenticates with Microsoft Entra ID, so there is no secret to leak or
// rotate. `defaultToOAuthAuthentication` makes the portal do the same.

param name string
param location string
param tags object

@description('Blob container the Flex Consumption app deploys from.')
param deploymentContainerName string

@description('The state table (core.names.STATE_TABLE).')
param tableName string

@description('Storage queues to create (core.names, without the agent queues when they live on Service Bus).')
param queueNames array

@description('Blob container of archived orders (core.names.ORDERS_ARCHIVE, contract 3.12).')
param archiveContainerName string

@description('The Functions host\'s own blob containers (its locks and timer state, its keys), created here so that the app identity\'s blob roles can be scoped to them (rbac.bicep).')
param hostContainerNames array

@allowed([
  'Enabled'
  'Disabled'
])
@description('Disabled with vnetEnabled: only the private endpoints (network.bicep) reach the account.')
param publicNetworkAccess string = 'Enabled'

@description('Days after which archive blobs move to the cool tier.')
param archiveCoolAfterDays int

@description('Days after which archive blobs are deleted.')
param archiveDeleteAfterDays int

resource account 'Microsoft.Storage/storageAccounts@2023-05-01' = {
  // checkov:skip=CKV_AZURE_35: Closed only with vnetEnabled (off by default), which sets publicNetworkAccess Disabled and a default Deny rule and adds VNet integration and private endpoints; checkov reads the default, where the app reaches its storage over the public endpoint with Entra ID only (shared keys off).
  // checkov:skip=CKV_AZURE_59: Same cause as CKV_AZURE_35: public network access is Disabled with vnetEnabled and Enabled by default, for deployments without a network of their own, where access is Entra ID only (shared keys off).
  name: name
  location: location
  tags: tags
  kind: 'StorageV2'
  // Geo-redundant: the order records and the queued orders are what this
  // system must never lose, and the copy in the paired region survives the
  // loss of the primary region. Standard_GZRS also survives the loss of a
  // zone, in regions with zones: change it here (a literal, so checkov sees it).
  sku: {
    name: 'Standard_GRS'
  }
  properties: {
    accessTier: 'Hot'
    allowSharedKeyAccess: false
    allowBlobPublicAccess: false
    allowCrossTenantReplication: false
    defaultToOAuthAuthentication: true
    minimumTlsVersion: 'TLS1_2'
    supportsHttpsTrafficOnly: true
    /* Enabled (the default): reachable over its public endpoint, Entra ID only.
       Disabled (vnetEnabled): only through the private endpoints of network.bicep,
       which the app reaches from its integrated subnet; no network rule lets
       anything else in, not even trusted Azure services. */
    publicNetworkAccess: publicNetworkAccess
    networkAcls: ('Disabled' == publicNetworkAccess) ? {
      bypass: 'None'
      defaultAction: 'Deny'
    } : {
      bypass: 'AzureServices'
      defaultAction: 'Allow'
    }
    encryption: {
      keySource: 'Microsoft.Storage'
      requireInfrastructureEncryption: true
      services: {
        blob: {
          enabled: true
          keyType: 'Account'
        }
        file: {
          enabled: true
          keyType: 'Account'
        }
        // Account-scoped keys for tables and queues too, so the platform
        // encryption of the state store matches the blobs'.
        table: {
          enabled: true
          keyType: 'Account'
        }
        queue: {
          enabled: true
          keyType: 'Account'
        }
      }
    }
  }
}

resource blobService 'Microsoft.Storage/storageAccounts/blobServices@2023-05-01' = {
  parent: account
  name: 'default'
  properties: {
    // Recover a deleted deployment package or host lease container for a week.
    deleteRetentionPolicy: {
      enabled: true
      days: 7
    }
    containerDeleteRetentionPolicy: {
      enabled: true
      days: 7
    }
  }
}

resource deploymentContainer 'Microsoft.Storage/storageAccounts/blobServices/containers@2023-05-01' = {
  parent: blobService
  name: deploymentContainerName
  properties: {
    publicAccess: 'None'
  }
}

/* The containers the Functions host uses in AzureWebJobsStorage: azure-webjobs-hosts
   (its host lock, the timers' singleton locks and schedule state) and
   azure-webjobs-secrets (the function and host keys). The host creates them when they
   are missing; created here, they exist before the app first starts, and the app
   identity holds its blob role on these containers alone instead of on the account. */
resource hostContainers 'Microsoft.Storage/storageAccounts/blobServices/containers@2023-05-01' = [
  for containerName in hostContainerNames: {
    parent: blobService
    name: containerName
    properties: {
      publicAccess: 'None'
    }
  }
]

// Finished orders, archived by the retention timer before their rows are
// deleted (contract 3.12): written once, read rarely (a restore), so cool after
// a month and gone after archiveDeleteAfterDays.
resource archiveContainer 'Microsoft.Storage/storageAccounts/blobServices/containers@2023-05-01' = {
  parent: blobService
  name: archiveContainerName
  properties: {
    publicAccess: 'None'
  }
}

resource lifecycle 'Microsoft.Storage/storageAccounts/managementPolicies@2023-05-01' = {
  parent: account
  name: 'default'
  properties: {
    policy: {
      rules: [
        {
          name: 'orders-archive-tiering'
          enabled: true
          type: 'Lifecycle'
          definition: {
            filters: {
              blobTypes: [
                'blockBlob'
              ]
              prefixMatch: [
                '${archiveContainerName}/'
              ]
            }
            actions: {
              baseBlob: {
                tierToCool: {
                  daysAfterModificationGreaterThan: archiveCoolAfterDays
                }
                delete: {
                  daysAfterModificationGreaterThan: archiveDeleteAfterDays
                }
              }
            }
          }
        }
      ]
    }
  }
}

resource tableService 'Microsoft.Storage/storageAccounts/tableServices@2023-05-01' = {
  parent: account
  name: 'default'
}

resource stateTable 'Microsoft.Storage/storageAccounts/tableServices/tables@2023-05-01' = {
  parent: tableService
  name: tableName
}

resource queueService 'Microsoft.Storage/storageAccounts/queueServices@2023-05-01' = {
  parent: account
  name: 'default'
}

resource queues 'Microsoft.Storage/storageAccounts/queueServices/queues@2023-05-01' = [
  for queueName in queueNames: {
    parent: queueService
    name: queueName
  }
]

output name string = account.name
output id string = account.id
output blobEndpoint string = account.properties.primaryEndpoints.blob
output tableName string = stateTable.name
