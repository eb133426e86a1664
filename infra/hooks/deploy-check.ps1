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

# The Python to run it with: the checkout's .venv when it can import what the app needs,
# else one the hook builds once (.venv-deploycheck, from requirements.txt, with Python
# 3.13). A Python that cannot run the check is never taken for a refusal.
function Test-Usable([string] $candidate) {
    if (-not (Test-Path $candidate)) { return $false }
    & $candidate -c 'import azure.data.tables, azure.identity, azure.storage.queue, pydantic' 2>$null | Out-Null
    return ($LASTEXITCODE -eq 0)
}
function Stop-Unchecked([string] $why) {
    Write-Host "deploy-check: could not check: $why; to $Phase without the check: SKIP_DEPLOY_CHECK=true azd $Phase"
    exit 2
}
$python = $null
foreach ($candidate in @('.venv/Scripts/python.exe', '.venv/bin/python')) {
    if (Test-Usable $candidate) { $python = $candidate; break }
}
if (-not $python) {
    $own = if (Test-Path '.venv-deploycheck/Scripts') { '.venv-deploycheck/Scripts/python.exe' } else { '.venv-deploycheck/bin/python' }
    $want = (Get-FileHash requirements.txt).Hash
    $built = if (Test-Path '.venv-deploycheck/.requirements') { Get-Content '.venv-deploycheck/.requirements' } else { '' }
    if (($built -ne $want) -or -not (Test-Usable $own)) {
        $base = $null
        foreach ($launcher in @(@('py', '-3.13'), @('python3.13'))) {
            if (Get-Command $launcher[0] -ErrorAction SilentlyContinue) { $base = $launcher; break }
        }
        if (-not $base) { Stop-Unchecked 'it needs Python 3.13 (the app''s) to build its environment, and none was found: install it (winget install Python.Python.3.13) or run make deps, then run azd again' }
        Write-Host 'deploy-check: building its environment once (.venv-deploycheck, from requirements.txt): about a minute'
        Remove-Item -Recurse -Force '.venv-deploycheck' -ErrorAction SilentlyContinue
        & $base[0] $base[1..($base.Length - 1)] -m venv .venv-deploycheck
        $own = if (Test-Path '.venv-deploycheck/Scripts') { '.venv-deploycheck/Scripts/python.exe' } else { '.venv-deploycheck/bin/python' }
        & $own -m pip install -q --disable-pip-version-check -r requirements.txt
        if ($LASTEXITCODE -ne 0) { Stop-Unchecked 'building .venv-deploycheck from requirements.txt failed (pip''s output above)' }
        if (-not (Test-Usable $own)) { Stop-Unchecked '.venv-deploycheck was built but cannot import the app''s packages' }
        Set-Content '.venv-deploycheck/.requirements' $want
    }
    $python = $own
}

foreach ($name in @('AzureWebJobsStorage', 'AzureWebJobsStorage__credential', 'AzureWebJobsStorage__clientId',
        'AzureWebJobsStorage__tableServiceUri', 'AzureWebJobsStorage__queueServiceUri')) {
    Remove-Item "Env:$name" -ErrorAction SilentlyContinue
}
$env:AzureWebJobsStorage__accountName = $account

# Exit 3 is retried only where azd grants the deployer data roles (they take a while to
# apply); without them the login may read nothing, and the check is not made (said so).
$reads = if ("$env:DEPLOYER_READS_STATE") { "$env:DEPLOYER_READS_STATE".ToLower() } else { 'true' }
$granted = (@('true', '1', 'yes') -contains "$env:GRANT_DEPLOYER_DATA_ACCESS".ToLower()) -or (@('true', '1', 'yes') -contains $reads)
for ($try = 1; ; $try++) {
    & $python -m admin deploy-check --declarations declarations
    $status = $LASTEXITCODE
    if ($status -ne 3 -or -not $granted -or $try -ge 8) { break }
    Write-Host "deploy-check: storage account $account did not answer (try $try); again in 15 s"
    Start-Sleep -Seconds 15
}
if ($status -eq 3 -and -not $granted) {
    Write-Host "deploy-check: NOT CHECKED: your login could not read the state table of $account, and azd grants you no read of it (DEPLOYER_READS_STATE is off). To have the orders in flight checked: azd env set DEPLOYER_READS_STATE true, azd provision, azd $Phase"
    exit 0
}

switch ($status) {
    0 { Write-Host "deploy-check: safe to $Phase" }
    1 { Write-Host "deploy-check: REFUSED: the JSON above names the orders in flight and what they still need (docs/operating.md, 'Upgrading'). To $Phase anyway: set SKIP_DEPLOY_CHECK=true" }
    default { Write-Host "deploy-check: could not check (exit $status, JSON above); to $Phase without the check: set SKIP_DEPLOY_CHECK=true" }
}
exit $status
