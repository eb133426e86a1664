#!/bin/sh
# The deploy guard, as azd runs it before `provision` and before `deploy` (azure.yaml,
# hooks): python -m admin deploy-check against this environment's storage account, with
# your az / azd login. It fails the azd command when the declarations about to deploy
# remove an agent or a step that orders in flight still need (docs/operating.md, "Upgrading").
#
#   sh infra/hooks/deploy-check.sh provision|deploy
#
# Override, for an emergency: SKIP_DEPLOY_CHECK=true azd deploy (or azd env set
# SKIP_DEPLOY_CHECK true, and unset it afterwards). Orders the check would have named may
# then be stranded: run python -m admin deploy-check afterwards to see them.
set -u
phase="${1:-deploy}"
cd "$(dirname "$0")/../.." || exit 1

case "${SKIP_DEPLOY_CHECK:-}" in
true | TRUE | True | 1 | yes)
    echo "deploy-check: SKIPPED (SKIP_DEPLOY_CHECK=$SKIP_DEPLOY_CHECK): the orders in flight" \
        "were not checked against these declarations" >&2
    exit 0
    ;;
esac

account="${AZURE_STORAGE_ACCOUNT_NAME:-}"  # an output of infra/main.bicep
if [ -z "$account" ]; then
    if [ "$phase" = provision ]; then
        echo "deploy-check: no storage account in this environment yet: nothing in flight" >&2
        exit 0
    fi
    echo "deploy-check: AZURE_STORAGE_ACCOUNT_NAME is not set: run azd provision (or azd env" \
        "refresh) first; to deploy without the check: SKIP_DEPLOY_CHECK=true azd deploy" >&2
    exit 1
fi

# The Python to run it with: the checkout's .venv when it has what the app needs (make
# deps), else one the hook builds for itself once (.venv-deploycheck, from
# requirements.txt, with Python 3.13, what the app runs on; rebuilt when requirements.txt
# changes). A Python that cannot run the check is never taken for a refusal.
usable() {
    "$1" -c 'import azure.data.tables, azure.identity, azure.storage.queue, pydantic' \
        >/dev/null 2>&1
}
cannot() {
    echo "deploy-check: could not check: $1; to $phase without the check:" \
        "SKIP_DEPLOY_CHECK=true azd $phase" >&2
    exit 2
}
if [ -x .venv/bin/python ] && usable .venv/bin/python; then
    python=.venv/bin/python
else
    python=.venv-deploycheck/bin/python
    want="$(cksum < requirements.txt)"
    if ! [ -x "$python" ] || [ "$(cat .venv-deploycheck/.requirements 2>/dev/null)" != "$want" ] ||
        ! usable "$python"; then
        base="$(command -v python3.13 || ls "$HOME"/.pyenv/versions/3.13*/bin/python3.13 \
            2>/dev/null | head -n 1)"
        [ -n "$base" ] || cannot "it needs Python 3.13 (the app's) to build its environment, \
and none is on the PATH or under ~/.pyenv: install it (pyenv install 3.13, or your \
system's python3.13) or run make deps, then run azd $phase again"
        echo "deploy-check: building its environment once (.venv-deploycheck, from" \
            "requirements.txt, with $base): about a minute" >&2
        rm -rf .venv-deploycheck
        "$base" -m venv .venv-deploycheck &&
            .venv-deploycheck/bin/python -m pip install -q --disable-pip-version-check \
                -r requirements.txt ||
            cannot "building .venv-deploycheck from requirements.txt failed (pip's output \
above): fix that (a network or proxy problem?), or run make deps, then run azd $phase again"
        usable "$python" || cannot ".venv-deploycheck was built but cannot import the app's \
packages (output above)"
        echo "$want" > .venv-deploycheck/.requirements
    fi
fi

# This environment's account, identity-based, whatever the shell holds (a connection
# string to a local Azurite, another identity's settings).
unset AzureWebJobsStorage AzureWebJobsStorage__credential AzureWebJobsStorage__clientId \
    AzureWebJobsStorage__tableServiceUri AzureWebJobsStorage__queueServiceUri
export AzureWebJobsStorage__accountName="$account"

# --declarations declarations: the module the deployed app reads (Bicep sets no
# ORDERS_DECLARATIONS). Exit 3 (storage did not answer) is retried for about two
# minutes where azd grants you a role that reads the state table (by default the read
# of the state table alone, DEPLOYER_READS_STATE; or GRANT_DEPLOYER_DATA_ACCESS): it
# takes a while to apply on a first provision. Without one your login may read nothing:
# the check is then not made, and says so (docs/deployment.md, "Identity model and roles").
case "${GRANT_DEPLOYER_DATA_ACCESS:-}:${DEPLOYER_READS_STATE:-true}" in
true:* | TRUE:* | True:* | 1:* | yes:* | *:true | *:TRUE | *:True | *:1 | *:yes) granted=true ;;
*) granted=false ;;
esac
tries=1
while :; do
    "$python" -m admin deploy-check --declarations declarations
    status=$?
    [ "$status" -eq 3 ] && [ "$granted" = true ] && [ "$tries" -lt 8 ] || break
    echo "deploy-check: storage account $account did not answer (try $tries); again in 15 s" >&2
    tries=$((tries + 1))
    sleep 15
done
if [ "$status" -eq 3 ] && [ "$granted" = false ]; then
    echo "deploy-check: NOT CHECKED: your login could not read the state table of $account," \
        "and azd grants you no read of it (DEPLOYER_READS_STATE is off). To have the orders" \
        "in flight checked: azd env set DEPLOYER_READS_STATE true, azd provision, azd $phase" >&2
    exit 0
fi

case "$status" in
0) echo "deploy-check: safe to $phase" >&2 ;;
1) echo "deploy-check: REFUSED: the JSON above names the orders in flight and what they" \
    "still need (docs/operating.md, \"Upgrading\"). To $phase anyway: SKIP_DEPLOY_CHECK=true azd $phase" >&2 ;;
*) echo "deploy-check: could not check (exit $status, JSON above); to $phase without the" \
    "check: SKIP_DEPLOY_CHECK=true azd $phase" >&2 ;;
esac
exit "$status"
