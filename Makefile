# Two commands matter: `make run` (the demo) and `make test` (everything CI checks).
SHELL := /bin/bash
# Python 3.13: what the app runs on in Azure, and the first version azure-functions-runtime
# (the Functions Python runtime, which devhost drives) installs on. pyenv's first, then PATH.
PYTHON ?= $(firstword $(wildcard $(HOME)/.pyenv/versions/3.13*/bin/python3.13) \
	$(shell command -v python3.13 2>/dev/null))
VENV := .venv
BIN := $(VENV)/bin
PYTEST := $(BIN)/python -m pytest -p no:cacheprovider

.PHONY: infra-checks infra-venvs suites lane-checks lane-processes run test deps lint typecheck unit team-tests integration e2e browser browser-deps iac-check \
	index-check runtime-check chaos chaos-short bench \
	clean start test-servicebus localbus model model-check

# No Python 3.13 is a failure that says how to get one, not a skip.
$(BIN)/.ok: requirements.txt requirements-dev.txt
	@if [ -z "$(PYTHON)" ]; then \
	  echo "deps FAILED: no Python 3.13 found (the app and azure-functions-runtime, which" \
	       "runs it locally, need it). Install it, e.g. 'pyenv install 3.13' (looked in" \
	       "~/.pyenv/versions/3.13*/bin and on PATH), or point to one: make PYTHON=/path/to/python3.13" >&2; \
	  exit 1; \
	fi
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check -r requirements-dev.txt
	$(BIN)/python -c 'import hostrun.rpc; hostrun.rpc.load()'  # compile the vendored protos
	touch $@

node_modules/.ok: package.json package-lock.json
	npm ci --no-audit --no-fund --loglevel=error
	touch $@

deps: $(BIN)/.ok node_modules/.ok

# The agent queues on localbus, the local Service Bus double, as deployed (why:
# docs/benchmarks.md, "Idle latency"); TRANSPORT=storage: on Azurite's Storage queues
TRANSPORT ?= servicebus
SIMULATOR ?=

## make run: Azurite + simulator + two devhost instances + demo orders, live, then a summary
## (the agent queues on localbus, through the real SDK, as deployed; make run
## TRANSPORT=storage: on Azurite's Storage queues)
run: deps
	$(BIN)/python -m demo --transport $(TRANSPORT)

## make start: the app on Azurite and the simulator, until Ctrl-C (no demo orders);
## SIMULATOR='--compensation cancel-card=issue-card' passes arguments to the simulator
start: deps
	$(BIN)/python -m demo --serve --transport $(TRANSPORT) --simulator "$(SIMULATOR)"

## make test: lint, types, unit, your workflows' own tests (declarations/tests), the
## engine's model (a minute and a half of generated interleavings), integration (Azurite),
## e2e (processes), browser (the console in Chromium), chaos (short), infra. Three lanes
## side by side (the suites mostly wait on processes, queues and timers, and no test
## asserts how long anything took): the checks in process, then integration and the
## browser; the Bicep checks' virtual environment (pip installs, mostly waiting on the
## network), then the short chaos run and e2e; and the localbus suite (its own broker;
## mostly waiting on lock and expiry timers). The infra checks run last.
test: deps
	@$(MAKE) --no-print-directory -j3 lane-checks lane-processes localbus
	@$(MAKE) --no-print-directory infra-checks

## make check: lint, types and unit tests, the loop to run every few minutes (under 3 minutes)
.PHONY: check
check: deps
	@$(MAKE) --no-print-directory -j1 lint typecheck unit

lane-checks:
	@$(MAKE) --no-print-directory -j1 lint typecheck unit team-tests model integration browser

lane-processes:
	@$(MAKE) --no-print-directory -j1 .venv-iac/.ok chaos-short e2e

## every suite, one after the other (make test runs them in lanes)
suites:
	@$(MAKE) --no-print-directory -j1 lint typecheck unit team-tests model integration e2e browser chaos-short

## the Bicep checks (their own venv), the worker's indexer and the trigger shapes through
## the runtime, side by side
infra-checks:
	@$(MAKE) --no-print-directory -j2 iac-check index-check runtime-check

lint: deps
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: deps
	$(BIN)/mypy .

unit: deps
	$(PYTEST) tests/unit -q

## make team-tests: your workflows' own tests (declarations/tests, written with testkit/: each
## runs a declared workflow in process with fake remotes, in milliseconds); a pytest run of
## their own, on declarations/ (the product's suite runs on tests/fixtures/ instead)
team-tests: deps
	$(PYTEST) declarations/tests -q

## make model: the engine's model checker under pytest (tests/model: generated workflows and
## interleavings, every invariant of contract 3.15 after every transition)
model: deps
	$(PYTEST) tests/model -q

