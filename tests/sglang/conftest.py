"""The real-engine tier (marker `sglang`): the pinned sglang on the CPU with a tiny random Qwen2 model.

Two servers at most, shared by the whole session (about 4 GB of memory each): `real_engine` runs with the stack's
`--tool-call-parser` (ENGINE_TOOL_CALL_PARSER), `real_engine_no_parser` without one. Both start lazily, once, and
are stopped by their pid at the end of the session (POLARSTACK_SGLANG_URL / POLARSTACK_SGLANG_URL_NO_PARSER reuse
servers already running instead). Run the tier in one process (`-n 0`): every xdist worker would
start its own pair. Without the install (`polarstack sglang-install`) the tier skips and says so, unless
POLARSTACK_REQUIRE_SGLANG=1 (CI), which makes a missing install a failure.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from polarstack import paths
from polarstack.engine import tool_parser
from polarstack.processes import startup_seconds
from polarstack.stack import real_sglang
from polarstack.stack.profiles import knob

REQUIRE_ENV = "POLARSTACK_REQUIRE_SGLANG"
# Reuse servers already running (with the stack's parser / without one) instead of starting them: URLs.
REUSE_ENV = "POLARSTACK_SGLANG_URL"
# A first request, two servers starting at once on 2 loaded cores: each tier test may take this long.
TIER_TIMEOUT = 900


def pytest_collection_modifyitems(config, items):
    here = os.path.dirname(__file__)
    for item in items:
        if str(item.fspath).startswith(here):
            item.add_marker(pytest.mark.sglang)
            item.add_marker(pytest.mark.timeout(TIER_TIMEOUT))


def _require_install() -> None:
    if real_sglang.is_installed():
        return
    message = (
        f"{real_sglang.spec()} is not installed under {real_sglang.venv_dir()} "
        "(run `polarstack sglang-install`, about 4.8 GB download)"
    )
    if os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(message + f"; {REQUIRE_ENV}=1 requires it")
    pytest.skip(message)


def _start(parser: str | None) -> real_sglang.RealEngine:
    if os.environ.get("PYTEST_XDIST_WORKER"):
        message = "the real-engine tier runs in one process (-n 0): each xdist worker would start its own servers"
        if os.environ.get(REQUIRE_ENV) == "1":
            pytest.fail(message)
        pytest.skip(message)
    _require_install()
    real_sglang.prepare(progress=lambda m: print(m, flush=True))
    return real_sglang.start(
        served_model_name=knob(None, "SERVED_MODEL_NAME"),
        # its READY_TIMEOUT, longer on a loaded machine (polarstack.processes.startup_seconds), within the test's own
        timeout=startup_seconds(real_sglang.READY_TIMEOUT, ceiling=TIER_TIMEOUT - 120),
        tool_call_parser=parser,
        log_path=paths.cache_dir() / "logs" / f"sglang-tier-{'parser' if parser else 'no-parser'}.log",
    )


@dataclass
class Running:
    """A real server the tier did not start (REUSE_ENV): only its URL."""

    url: str


def _engine(parser: str | None, reuse_env: str) -> Iterator:
    if os.environ.get(reuse_env):  # a server already running with this parser setting (while writing tests)
        _require_install()
        yield Running(os.environ[reuse_env].rstrip("/"))
        return
    engine = _start(parser)
    try:
        yield engine
    finally:
        engine.stop()


@pytest.fixture(scope="session")
def real_engine() -> Iterator:
    yield from _engine(knob(None, "ENGINE_TOOL_CALL_PARSER") or None, REUSE_ENV)


@pytest.fixture(scope="session")
def real_engine_no_parser() -> Iterator:
    yield from _engine(None, REUSE_ENV + "_NO_PARSER")


@pytest.fixture(scope="session")
def scripted_tool_fields(real_engine) -> dict:
    """Request fields that make the random model answer the smoke's tool request with one Qwen tool call."""
    return real_sglang.scripted_answer(tool_parser.smoke_call_text())
