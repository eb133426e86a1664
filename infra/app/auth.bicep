// App Service authentication ("Easy Auth") with Microsoft Entra ID for the Function
// App: people sign in to the console, API callers bring an Entra token, and the app
// roles of the registration (Orders.Reader, Orders.Operator: infra/app-roles.json)
// decide what each may do. main.bicep deploys this module only when authClientId
// names an app registration.
//
// It is a module of its own because checkov runs its siteConfig (`web`) checks on
// every Microsoft.Web/sites/config resource, and this one holds no siteConfig:
// the skips below say so, apart from function-app.bicep's skips on the site.

@description('Name of the Function App to put sign-in in front of.')
param functionAppName string

@minLength(1)
@maxLength(36)
@description('Client id of the Entra app registration operators sign in to.')
param clientId string

@minLength(1)
@description('Tenant of that app registration.')
param tenantId string

resource site 'Microsoft.Web/sites@2024-04-01' existing = {
  name: functionAppName
}

/* What it adds, and what the app decides:
   - Who the caller is, vouched for: the platform validates the browser's session
     cookie or the caller's bearer token (audience api://<clientId> or <clientId>) and
     hands the app its claims, app roles included, in X-MS-CLIENT-PRINCIPAL, after
     removing any X-MS-CLIENT-PRINCIPAL* header the client sent. With WEBSITE_AUTH_ENABLED
     (the platform's) and SIGN_IN_CLIENT_ID (function-app.bicep writes it from the same
     authClientId) the app believes it (config/principals.py).
   - What each may do is the app's decision, on every route: reads need Orders.Reader,
     changes Orders.Operator; the console sends a browser that is not signed in to
     /.auth/login/aad. Unauthenticated requests are therefore let through
     (AllowAnonymous, not RedirectToLoginPage): the event route must take a webhook
     that brings the function key alone, and excludedPaths end only in a trailing
     wildcard, so /api/orders/{orderId}/events/{name} cannot be excluded by itself.
     The operator API still needs the function key (AuthLevel FUNCTION, checked by the
     Functions host); the console never takes one (AuthLevel ANONYMOUS) and refuses
     anyone without a principal and a role.
   No client secret: without one, Easy Auth signs in with the ID-token (implicit)
   flow. The registration needs "ID tokens" enabled, the redirect URI
   https://<app host>/.auth/login/aad/callback, the two app roles, and api://<clientId>
   as its application ID URI for API tokens (docs/deployment.md, "Sign-in and roles").
   A secret, if ever wanted (for access tokens to call other APIs), goes in an app
   setting that is a Key Vault reference, named by registration.clientSecretSettingName;
   never inline here. Who may sign in: anyone in the tenant, unless the registration's
   enterprise application has "Assignment required" on (recommended: then only people
   given a role). Turning it off: deployments are incremental, so clearing authClientId
   deletes nothing; set platform.enabled to false once (az webapp auth update
   --enabled false, or the portal). */
resource authSettings 'Microsoft.Web/sites/config@2024-04-01' = {
  // checkov:skip=CKV_AZURE_13: That check reads the v1 authsettings shape (properties.enabled); this authsettingsV2 resource turns sign-in on with properties.platform.enabled, which CKV_AZURE_56 checks and passes.
  // checkov:skip=CKV_AZURE_63: False positive: checkov applies this siteConfig (web) check to every Microsoft.Web/sites/config resource, and authsettingsV2 (Easy Auth) has no such property.
  // checkov:skip=CKV_AZURE_65: False positive: checkov applies this siteConfig (web) check to every Microsoft.Web/sites/config resource, and authsettingsV2 (Easy Auth) has no such property.
  // checkov:skip=CKV_AZURE_66: False positive: checkov applies this siteConfig (web) check to every Microsoft.Web/sites/config resource, and authsettingsV2 (Easy Auth) has no such property.
  // checkov:skip=CKV_AZURE_80: False positive: checkov applies this siteConfig (web) check to every Microsoft.Web/sites/config resource, and authsettingsV2 (Easy Auth) has no such property.
  // checkov:skip=CKV_AZURE_88: False positive: checkov applies this siteConfig (web) check to every Microsoft.Web/sites/config resource, and authsettingsV2 (Easy Auth) has no such property.
  // checkov:skip=CKV_AZURE_222: False positive: publicNetworkAccess is a property of the site, not of authsettingsV2 (Easy Auth); function-app.bicep skips it on the site, with its reason.
  parent: site
  name: 'authsettingsV2'
  properties: {
    platform: {
      enabled: true
    }
    globalValidation: {
      requireAuthentication: false
      unauthenticatedClientAction: 'AllowAnonymous'
    }
    httpSettings: {
      requireHttps: true
    }
    identityProviders: {
      azureActiveDirectory: {
        enabled: true
        registration: {
          clientId: clientId
          openIdIssuer: '${environment().authentication.loginEndpoint}${tenantId}/v2.0'
        }
        validation: {
          allowedAudiences: [
            'api://${clientId}'
            clientId
          ]
        }
      }
    }
    login: {
      tokenStore: {
        enabled: false
      }
    }
  }
}
