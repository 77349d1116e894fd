"""Engines the local runtime and the benches start on 127.0.0.1: the sglang stand-in (`polarstack emulate-engine`)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from polarstack.engine import tool_parser
from polarstack.errors import StackError
from polarstack.processes import child_env, free_port, startup_seconds, stop_pid, wait_http

# What the stand-in needs to answer /health on a quiet machine (about a second), with a margin: the base of the rule.
EMULATOR_START_SECONDS = 30.0


def stack_parser(settings: Mapping[str, str]) -> str | None:
    """The tool-call parser the stack's engines run: ENGINE_TOOL_CALL_PARSER in `settings` (the caller's stack settings:
    the site's, profiles.stack_settings), None when it is unset or empty."""
    return settings.get(tool_parser.PARSER_KNOB) or None


def start_emulator(
    port: int | None = None,
    *,
    model: str | None = None,
    seed: int = 0,
    log_path: Path | None = None,
    timeout: float | None = None,
    tool_call_parser: str | None,
    engine_args: list[str] | None = None,
) -> tuple[subprocess.Popen, int]:
    """Start `polarstack emulate-engine` on 127.0.0.1 and wait until /health answers; (process, port).
    `tool_call_parser`: the parser it runs, the caller's (stack_parser: the stack's, as the engines run); None: no
    parser. `timeout` None: processes.startup_seconds(EMULATOR_START_SECONDS), the machine's rule (a fixed 30 s failed
    three matrix tests at load 14-19 on 2 cores)."""
    if timeout is None:
        timeout = startup_seconds(EMULATOR_START_SECONDS)
    port = port or free_port()
    cmd = [sys.executable, "-m", "polarstack", "emulate-engine", "--port", str(port), "--seed", str(seed)]
    if tool_call_parser:
        cmd += ["--tool-call-parser", tool_call_parser]
    if model:
        cmd += ["--model", model]
    cmd += list(engine_args or [])  # e.g. the service-time flags of `emulate-engine`
    log = open(log_path, "wb") if log_path else subprocess.DEVNULL
    try:
        process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=child_env())
    finally:
        if log_path:
            log.close()
    try:
        wait_http(f"http://127.0.0.1:{port}", timeout, process)
    except StackError:
        stop_pid(process.pid, process)
        raise
    return process, port
