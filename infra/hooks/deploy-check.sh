#!/bin/sh
# The deploy guard, as azd runs it before `provision` and before `deploy` (azure.yaml,
# hooks): python -m admin deploy-check against this environment's storage account, with
# your az / azd login. It fails the azd command when the declarations about to deploy
# remove an agent or a step that orders in flight still need (README, "Upgrading").
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

if [ -x .venv/bin/python ]; then
    python=.venv/bin/python
else
    python="$(command -v python3 || command -v python)"
fi

# This environment's account, identity-based, whatever the shell holds (a connection
# string to a local Azurite, another identity's settings).
unset AzureWebJobsStorage AzureWebJobsStorage__credential AzureWebJobsStorage__clientId \
    AzureWebJobsStorage__tableServiceUri AzureWebJobsStorage__queueServiceUri
export AzureWebJobsStorage__accountName="$account"

# --declarations declarations: the module the deployed app reads (Bicep sets no
# ORDERS_DECLARATIONS). Exit 3 (storage did not answer) is retried for about two
# minutes: the data roles azd grants you on a first provision take a while to apply.
tries=1
while :; do
    "$python" -m admin deploy-check --declarations declarations
    status=$?
    [ "$status" -eq 3 ] && [ "$tries" -lt 8 ] || break
    echo "deploy-check: storage account $account did not answer (try $tries); again in 15 s" >&2
    tries=$((tries + 1))
    sleep 15
done

case "$status" in
0) echo "deploy-check: safe to $phase" >&2 ;;
1) echo "deploy-check: REFUSED: the JSON above names the orders in flight and what they" \
    "still need (README, \"Upgrading\"). To $phase anyway: SKIP_DEPLOY_CHECK=true azd $phase" >&2 ;;
*) echo "deploy-check: could not check (exit $status, JSON above); to $phase without the" \
    "check: SKIP_DEPLOY_CHECK=true azd $phase" >&2 ;;
esac
exit "$status"
