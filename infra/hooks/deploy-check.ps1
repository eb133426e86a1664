# The deploy guard, as azd runs it before `provision` and before `deploy` on Windows
# (azure.yaml, hooks): the same as deploy-check.sh, which says what it does and why.
#
#   ./infra/hooks/deploy-check.ps1 -Phase provision|deploy
#
# Override, for an emergency: $env:SKIP_DEPLOY_CHECK = 'true' before azd deploy (or azd env
# set SKIP_DEPLOY_CHECK true, and unset it afterwards).
param([string] $Phase = 'deploy')
Set-Location (Join-Path $PSScriptRoot '../..')

if (@('true', '1', 'yes') -contains "$env:SKIP_DEPLOY_CHECK".ToLower()) {
    Write-Host "deploy-check: SKIPPED (SKIP_DEPLOY_CHECK=$env:SKIP_DEPLOY_CHECK): the orders in flight were not checked against these declarations"
    exit 0
}

$account = $env:AZURE_STORAGE_ACCOUNT_NAME  # an output of infra/main.bicep
if (-not $account) {
    if ($Phase -eq 'provision') {
        Write-Host 'deploy-check: no storage account in this environment yet: nothing in flight'
        exit 0
    }
    Write-Host 'deploy-check: AZURE_STORAGE_ACCOUNT_NAME is not set: run azd provision (or azd env refresh) first; to deploy without the check: SKIP_DEPLOY_CHECK=true'
    exit 1
}

$python = 'python'
foreach ($candidate in @('.venv/Scripts/python.exe', '.venv/bin/python')) {
    if (Test-Path $candidate) { $python = $candidate; break }
}

foreach ($name in @('AzureWebJobsStorage', 'AzureWebJobsStorage__credential', 'AzureWebJobsStorage__clientId',
        'AzureWebJobsStorage__tableServiceUri', 'AzureWebJobsStorage__queueServiceUri')) {
    Remove-Item "Env:$name" -ErrorAction SilentlyContinue
}
$env:AzureWebJobsStorage__accountName = $account

for ($try = 1; ; $try++) {
    & $python -m admin deploy-check --declarations declarations
    $status = $LASTEXITCODE
    if ($status -ne 3 -or $try -ge 8) { break }
    Write-Host "deploy-check: storage account $account did not answer (try $try); again in 15 s"
    Start-Sleep -Seconds 15
}

switch ($status) {
    0 { Write-Host "deploy-check: safe to $Phase" }
    1 { Write-Host "deploy-check: REFUSED: the JSON above names the orders in flight and what they still need (README, 'Upgrading'). To $Phase anyway: set SKIP_DEPLOY_CHECK=true" }
    default { Write-Host "deploy-check: could not check (exit $status, JSON above); to $Phase without the check: set SKIP_DEPLOY_CHECK=true" }
}
exit $status
