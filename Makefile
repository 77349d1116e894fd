# polarstack: Polar + slime GRPO on SGLang, proven to yield trainable tokens before training starts.
# `make help` lists the public targets. Private helpers start with `_`.

SHELL := bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help
MAKEFLAGS += --no-print-directory

# Python used to create the project's virtual environment (3.11+).
PYTHON ?= python3
# The project's virtual environment.
VENV ?= .venv
VENV_PY := $(VENV)/bin/python
# Extra arguments for pytest (for example PYTEST_ARGS="-m 'not router'").
PYTEST_ARGS ?=
# The pytest both tiers of `make test` run (a test of the Makefile sets a fake one).
PYTEST ?= $(VENV_PY) -m pytest
# Tiers `make test-deps` installs for (tests/tier_deps.py): test (`make test`), cluster (`make test-cluster`).
TEST_TIERS ?= test
# Parallel pytest workers (pytest-xdist): the suite mostly waits on processes it starts, so 4 on 2 cores. They take
# at most 2 tests at a time (--maxschedchunk 2), the slowest files first (tests/conftest.py HEAVY_FIRST).
PYTEST_WORKERS ?= 4
# Base URL `make smoke` checks when no profile is up (empty: read it from the run state).
BASE_URL ?=
# Route smoke takes: base (every request to BASE_URL) or polar (resolve like current Polar's client).
ROUTE ?=
# Profile for up/smoke/train: engine-direct, router-passthrough, patched-router or stock-router
# (empty: the profile `make up` started, recorded in .run/docker-state.json, else engine-direct).
PROFILE ?=
# Where the stack runs: docker (the GPU node) or local (emulated engines + real routers on 127.0.0.1)
# (empty: up/ps act on docker; smoke/train/down let the CLI choose the stack that is up, refused when two are).
RUNTIME ?=
# Task for `make train`: humaneval or mbpp.
TASK ?=
# 1: print and validate the launch of `make train` without running anything.
DRY_RUN ?=
# 1: `make train` continues the run's last checkpoint (refused when there is none).
RESUME ?=
# Overrides of configs/train/defaults.yaml for `make train`, space-separated key=value (e.g. SET="checkpoint.save_interval=10").
SET ?=
# 1: `make train` on the docker runtime launches without a passing `make preflight` record of these pins, profile, plan.
ALLOW_NO_PREFLIGHT ?=
# Engines of the local runtime (`make up RUNTIME=local`, `make demo`): emulator (empty: the CPU stand-in) or sglang
# (the real pinned sglang on the CPU with a tiny random model; installed once, about 4.8 GB download, 4 GB RAM each).
ENGINE ?=
# Router releases for `make router-matrix` (empty: sglang-router 0.1.0-0.3.2 and every smg release).
RELEASES ?=
# Device of the docker runtime: empty (the GPU node, or the CPU stack when only its record is up: polarstack.cli.site)
# or cpu (a machine without GPU or registry: bases made here by `make bases DEVICE=cpu`, compose/compose.cpu.yaml, the
# tiny model, its own Compose project, run state and ports).
DEVICE ?=
# Requests each way for the matrix's latency columns (empty: 200, or 20 with ENGINE=sglang).
LATENCY_REQUESTS ?=

# POLARSTACK_VIA_MAKE: on failure the CLI prints its real exit code (make itself always exits 2).
CLI := POLARSTACK_VIA_MAKE=1 $(if $(DEVICE),POLARSTACK_DEVICE="$(DEVICE)") $(VENV)/bin/polarstack
_PROFILE_ARG = $(if $(PROFILE),--profile "$(PROFILE)")
_RUNTIME_ARG = $(if $(RUNTIME),--runtime "$(RUNTIME)")
_ENGINE_ARG = $(if $(ENGINE),--engine "$(ENGINE)")
# Run a command and print its wall-clock time (GPU-node steps take minutes to hours; see README "On the GPU node").
_timed = started=$$(date +%s); rc=0; $(1) || rc=$$?; echo "make $@: $$(( $$(date +%s) - started )) s (exit $$rc)" >&2; exit $$rc

