// App Service authentication ("Easy Auth") with Microsoft Entra ID in front of
// the Function App: operators sign in before they reach the console, and API
// clients bring an Entra token. main.bicep deploys this module only when
// authClientId names an app registration.
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

/* What it adds, and what it does not replace:
   - The function key stays required as well: every HTTP function (the console
     and the operator API) is AuthLevel FUNCTION, and the Functions host checks
     the key after Easy Auth has let a request through.
   - Sign-in, and an audit name that can be trusted: with Easy Auth on, the
     platform sets WEBSITE_AUTH_ENABLED=True and strips X-MS-CLIENT-PRINCIPAL-*
     headers a client sends, so admin/triggers.py records
     X-MS-CLIENT-PRINCIPAL-NAME as who acted. Without it a name is only a claim.
   - Every HTTP route is behind it: a browser is redirected to the Entra sign-in
     page; an API client sends an Entra token for the registration (audience
     api://<clientId> or <clientId>) as well as the function key.
   No client secret: without one, Easy Auth signs in with the ID-token (implicit)
   flow. The registration needs "ID tokens" enabled and the redirect URI
   https://<app host>/.auth/login/aad/callback. A secret, if ever wanted (for
   access tokens to call other APIs), goes in an app setting that is a Key Vault
   reference, named by registration.clientSecretSettingName; never inline here.
   Who may sign in: anyone in the tenant, unless the registration's enterprise
   application has "Assignment required" on (then its assigned users and groups).
   Turning it off: deployments are incremental, so clearing authClientId deletes
   nothing; set platform.enabled to false once (az webapp auth update
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
      requireAuthentication: true
      unauthenticatedClientAction: 'RedirectToLoginPage'
      redirectToProvider: 'azureactivedirectory'
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
