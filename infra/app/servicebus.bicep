// Service Bus namespace and the agent request/reply queues (contract 3.3): the
// legacy agent-requests, one agent-requests-<agent> per agent, agent-replies; and
// order-wakeups, the orders' wake-ups as scheduled messages (contract 3.13), whose
// ids are unique per wake-up (duplicate detection drops none of them).
//
// Standard is the default: it has duplicate detection (which the message_id
// rule of contract 3.3 relies on) at a small base charge. Premium adds
// isolation, availability zones and private endpoints, at a fixed price per
// messaging unit; choose it with the serviceBusSku parameter.

param name string
param location string
param tags object

@allowed([
  'Standard'
  'Premium'
])
param skuName string

@description('The agent queues: agent-requests, agent-requests-<agent> for each agent (infra/agents.json), agent-replies (core.names).')
param queueNames array

@allowed([
  'Enabled'
  'Disabled'
])
@description('Disabled with vnetEnabled: only the private endpoint (network.bicep) reaches the namespace, which is then Premium.')
param publicNetworkAccess string = 'Enabled'

// One messaging unit when Premium; Standard has no capacity setting.
var skus = {
  Standard: {
    name: 'Standard'
    tier: 'Standard'
  }
  Premium: {
    name: 'Premium'
    tier: 'Premium'
    capacity: 1
  }
}

resource namespace 'Microsoft.ServiceBus/namespaces@2024-01-01' = {
  name: name
  location: location
  tags: tags
  sku: skus[skuName]
  properties: {
    // No SAS keys at all: senders and receivers authenticate with Entra ID
    // and the Data Sender / Data Receiver roles (rbac.bicep).
    disableLocalAuth: true
    minimumTlsVersion: '1.2'
    publicNetworkAccess: publicNetworkAccess
  }
}

resource queues 'Microsoft.ServiceBus/namespaces/queues@2024-01-01' = [
  for queueName in queueNames: {
    parent: namespace
    name: queueName
    properties: {
      /* A request's message_id is <orderId>:<step>:<attempt> (contract 3.3),
         and a reply's id is as stable. A send retried after a timeout that
         actually succeeded, or a re-dispatch of the same attempt by the safety
         sweep, is then dropped by the broker instead of running the remote call
         twice. Duplicates of one attempt can only arise while that attempt is
         alive (at most STEP_TIMEOUT_SECONDS, 30 s by default, before the
         supervisor moves on to attempt + 1 and a new message_id), so 10 minutes
         covers step timeouts up to 10 minutes with margin. Note that
         requiresDuplicateDetection cannot be changed after the queue exists. */
      requiresDuplicateDetection: true
      duplicateDetectionHistoryTimeWindow: 'PT10M'
      /* How long a receiver holds a message before the broker gives it to
         another one. The Functions host renews the lock while the function
         runs (host.json maxAutoLockRenewalDuration, 5 min), so this is not a
         cap on processing time; it is how fast a message held by a crashed
         instance comes back: 30 s, the same lease the local devhost uses
         (contract 3.9). Longer would only delay recovery of a live deadline. */
      lockDuration: 'PT30S'
      /* Deliveries before the broker dead-letters a message. A delivery fails
         only if the function itself fails (decode error, crash, host shutdown);
         remote-service retries happen inside one delivery. Five matches the
         Storage queues' maxDequeueCount in host.json. A dead-lettered request
         loses nothing: the supervisor retries the step when CompleteBy passes. */
      maxDeliveryCount: 5
      // Each message's own time-to-live is the time left before completeBy
      // (contract 3.3); this default only bounds a message sent without one.
      // Keep it above STEP_TIMEOUT_SECONDS.
      defaultMessageTimeToLive: 'PT1H'
      /* A reply lives an hour (a late success still completes its step); one
         nobody applied by then is dead-lettered, which raises an operator
         alert (the app's dead-letter trigger). A request expires at its step's
         deadline; dead-lettered, the request queue's dead-letter trigger turns
         it into the report "not called: expired unread" (no page), so the
         step learns the attempt applied nothing (contract 3.11: a request
         never sent is no try). Dropped, it would leave that attempt in doubt. */
      deadLetteringOnMessageExpiration: true
      enableBatchedOperations: true
      requiresSession: false
      maxSizeInMegabytes: 1024
    }
  }
]

output name string = namespace.name
output id string = namespace.id
// serviceBusEndpoint is https://<name>.<suffix>:443/ ; keep only the host name,
// whatever the cloud's suffix.
output fullyQualifiedNamespace string = split(split(split(namespace.properties.serviceBusEndpoint, '//')[1], '/')[0], ':')[0]