.PHONY: cluster-check bases dockerd dockerd-stop test-docker test-slow test-cluster test-deps verify-offline bench train preflight verify help test lint smoke demo up down ps logs status build pin clean router-matrix model sif _venv _runtime

help: ## list the public targets
	@grep -hE '^[a-z][a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-16s %s\n", $$1, $$2}'

_venv: $(VENV)/.installed

# pip's cache, and the ~/.rustup a rustup proxy creates when pip runs `rustc --version`, under the project's cache
# rather than HOME (the CLI's own pip and npm runs: polarstack.paths.tool_homes).
_CACHE := $(or $(POLARSTACK_CACHE),$(or $(XDG_CACHE_HOME),$(HOME)/.cache)/polarstack)
_TOOL_HOMES = $(if $(PIP_CACHE_DIR),,PIP_CACHE_DIR="$(_CACHE)/pip") $(if $(RUSTUP_HOME)$(wildcard $(HOME)/.rustup),,RUSTUP_HOME="$(_CACHE)/rustup")
# A cold install is minutes of silent pip (157 s measured: `time make _venv` in a fresh worktree, empty pip cache,
# 2 cores shared with other work): a line before and one after, with its time.
$(VENV)/.installed: pyproject.toml
	@test -x $(VENV_PY) || $(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null || { \
	  echo "make: $(PYTHON) is not Python 3.11 or newer ($$($(PYTHON) --version 2>/dev/null || echo not found)); install one and run make PYTHON=python3.11 ..." >&2; exit 8; }
	@test -x $(VENV_PY) || $(_TOOL_HOMES) $(PYTHON) -m venv $(VENV)
	@echo "make: installing polarstack and its test tools into $(VENV) (pip, from pyproject.toml; minutes when cold) ..." >&2
	@started=$$(date +%s); $(_TOOL_HOMES) $(VENV_PY) -m pip install --quiet --disable-pip-version-check -e '.[test]'; \
	  echo "make: $(VENV) ready in $$(( $$(date +%s) - started )) s" >&2
	@touch $@

test-deps: _venv ## install what the test tiers start (pinned Ray, router releases, pin-check wheels) before pytest runs, with progress (TEST_TIERS="test cluster")
	@$(VENV_PY) tests/tier_deps.py $(TEST_TIERS)

# Both tiers always run, the real-engine tier also when the first failed; make test fails if either did
# (pytest's 5, no test selected by PYTEST_ARGS, counts as passed).
test: _venv ## the whole suite: tiers in parallel, then the real-engine tier (skipped until `polarstack sglang-install`); both always run; no GPU or Docker
	@$(MAKE) test-deps TEST_TIERS=test
	@started=$$(date +%s); first=0; $(PYTEST) -n $(PYTEST_WORKERS) --maxschedchunk 2 -m "not sglang and not docker and not cluster and not slow" $(PYTEST_ARGS) || first=$$?; \
	  echo "make test: tiers without the real engine took $$(( $$(date +%s) - started )) s (exit $$first)" >&2; \
	  started=$$(date +%s); second=0; $(PYTEST) -p no:xdist -m sglang $(PYTEST_ARGS) || second=$$?; \
	  echo "make test: the real-engine tier (sglang) took $$(( $$(date +%s) - started )) s (exit $$second)" >&2; \
	  failed=""; [ "$$first" = 0 ] || [ "$$first" = 5 ] || failed="tiers without the real engine (exit $$first)"; \
	  [ "$$second" = 0 ] || [ "$$second" = 5 ] || failed="$${failed:+$$failed and }the real-engine tier (exit $$second)"; \
	  if [ -n "$$failed" ]; then echo "make test: FAILED: $$failed" >&2; exit 1; fi

test-slow: _venv ## the slow tier: the verifier's starved-watchdog candidate (in a memory cgroup of its own) and right answers at load 8 (12-37 s measured here)
	@started=$$(date +%s); rc=0; $(VENV_PY) -m pytest -p no:xdist -m slow tests/sandbox $(PYTEST_ARGS) || rc=$$?; \
	  echo "make test-slow: the slow tier took $$(( $$(date +%s) - started )) s (exit $$rc)" >&2; exit $$rc

test-cluster: _venv ## the cluster tier: two nodes in network namespaces (root, ip netns): Ray with its token, the router, the smoke per node, what an outsider reaches
	@$(MAKE) test-deps TEST_TIERS=cluster
	@started=$$(date +%s); rc=0; $(VENV_PY) -m pytest -p no:xdist -m cluster tests/cluster $(PYTEST_ARGS) || rc=$$?; \
	  echo "make test-cluster: the cluster tier took $$(( $$(date +%s) - started )) s (exit $$rc)" >&2; exit $$rc

test-docker: _venv ## the docker tier: faults of the Docker runtime, make demo RUNTIME=docker on a real engine, the verifier in the sessions' namespace shape inside the trainer (DEVICE=cpu; needs DOCKER_HOST or `make dockerd`)
	@started=$$(date +%s); rc=0; $(VENV_PY) -m pytest -p no:xdist -m docker tests/docker $(PYTEST_ARGS) || rc=$$?; \
	  echo "make test-docker: the docker tier took $$(( $$(date +%s) - started )) s (exit $$rc)" >&2; exit $$rc

lint: _venv ## ruff (check and format) and the package's import layers (import-linter); no network needed
	@$(VENV)/bin/ruff check .
	@$(VENV)/bin/ruff format --check .
	@$(VENV)/bin/lint-imports

demo: _venv _runtime ## every profile up in turn, smoke, a table; exit 0 only if all behave as expected (ENGINE=sglang: real engine; RUNTIME=docker: real engines in containers)
	@if [ "$(RUNTIME)" = docker ]; then $(call _timed,$(CLI) demo --runtime docker); else $(CLI) demo $(_ENGINE_ARG); fi

up: _venv _runtime ## start PROFILE (RUNTIME=docker: the GPU stack; RUNTIME=local: emulated engines, or ENGINE=sglang real ones, + real router)
	@if [ "$(RUNTIME)" = local ]; then $(CLI) up --profile "$(or $(PROFILE),engine-direct)" $(_ENGINE_ARG); else $(call _timed,$(CLI) compose up $(_PROFILE_ARG)); fi

down: _venv _runtime ## stop the stack that is up (either runtime, either device; RUNTIME= to pick one when two are); volumes are kept
	@$(CLI) down --runtime "$(or $(RUNTIME),auto)" $(_PROFILE_ARG)

ps: _venv _runtime ## list the stack's containers (docker) or processes (local)
	@if [ "$(RUNTIME)" = local ]; then $(CLI) status; else $(CLI) compose ps $(_PROFILE_ARG); fi

logs: _venv ## last log lines of the docker stack (SERVICE=engine-0 to pick one)
	@$(CLI) compose logs $(_PROFILE_ARG) $(if $(SERVICE),--service "$(SERVICE)")

status: _venv ## what the local runtime has up
	@$(CLI) status

build: _venv ## build the images of PROFILE from the pins in configs/pins.env
	@$(call _timed,$(CLI) compose build $(_PROFILE_ARG))

model: _venv ## download MODEL_NAME into the models volume (hf download, resumable, verified); or set MODEL_DIR=/path
	@$(call _timed,$(CLI) compose model $(_PROFILE_ARG))

sif: _venv ## build the agent sandbox (polarstack-code.sif + the pinned agent CLI dir) into the models volume
	@$(call _timed,$(CLI) compose sif $(_PROFILE_ARG))

bases: _venv ## DEVICE=cpu: make the CPU base images here from Debian and PyPI (cached; never pulled)
	@$(call _timed,$(CLI) bases)

dockerd: _venv ## start a private Docker engine (data root under the cache, socket under /tmp; prints DOCKER_HOST=...)
	@$(CLI) dockerd start

dockerd-stop: _venv ## stop the private Docker engine by its pid and remove its mounts
	@$(CLI) dockerd stop

pin: _venv ## resolve base-image tags to digests in configs/pins.env (needs a registry; else changes nothing)
	@$(CLI) pin

clean: _venv ## remove the docker stack AND its volumes (models, checkpoints, logs), after asking
	@$(CLI) compose clean $(_PROFILE_ARG)

smoke: _venv ## prove the path yields trainable tokens (the profile that is up, or BASE_URL=..., ROUTE=base|polar)
	@$(call _timed,$(CLI) smoke $(if $(BASE_URL),--base-url "$(BASE_URL)",$(_PROFILE_ARG) $(_RUNTIME_ARG)) $(if $(ROUTE),--route "$(ROUTE)"))

train: _venv ## GRPO on TASK=humaneval|mbpp behind the smoke gate (DRY_RUN=1 validates only, RESUME=1 continues, SET="k=v"; needs a passing make preflight unless ALLOW_NO_PREFLIGHT=1)
	@test -n "$(TASK)" || { echo "make train needs TASK=humaneval or TASK=mbpp" >&2; exit 2; }
	@$(call _timed,$(CLI) train --task "$(TASK)" $(_PROFILE_ARG) $(_RUNTIME_ARG) $(if $(filter 1 yes true,$(DRY_RUN)),--dry-run) $(if $(filter 1 yes true,$(RESUME)),--resume) $(if $(filter 1 yes true,$(ALLOW_NO_PREFLIGHT)),--without-rehearsal) $(foreach s,$(SET),--set "$(s)"))

preflight: _venv ## rehearse the real stack at toy scale on the node: small model, 2 rollouts, save, resume, 1 more (DRY_RUN=1 validates only)
	@$(call _timed,$(CLI) preflight $(_PROFILE_ARG) $(if $(filter 1 yes true,$(DRY_RUN)),--dry-run) $(foreach s,$(SET),--set "$(s)"))

cluster-check: _venv ## NODES>1: every node's report, pins, Ray membership, ports, clock, GPUs and memory (docs/multi-node.md)
	@$(CLI) cluster check $(_PROFILE_ARG)

verify-offline: _venv ## check every rendered command line and image pin against the pinned upstreams (no GPU)
	@$(CLI) verify-offline

bench: _venv ## measure every profile locally side by side; regenerates docs/benchmarks.md/.json/.png
	@echo "make: installing the bench's plot tools (matplotlib, pyproject.toml's bench extra) into $(VENV) ..." >&2
	@started=$$(date +%s); $(_TOOL_HOMES) $(VENV_PY) -m pip install --quiet --disable-pip-version-check -e '.[test,bench]'; \
	  echo "make: the bench's tools ready in $$(( $$(date +%s) - started )) s" >&2
	@$(CLI) bench

verify: _venv ## run all 164 canonical HumanEval solutions through the sandboxed verifier
	@$(CLI) verify --task humaneval

# ENGINE=sglang writes docs/router-matrix-sglang.{json,md}: the emulator's report stays as it was measured. A subset
# (RELEASES=...) goes to .run/, so it never replaces a committed report of every release.
_MATRIX_OUT = $(if $(RELEASES),.run,docs)/router-matrix$(if $(filter sglang,$(ENGINE)),-sglang)
router-matrix: _venv ## measure router releases in front of the emulator (ENGINE=sglang: the real engine; RELEASES=, LATENCY_REQUESTS=); regenerates docs/router-matrix*.md
	@$(CLI) routers matrix $(if $(RELEASES),--releases $(RELEASES)) $(_ENGINE_ARG) $(if $(LATENCY_REQUESTS),--latency-requests $(LATENCY_REQUESTS)) --json $(_MATRIX_OUT).json --markdown $(_MATRIX_OUT).md

_runtime:
	@case "$(RUNTIME)" in ""|docker|local) ;; *) echo "RUNTIME=$(RUNTIME) is not docker or local" >&2; exit 2;; esac

