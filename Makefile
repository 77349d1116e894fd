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
# Extra arguments for pytest (for example PYTEST_ARGS="-m 'not router'").
PYTEST_ARGS ?=
# Base URL `make smoke` checks when no profile is up (empty: read it from the run state).
BASE_URL ?=
# Route smoke takes: base (every request to BASE_URL) or polar (resolve like current Polar's client).
ROUTE ?=
# Profile for up/smoke/train: engine-direct, router-passthrough, patched-router or stock-router.
PROFILE ?= engine-direct
# Where the stack runs: docker (the GPU node) or local (emulated engines + real routers on 127.0.0.1).
RUNTIME ?= docker
# Task for `make train`: humaneval or mbpp.
TASK ?=
# 1: print and validate the launch of `make train` without running anything.
DRY_RUN ?=
# Router releases for `make router-matrix` (empty: sglang-router 0.1.0-0.3.2 and every smg release).
RELEASES ?=

VENV_PY := $(VENV)/bin/python
# POLARSTACK_VIA_MAKE: on failure the CLI prints its real exit code (make itself always exits 2).
CLI := POLARSTACK_VIA_MAKE=1 $(VENV)/bin/polarstack

.PHONY: verify-offline bench train verify help test smoke demo up down ps logs status build pin clean router-matrix _venv _runtime

help: ## list the public targets
	@grep -hE '^[a-z][a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-16s %s\n", $$1, $$2}'

_venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	@test -x $(VENV_PY) || $(PYTHON) -m venv $(VENV)
	@$(VENV_PY) -m pip install --quiet --disable-pip-version-check -e '.[test]'
	@touch $@

test: _venv ## run the whole test suite (unit, emulator, real routers, sandbox, static); no GPU or Docker needed
	@$(VENV_PY) -m pytest $(PYTEST_ARGS)

demo: _venv ## every profile up locally in turn, smoke, a table; exit 0 only if all behave as expected
	@$(CLI) demo

up: _venv _runtime ## start PROFILE (RUNTIME=docker: the GPU stack; RUNTIME=local: emulated engines + real router)
	@if [ "$(RUNTIME)" = local ]; then $(CLI) up --profile "$(PROFILE)"; else $(CLI) compose up --profile "$(PROFILE)"; fi

down: _venv _runtime ## stop what `make up` started; volumes are kept (RUNTIME=docker|local)
	@if [ "$(RUNTIME)" = local ]; then $(CLI) down; else $(CLI) compose down --profile "$(PROFILE)"; fi

ps: _venv _runtime ## list the stack's containers (docker) or processes (local)
	@if [ "$(RUNTIME)" = local ]; then $(CLI) status; else $(CLI) compose ps --profile "$(PROFILE)"; fi

logs: _venv ## last log lines of the docker stack (SERVICE=engine-0 to pick one)
	@$(CLI) compose logs --profile "$(PROFILE)" $(if $(SERVICE),--service "$(SERVICE)")

status: _venv ## what the local runtime has up
	@$(CLI) status

build: _venv ## build the images of PROFILE from the pins in configs/pins.env
	@$(CLI) compose build --profile "$(PROFILE)"

pin: _venv ## resolve base-image tags to digests in configs/pins.env (needs a registry; else changes nothing)
	@$(CLI) pin

clean: _venv ## remove the docker stack AND its volumes (models, checkpoints, logs), after asking
	@$(CLI) compose clean --profile "$(PROFILE)"

smoke: _venv ## prove the path yields trainable tokens (the profile that is up, or BASE_URL=..., ROUTE=base|polar)
	@$(CLI) smoke $(if $(BASE_URL),--base-url "$(BASE_URL)",--profile "$(PROFILE)" --runtime $(if $(filter command line environment,$(origin RUNTIME)),$(RUNTIME),auto)) $(if $(ROUTE),--route "$(ROUTE)")

train: _venv ## GRPO on TASK=humaneval|mbpp behind the smoke gate (DRY_RUN=1 prints and validates only)
	@test -n "$(TASK)" || { echo "make train needs TASK=humaneval or TASK=mbpp" >&2; exit 2; }
	@$(CLI) train --task "$(TASK)" $(if $(filter command line environment,$(origin PROFILE)),--profile "$(PROFILE)") --runtime $(if $(filter command line environment,$(origin RUNTIME)),$(RUNTIME),auto) $(if $(filter 1 yes true,$(DRY_RUN)),--dry-run)

verify-offline: _venv ## check every rendered command line and image pin against the pinned upstreams (no GPU)
	@$(CLI) verify-offline

bench: _venv ## measure every profile locally side by side; regenerates docs/benchmarks.md/.json/.png
	@$(VENV_PY) -m pip install --quiet --disable-pip-version-check -e '.[test,bench]'
	@$(CLI) bench

verify: _venv ## run all 164 canonical HumanEval solutions through the sandboxed verifier
	@$(CLI) verify --task humaneval

router-matrix: _venv ## measure router releases in front of the emulator; regenerates docs/router-matrix.md
	@$(CLI) routers matrix $(if $(RELEASES),--releases $(RELEASES)) --json docs/router-matrix.json --markdown docs/router-matrix.md

_runtime:
	@case "$(RUNTIME)" in docker|local) ;; *) echo "RUNTIME=$(RUNTIME) is not docker or local" >&2; exit 2;; esac

