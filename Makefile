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
ROUTE ?= base

VENV_PY := $(VENV)/bin/python
CLI := $(VENV)/bin/polarstack

.PHONY: help test smoke _venv

help: ## list the public targets
	@grep -hE '^[a-z][a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-16s %s\n", $$1, $$2}'

_venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	@test -x $(VENV_PY) || $(PYTHON) -m venv $(VENV)
	@$(VENV_PY) -m pip install --quiet --disable-pip-version-check -e '.[test]'
	@touch $@

test: _venv ## run the whole test suite (unit, emulator, real routers); no GPU or Docker needed
	@$(VENV_PY) -m pytest $(PYTEST_ARGS)

smoke: _venv ## prove the path yields trainable tokens (BASE_URL=..., ROUTE=base|polar)
	@test -n "$(BASE_URL)" || { echo "make smoke needs BASE_URL=http://127.0.0.1:PORT (or a profile that is up)" >&2; exit 2; }
	@$(CLI) smoke --base-url "$(BASE_URL)" --route "$(ROUTE)"
