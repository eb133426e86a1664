// The private network, deployed only with vnetEnabled (main.bicep), in the layout of the
// Azure-Samples Flex Consumption azd templates:
//   - a virtual network with two subnets: `app`, delegated to Microsoft.App/environments
//     (what Flex Consumption VNet integration requires), which the Function App's
//     outbound traffic goes through (function-app.bicep, virtualNetworkSubnetId); and
//     `private-endpoints`, which holds one private endpoint for each of the storage
//     account's blob, queue and table services and one for the Service Bus namespace;
//   - a private DNS zone per service (privatelink.<service>...), linked to the network,
//     with each endpoint's record in it, so that the usual host names
//     (<account>.blob.core.windows.net, <namespace>.servicebus.windows.net) resolve to the
//     private addresses from inside the network and the app's settings stay unchanged.
// The storage account and the namespace turn public network access off in the same
// deployment (storage.bicep, servicebus.bicep): from then on only this network reaches
// them. Service Bus private endpoints need the Premium tier, which main.bicep forces.

param vnetName string
param location string
param tags object

@description('Suffix of the private endpoints\' names (the deployment\'s resource token).')
param nameSuffix string

param storageAccountName string
param serviceBusNamespaceName string

// A network of its own, not peered with anything: these ranges only need to hold the
// endpoints and the app's instances (change them here to peer it with yours).
var addressPrefix = '10.0.0.0/16'
var privateEndpointSubnetPrefix = '10.0.1.0/24'
var appSubnetPrefix = '10.0.2.0/24'
var appSubnetName = 'app'
var privateEndpointSubnetName = 'private-endpoints'

resource storage 'Microsoft.Storage/storageAccounts@2023-05-01' existing = {
  name: storageAccountName
}

resource namespace 'Microsoft.ServiceBus/namespaces@2024-01-01' existing = {
  name: serviceBusNamespaceName
}

// One private endpoint per service: its group id (the sub-resource it connects to)
// and the private DNS zone its host name resolves through.
var endpoints = [
  {
    name: 'blob'
    groupId: 'blob'
    zone: 'privatelink.blob.${environment().suffixes.storage}'
    target: storage.id
  }
  {
    name: 'queue'
    groupId: 'queue'
    zone: 'privatelink.queue.${environment().suffixes.storage}'
    target: storage.id
  }
  {
    name: 'table'
    groupId: 'table'
    zone: 'privatelink.table.${environment().suffixes.storage}'
    target: storage.id
  }
  {
    name: 'servicebus'
    groupId: 'namespace'
    zone: 'privatelink.servicebus.windows.net'
    target: namespace.id
  }
]

resource vnet 'Microsoft.Network/virtualNetworks@2023-05-01' = {
  name: vnetName
  location: location
  tags: tags
  properties: {
    addressSpace: {
      addressPrefixes: [
        addressPrefix
      ]
    }
    subnets: [
      {
        name: privateEndpointSubnetName
        properties: {
          addressPrefix: privateEndpointSubnetPrefix
          privateEndpointNetworkPolicies: 'Disabled'
          privateLinkServiceNetworkPolicies: 'Enabled'
        }
      }
      {
        name: appSubnetName
        properties: {
          addressPrefix: appSubnetPrefix
          // Flex Consumption integrates with a subnet delegated to this service.
          delegations: [
            {
              name: 'flex-consumption'
              properties: {
                serviceName: 'Microsoft.App/environments'
              }
            }
          ]
          privateEndpointNetworkPolicies: 'Disabled'
          privateLinkServiceNetworkPolicies: 'Enabled'
        }
      }
    ]
  }
}

resource zones 'Microsoft.Network/privateDnsZones@2020-06-01' = [
  for endpoint in endpoints: {
    name: endpoint.zone
    location: 'global'
    tags: tags
    properties: {}
  }
]

resource zoneLinks 'Microsoft.Network/privateDnsZones/virtualNetworkLinks@2020-06-01' = [
  for (endpoint, i) in endpoints: {
    parent: zones[i]
    name: '${vnetName}-link'
    location: 'global'
    tags: tags
    properties: {
      registrationEnabled: false
      virtualNetwork: {
        id: vnet.id
      }
    }
  }
]

resource privateEndpoints 'Microsoft.Network/privateEndpoints@2023-11-01' = [
  for endpoint in endpoints: {
    name: 'pe-${endpoint.name}-${nameSuffix}'
    location: location
    tags: tags
    properties: {
      subnet: {
        id: '${vnet.id}/subnets/${privateEndpointSubnetName}'
      }
      privateLinkServiceConnections: [
        {
          name: endpoint.name
          properties: {
            privateLinkServiceId: endpoint.target
            groupIds: [
              endpoint.groupId
            ]
          }
        }
      ]
    }
  }
]

resource zoneGroups 'Microsoft.Network/privateEndpoints/privateDnsZoneGroups@2023-11-01' = [
  for (endpoint, i) in endpoints: {
    parent: privateEndpoints[i]
    name: 'default'
    properties: {
      privateDnsZoneConfigs: [
        {
          name: endpoint.name
          properties: {
            privateDnsZoneId: zones[i].id
          }
        }
      ]
    }
  }
]

output vnetId string = vnet.id
output appSubnetId string = '${vnet.id}/subnets/${appSubnetName}'
output privateEndpointSubnetId string = '${vnet.id}/subnets/${privateEndpointSubnetName}'
