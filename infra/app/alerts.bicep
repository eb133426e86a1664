// How an operator hears about trouble: one action group (email), fed by
//  - a log search alert on the app's operator alerts (contract 3.5),
//  - a log search alert on its outage alerts (contract 3.14: an agent's remote failing
//    every call, and its recovery), and
//  - a metric alert on dead-lettered Service Bus messages.
// The operator-alerts Storage queue stays the durable record of every alert;
// these rules are the notification, at most a few minutes behind it.

param actionGroupName string
param operatorAlertRuleName string
param outageAlertRuleName string
param deadLetterAlertName string
param location string
param tags object

@description('Address that receives the alert emails.')
param alertEmail string

@description('Log Analytics workspace the app\'s telemetry lands in.')
param workspaceId string

@description('Identity the log search rule runs its query as (Log Analytics Reader on the workspace, see rbac.bicep).')
param alertsIdentityId string

param serviceBusNamespaceId string

resource actionGroup 'Microsoft.Insights/actionGroups@2023-01-01' = {
  name: actionGroupName
  location: 'Global'
  tags: tags
  properties: {
    groupShortName: 'orders-ops' // at most 12 characters; shown in SMS and email subjects
    enabled: true
    emailReceivers: [
      {
        name: 'operator'
        emailAddress: alertEmail
        useCommonAlertSchema: true
      }
    ]
  }
}

// The app logs every operator alert as an ERROR record (severityLevel 3 in
// Application Insights) whose message starts with the literal text
// "OPERATOR ALERT", e.g.
//   OPERATOR ALERT order=o-17 step=charge-payment failureCount=5: <reason>
// Records are picked by ingestion time, not event time: evaluated every
// 5 minutes over the records that arrived in those 5 minutes, each alert is
// counted once even when ingestion lags by minutes (the 15-minute window only
// bounds how late a record may be).
var operatorAlertQuery = '''
AppTraces
| where ingestion_time() > ago(5m)
| where SeverityLevel >= 3 and Message startswith_cs "OPERATOR ALERT"
| parse Message with "OPERATOR ALERT order=" OrderId:string " step=" Step:string " failureCount=" FailureCount:long ":" Reason:string
| project TimeGenerated, OrderId, Step, FailureCount, Reason = trim(" ", Reason), AppRoleName
'''

resource operatorAlertRule 'Microsoft.Insights/scheduledQueryRules@2023-12-01' = {
  name: operatorAlertRuleName
  location: location
  tags: tags
  kind: 'LogAlert'
  // The query runs as this identity, not as whoever last edited the rule;
  // it holds only Log Analytics Reader on the workspace.
  identity: {
    type: 'UserAssigned'
    userAssignedIdentities: {
      '${alertsIdentityId}': {}
    }
  }
  properties: {
    displayName: 'Order needs an operator'
    description: 'An order step failed for good (failure count reached MAX_FAILURE_COUNT, or a compensation failed). The order is in status error. List them with GET /api/orders?status=error, fix the cause, then POST /api/orders/{orderId}/resubmit.'
    severity: 1
    enabled: true
    scopes: [
      workspaceId
    ]
    evaluationFrequency: 'PT5M'
    windowSize: 'PT15M'
    criteria: {
      allOf: [
        {
          query: operatorAlertQuery
          timeAggregation: 'Count'
          operator: 'GreaterThan'
          threshold: 0
          // One alert per step and evaluation, with the count: bounded
          // cardinality, so a burst of failed orders (a remote service down)
          // sends a handful of emails, not hundreds. The app logs declared
          // step names only, '(undeclared)' for any other (core/messages.py).
          dimensions: [
            {
              name: 'Step'
              operator: 'Include'
              values: [
                '*'
              ]
            }
          ]
          failingPeriods: {
            numberOfEvaluationPeriods: 1
            minFailingPeriodsToAlert: 1
          }
        }
      ]
    }
    // Stateless: every evaluation that finds new alert records notifies.
    // An operator alert is an event, not a condition that clears by itself.
    autoMitigate: false
    // AppTraces has no schema in a new workspace until the app's first log
    // record arrives; validation would fail the first deployment.
    skipQueryValidation: true
    actions: {
      actionGroups: [
        actionGroup.id
      ]
      customProperties: {
        runbook: 'docs/deployment.md#alerts'
      }
    }
  }
}

