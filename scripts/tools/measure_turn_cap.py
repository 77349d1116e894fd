#!/usr/bin/env python3
"""Measure what the pinned agent CLI's --max-turns counts and how much of a tool's output it sends back (issue 34 point 12).

  .venv/bin/python scripts/tools/measure_turn_cap.py [--cli PATH] > configs/upstream/turn-cap.json

The task template caps each agent session with agent.settings.max_turns, which Polar's claude_code preset passes as
the CLI's --max-turns (configs/upstream/polar-harness-presets.json), and the token budget
(polarstack.checks.budget.turn_cap) assumes that one turn is one request to the engine, each adding the model's
output and one tool result to the next request. This runs the CLI (AGENT_CLI_PACKAGE@AGENT_CLI_VERSION, installed
with npm into a temporary prefix unless --cli names its binary) with the flags and environment of Polar's preset
against a stand-in of the Messages API on 127.0.0.1 that answers every agent request with one Bash tool call printing
OUTPUT_CHARS characters, and records:
- per --max-turns value, how many agent requests (requests carrying tools) the CLI made and how it ended;
- the max_tokens each request asks (CLAUDE_CODE_MAX_OUTPUT_TOKENS);
- the length of the tool result the CLI sent back for Bash outputs of several lengths, without and with
  BASH_MAX_OUTPUT_LENGTH in the agent's environment (the variable the CLI's Bash tool reads to cut its output: longer
  output is saved to a file and a 2 KB preview sent; whether it does is what is measured), and for a Read of a 2,000-line
  file.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts" / "tools"))
import measure_harness_prompt as harness  # noqa: E402  (the preset's flags and environment, the CLI install)

OUTPUT_CHARS = 100_000  # the default call: Bash printing this many characters
COMMAND = f"python3 -c \"print('ab ' * {OUTPUT_CHARS // 3})\""


def tool_result_chars(body: dict) -> list[int]:
    """Lengths of the tool_result blocks of the last user message of a request."""
    out = []
    for message in body.get("messages") or []:
        if message.get("role") != "user" or not isinstance(message.get("content"), list):
            continue
        for block in message["content"]:
            if block.get("type") != "tool_result":
                continue
            content = block.get("content")
            if isinstance(content, list):
                content = "".join(part.get("text", "") for part in content if isinstance(part, dict))
            out.append(len(content or ""))
    return out


class StandIn(BaseHTTPRequestHandler):
    requests: list[dict] = []
    calls: list[tuple[str, dict]] = [
        ("Bash", {"command": COMMAND})
    ]  # the n-th agent request's tool call (last repeats)
    lock = threading.Lock()

    def log_message(self, *args) -> None:
        pass

    def _send(self, status: int, content_type: str, data: bytes) -> None:
        self.send_response(status)
        self.send_header("content-type", content_type)
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        self._send(200, "application/json", b'{"data": [], "has_more": false}')

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("content-length") or 0)) or b"{}")
        path = self.path.split("?")[0]
        if path.endswith("/count_tokens"):
            self._send(200, "application/json", b'{"input_tokens": 1}')
            return
        if not path.endswith("/v1/messages"):
            self._send(200, "application/json", b"{}")
            return
        agent = bool(body.get("tools"))
        with StandIn.lock:
            StandIn.requests.append(
                {"agent": agent, "max_tokens": body.get("max_tokens"), "tool_result_chars": tool_result_chars(body)}
            )
            number = sum(1 for r in StandIn.requests if r["agent"])
        if agent:
            name, arguments = StandIn.calls[min(number, len(StandIn.calls)) - 1]
            block = {"type": "tool_use", "id": f"toolu_{number:04d}", "name": name, "input": {}}
            deltas = [{"type": "input_json_delta", "partial_json": json.dumps(arguments)}]
            stop = "tool_use"
        else:
            block, deltas, stop = {"type": "text", "text": ""}, [{"type": "text_delta", "text": "OK"}], "end_turn"
        message = {
            "id": f"msg_{number:04d}",
            "type": "message",
            "role": "assistant",
            "model": body.get("model"),
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": 1, "output_tokens": 1},
        }
        if not body.get("stream"):
            full = dict(block, input=arguments) if agent else {"type": "text", "text": "OK"}
            self._send(200, "application/json", json.dumps(dict(message, content=[full], stop_reason=stop)).encode())
            return
        events = [
            ("message_start", {"type": "message_start", "message": message}),
            ("content_block_start", {"type": "content_block_start", "index": 0, "content_block": block}),
            *[("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": d}) for d in deltas],
            ("content_block_stop", {"type": "content_block_stop", "index": 0}),
            (
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": stop, "stop_sequence": None},
                    "usage": {"output_tokens": 1},
                },
            ),
            ("message_stop", {"type": "message_stop"}),
        ]
        payload = "".join(f"event: {name}\ndata: {json.dumps(data)}\n\n" for name, data in events).encode()
        self._send(200, "text/event-stream", payload)


def run(binary: Path, max_turns: int, agent_env: dict[str, str], calls: list[tuple[str, dict]] | None = None) -> dict:
    StandIn.requests = []
    StandIn.calls = calls or [("Bash", {"command": COMMAND})]
    server = ThreadingHTTPServer(("127.0.0.1", 0), StandIn)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    with tempfile.TemporaryDirectory(prefix="ps-turns-") as tmp:
        home, workspace = Path(tmp) / "home", Path(tmp) / "workspace"
        home.mkdir()
        workspace.mkdir()
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(home),
            "LANG": "C.UTF-8",
            "ANTHROPIC_BASE_URL": f"http://127.0.0.1:{server.server_address[1]}",
            "ANTHROPIC_API_KEY": "sk-dummy-stand-in-only",
            "DISABLE_AUTOUPDATER": "1",
            "DISABLE_TELEMETRY": "1",
            **agent_env,
            **harness.PRESET_ENV,
            **{alias: harness.MODEL for alias in harness.MODEL_ALIASES},
        }
        try:
            proc = subprocess.run(
                [
                    str(binary),
                    *harness.PRESET_FLAGS,
                    "--max-turns",
                    str(max_turns),
                    "--model",
                    harness.MODEL,
                    "-p",
                    "Run the command you are given.",
                ],
                cwd=workspace,
                env=env,
                capture_output=True,
                text=True,
                timeout=300,
                stdin=subprocess.DEVNULL,
            )
        finally:
            server.shutdown()
    result = {}
    for line in proc.stdout.splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if event.get("type") == "result":
            result = {k: event.get(k) for k in ("subtype", "num_turns", "is_error")}
    agent = [r for r in StandIn.requests if r["agent"]]
    return {
        "max_turns": max_turns,
        "agent_env": agent_env,
        "exit_code": proc.returncode,
        "result": result,
        "agent_requests": len(agent),
        "other_requests": len(StandIn.requests) - len(agent),
        "max_tokens": sorted({r["max_tokens"] for r in agent if r["max_tokens"] is not None}),
        "tool_result_chars": [r["tool_result_chars"] for r in agent],
    }


def bash(chars: int) -> tuple[str, dict]:
    return ("Bash", {"command": f"python3 -c \"print('ab ' * {chars // 3})\""})


READ_FILE = "/tmp/polarstack-turn-cap-read.txt"
MAKE_FILE = (
    "Bash",
    {
        "command": f"python3 -c \"open('{READ_FILE}','w').write(''.join(f'line {{i}} ' + 'word ' * 20 + chr(10) for i in range(2000)))\""
    },
)
# The claude_code preset as Polar runs it (read in jxliu1216/ProRL-Agent-Server c04b8146, src/polar/agent/presets/
# claude_code.py ClaudeCodeHarness.run_steps; upstream's own file is not in the code index): the command is
# `claude ... -p INSTRUCTION 2>&1 | tee <agent log>`, so the session's exit status is tee's, not the CLI's.
PRESET = {
    "repo": "jxliu1216/ProRL-Agent-Server",
    "commit": "c04b8146832afcba97e9e68e86cde03a09c472f2",
    "file": "src/polar/agent/presets/claude_code.py",
    "function": "ClaudeCodeHarness.run_steps",
    "fact": "the CLI runs as `claude <flags> --model M -p INSTRUCTION 2>&1 | tee <log>`: the step's exit status is tee's, "
    "so a session the CLI ends at --max-turns (its exit 1, result error_max_turns) is not a failed command",
    "agent_env_first": "the step's env is agent.env first, then CLAUDE_CONFIG_DIR, IS_SANDBOX and the model aliases",
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cli", default=None, help="the CLI's binary (default: npm install the pinned one)")
    args = parser.parse_args()
    table = harness.pins()
    package, version = table["AGENT_CLI_PACKAGE"], table["AGENT_CLI_VERSION"]
    cap = {"CLAUDE_CODE_MAX_OUTPUT_TOKENS": "4096"}
    knob = {"BASH_MAX_OUTPUT_LENGTH": "2000"}
    with tempfile.TemporaryDirectory(prefix="ps-cli-") as prefix:
        binary = Path(args.cli) if args.cli else harness.install_cli(package, version, Path(prefix))
        turns = [run(binary, n, cap) for n in (1, 2, 4)]
        turns.append(run(binary, 2, {"CLAUDE_CODE_MAX_OUTPUT_TOKENS": "2048"}))
        outputs = []
        for env in ({}, knob):
            for chars in (5_000, 29_000, 31_000, 100_000):
                result = run(binary, 2, {**cap, **env}, [bash(chars)])
                outputs.append(
                    {"agent_env": env, "output_chars": chars, "tool_result_chars": result["tool_result_chars"][1][0]}
                )
        read = run(binary, 3, {**cap, **knob}, [MAKE_FILE, ("Read", {"file_path": READ_FILE})])
        read_bytes = Path(READ_FILE).stat().st_size
        Path(READ_FILE).unlink()
    record = {
        "what": "What the pinned agent CLI's --max-turns counts (agent requests per session) and how long a tool "
        "result it sends back, measured against a stand-in of the Messages API that answers every agent request "
        "with one tool call; see scripts/tools/measure_turn_cap.py.",
        "agent_cli": {"package": package, "version": version},
        "recorded_on": datetime.date.today().isoformat(),
        "recorded_with": "scripts/tools/measure_turn_cap.py",
        "turns": turns,
        "bash_outputs": outputs,
        "read": {
            "file_bytes": read_bytes,
            "agent_env": {**cap, **knob},
            "tool_result_chars": read["tool_result_chars"][-1][-1],
            "note": "the stand-in answers count_tokens with 1 token, so the CLI's own token limit on Read was not "
            "exercised; its size gate (256 KB) was: what the Read tool returns is bounded by no setting of the stack",
        },
        "polar_preset": PRESET,
    }
    json.dump(record, sys.stdout, indent=1)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