## make model-check: a longer search, every distinct failure listed (MODEL_BUDGET seconds,
## default an hour; MODEL_SEED for the first seed)
MODEL_BUDGET ?= 3600
model-check: deps
	$(BIN)/python -m tests.model --report --budget $(MODEL_BUDGET) $(if $(MODEL_SEED),--seed $(MODEL_SEED))

integration: deps
	$(PYTEST) tests/integration -q

## make localbus: the Service Bus contract tests against localbus (the local double), and
## devhost's Service Bus listener on it (a real namespace instead: make test-servicebus)
localbus: deps
	$(PYTEST) tests/localbus -q

e2e: deps .venv-iac/.ok
	$(PYTEST) tests/e2e -q

## make browser: the operator console in headless Chromium (Selenium), against the app in processes
browser: deps browser-deps
	$(PYTEST) tests/browser -q

## make browser-deps: Debian's chromium and chromium-driver, installed only when missing
browser-deps:
	@if [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]; then exit 0; fi; \
	if [ "$$(id -u)" = 0 ]; then sudo=""; \
	elif sudo -n true 2>/dev/null; then sudo="sudo -n"; \
	else \
	  echo "browser-deps FAILED: /usr/bin/chromium or /usr/bin/chromedriver is missing, and" \
	       "installing them needs root or passwordless sudo. Run: sudo apt-get install" \
	       "chromium chromium-driver" >&2; \
	  exit 1; \
	fi; \
	if ! command -v apt-get >/dev/null; then \
	  echo "browser-deps FAILED: no apt-get here; install Chromium and its driver as" \
	       "/usr/bin/chromium and /usr/bin/chromedriver" >&2; \
	  exit 1; \
	fi; \
	$$sudo apt-get update -q && \
	$$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium chromium-driver; \
	if [ ! -x /usr/bin/chromium ] || [ ! -x /usr/bin/chromedriver ]; then \
	  echo "browser-deps FAILED: apt-get did not provide /usr/bin/chromium and" \
	       "/usr/bin/chromedriver (see its output above)" >&2; \
	  exit 1; \
	fi

chaos-short: deps
	$(PYTEST) tests/chaos -q -m "not long"

chaos: deps
	$(PYTEST) tests/chaos -q

## make index-check: function_app.py through the Functions worker's own indexer
index-check: deps
	$(PYTEST) tests/indexing -q

## make runtime-check: the trigger-shape tests: what each function receives through
## azure-functions-runtime, driven as the host drives it (hostrun/), against the host's source
runtime-check: deps
	$(PYTEST) tests/runtime -q

.venv-iac/.ok: requirements-iac.txt
	$(PYTHON) -m venv .venv-iac && .venv-iac/bin/pip install -q -r requirements-iac.txt && touch $@

# INFRA_CHECKS_REQUIRED: here a missing checkov/pycep is an error (elsewhere tests/infra skips).
iac-check: .venv-iac/.ok
	INFRA_CHECKS_REQUIRED=1 .venv-iac/bin/python -m pytest tests/infra -q -p no:cacheprovider

## make test-servicebus: the Service Bus contract tests against a real namespace
## (SERVICEBUS_TEST_CONNECTION=<namespace>.servicebus.windows.net or a connection string)
test-servicebus: deps
	@test -n "$$SERVICEBUS_TEST_CONNECTION" || { echo "set SERVICEBUS_TEST_CONNECTION (see docs/local-development.md)"; exit 2; }
	$(PYTEST) tests/localbus/test_contract.py tests/integration/test_transport_contract.py -q -m servicebus

## make bench: the benchmarks (pipeline, latency, sweeps, recovery, cpu, isolation, decoder,
## foreach, turns, idle, capacity: about 30 minutes on 2 cores, capacity half of it), each printed and saved as
## bench/results/<name>-<UTC date-time>.json
## (make bench BENCHMARKS=sweeps BENCH_ARGS_sweeps="--finished 100000": one, with options)
BENCHMARKS ?= pipeline latency trace sweeps recovery cpu isolation decoder foreach turns idle capacity
BENCH_ARGS_pipeline ?= --orders 400
define bench_one
out="bench/results/$(1)-$$(date -u +%Y%m%dT%H%M%SZ).json"; echo "== bench.$(1) -> $$out" >&2; \
$(BIN)/python -m bench.$(1) $(BENCH_ARGS_$(1)) > "$$out" || failed="$$failed $(1)"; \
if [ -s "$$out" ]; then cat "$$out"; else rm -f "$$out"; fi;
endef

bench: deps
	@mkdir -p bench/results; failed=""; \
	$(foreach name,$(BENCHMARKS),$(call bench_one,$(name))) \
	if [ -n "$$failed" ]; then echo "bench FAILED:$$failed" >&2; exit 1; fi

clean:
	rm -rf $(VENV) .venv-iac node_modules run .mypy_cache .ruff_cache