// The app logs one record per outage and one per recovery, however many instances run
// (messaging/outages.py), e.g.
//   OUTAGE ALERT agent=carrier since=2026-11-27T10:00:00Z waiting=42: <reason>  (ERROR)
//   OUTAGE RECOVERED agent=carrier since=2026-11-27T10:00:00Z at=...          (WARNING)
// Picked by ingestion time, as the operator alerts are.
var outageAlertQuery = '''
AppTraces
| where ingestion_time() > ago(5m)
| where SeverityLevel >= 2 and (Message startswith_cs "OUTAGE ALERT" or Message startswith_cs "OUTAGE RECOVERED")
| parse Message with Kind:string " agent=" Agent:string " since=" Since:string " " Rest:string
| project TimeGenerated, Kind, Agent, Since, AppRoleName
'''

resource outageAlertRule 'Microsoft.Insights/scheduledQueryRules@2023-12-01' = {
  name: outageAlertRuleName
  location: location
  tags: tags
  kind: 'LogAlert'
  identity: {
    type: 'UserAssigned'
    userAssignedIdentities: {
      '${alertsIdentityId}': {}
    }
  }
  properties: {
    displayName: 'An agent\'s remote service is down, or back'
    description: 'Every call to an agent\'s remote service has failed for OUTAGE_ALERT_SECONDS (Kind OUTAGE ALERT), or it answers again (Kind OUTAGE RECOVERED). Its orders wait, uncounted, and resume by themselves when it answers; the dashboard lists the outage. Nothing to resubmit.'
    severity: 1
    enabled: true
    scopes: [
      workspaceId
    ]
    evaluationFrequency: 'PT5M'
    windowSize: 'PT15M'
    criteria: {
      allOf: [
        {
          query: outageAlertQuery
          timeAggregation: 'Count'
          operator: 'GreaterThan'
          threshold: 0
          // One email per agent and kind: the agents are declared names.
          dimensions: [
            {
              name: 'Agent'
              operator: 'Include'
              values: [
                '*'
              ]
            }
            {
              name: 'Kind'
              operator: 'Include'
              values: [
                '*'
              ]
            }
          ]
          failingPeriods: {
            numberOfEvaluationPeriods: 1
            minFailingPeriodsToAlert: 1
          }
        }
      ]
    }
    autoMitigate: false
    skipQueryValidation: true
    actions: {
      actionGroups: [
        actionGroup.id
      ]
      customProperties: {
        runbook: 'docs/deployment.md#alerts'
      }
    }
  }
}

resource deadLetterAlert 'Microsoft.Insights/metricAlerts@2018-03-01' = {
  name: deadLetterAlertName
  location: 'global'
  tags: tags
  properties: {
    description: 'A Service Bus queue holds dead-lettered messages: agent requests that expired unread (agents down or far behind) or messages that failed delivery maxDeliveryCount times. The supervisor has already retried the affected steps; inspect the dead-letter queue, fix the cause, then purge it.'
    severity: 2
    enabled: true
    scopes: [
      serviceBusNamespaceId
    ]
    evaluationFrequency: 'PT5M'
    windowSize: 'PT15M'
    // Stateful: fires once when a dead-letter queue becomes non-empty and
    // resolves when it is purged (the metric is a count, not a rate).
    autoMitigate: true
    criteria: {
      'odata.type': 'Microsoft.Azure.Monitor.SingleResourceMultipleMetricCriteria'
      allOf: [
        {
          criterionType: 'StaticThresholdCriterion'
          name: 'DeadLetteredMessages'
          metricNamespace: 'Microsoft.ServiceBus/namespaces'
          metricName: 'DeadletteredMessages'
          // Split by queue so the email names the queue.
          dimensions: [
            {
              name: 'EntityName'
              operator: 'Include'
              values: [
                '*'
              ]
            }
          ]
          timeAggregation: 'Average'
          operator: 'GreaterThan'
          threshold: 0
        }
      ]
    }
    actions: [
      {
        actionGroupId: actionGroup.id
      }
    ]
  }
}

output actionGroupId string = actionGroup.id
