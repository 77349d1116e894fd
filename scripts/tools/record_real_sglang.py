#!/usr/bin/env python3
"""Record what running the real pinned sglang on the CPU relies on, read from the wheels themselves.

From the pinned wheel (SGLANG_VERSION, `pip download --no-deps`, as polarstack.engine.protocol does): its torch
requirement, the CPU switch (`SGLANG_USE_CPU_ENGINE`), the x86 CPU attention default, each launch flag
polarstack.stack.real_sglang passes, the custom logit processor's loading, and tokenizer_manager.py's two length errors
(the emulator answers with the same sentences). From sglang 0.5.23 (the newer release that does not start on the
CPU): the unguarded CPU-kernel import that stops it.

Run from the repository with its venv after a pin change:
  .venv/bin/python scripts/tools/record_real_sglang.py > configs/upstream/real-sglang-cpu.json
"""

import json
import re
import subprocess
import sys
import zipfile
from pathlib import Path

from polarstack.paths import cache_dir
from polarstack.pins import pin
from polarstack.stack import real_sglang

NEWER = "0.5.23"  # the newer release checked (issue 21): it does not start on the CPU


def wheel(version: str) -> Path:
    folder = cache_dir() / "wheels"
    folder.mkdir(parents=True, exist_ok=True)
    found = sorted(folder.glob(f"sglang-{version}-*.whl"))
    if not found:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", f"sglang=={version}", "-d", str(folder)],
            check=True,
        )
        found = sorted(folder.glob(f"sglang-{version}-*.whl"))
    return found[0]


def read(zf: zipfile.ZipFile, member: str) -> list[str]:
    return zf.read(member).decode("utf-8").splitlines()


def line_of(lines: list[str], pattern: str, start: int = 0) -> int:
    """1-based number of the first line at or after `start` matching `pattern` (a regex)."""
    for number, text in enumerate(lines[start:], start + 1):
        if re.search(pattern, text):
            return number
    raise SystemExit(f"pattern {pattern!r} not found")


def block(lines: list[str], first: int, count: int) -> list[str]:
    return [text.strip() for text in lines[first - 1 : first - 1 + count]]


def fstring_text(lines: list[str], first: int, last: int) -> str:
    """The concatenated f-string pieces of lines first..last (the message as sglang writes it, {names} kept)."""
    pieces = []
    for text in lines[first - 1 : last]:
        pieces += re.findall(r'f?"((?:[^"\\]|\\.)*)"', text)
    return "".join(pieces)


def main() -> None:
    version = pin("SGLANG_VERSION")
    facts: dict = {}
    with zipfile.ZipFile(wheel(version)) as zf:
        meta = read(zf, f"sglang-{version}.dist-info/METADATA")
        torch_req = next(x.split(":", 1)[1].strip() for x in meta if re.match(r"Requires-Dist: torch[=<>]", x))
        facts["torch_requirement"] = {
            "file": f"sglang-{version}.dist-info/METADATA",
            "requires": torch_req,
            "fact": "PyPI's torch at this version is a CUDA build (its libraries load without a GPU); the machine's "
            "pip cap (/etc/xdg/pip, torch<=2.14.1) admits it, so a plain pip install resolves",
        }
        common = read(zf, "sglang/srt/utils/common.py")
        n = line_of(common, r"def is_cpu\(")
        facts["cpu_switch"] = {
            "file": "sglang/srt/utils/common.py",
            "line": n,
            "source": block(common, n, 3),
            "env": "SGLANG_USE_CPU_ENGINE",
        }
        args = read(zf, "sglang/srt/server_args.py")
        n = line_of(args, r"def _handle_cpu_backends\(")
        facts["cpu_attention_default"] = {
            "file": "sglang/srt/server_args.py",
            "line": n,
            "source": block(args, n, 7),
            "fact": "--device cpu defaults the attention backend to intel_amx on x86 (needs AMX); the stack passes "
            "--attention-backend torch_native",
        }
        n = line_of(args, r"^ATTENTION_BACKEND_CHOICES = \[")
        end = line_of(args, r"^\]", n)
        facts["attention_backend_choices"] = {
            "file": "sglang/srt/server_args.py",
            "line": n,
            "choices": list(dict.fromkeys(re.findall(r'"([a-z0-9_]+)"', "\n".join(args[n - 1 : end])))),
        }
        n = line_of(args, r'"--disable-cuda-graph"')
        facts["disable_cuda_graph"] = {
            "file": "sglang/srt/server_args.py",
            "line": n,
            "source": block(args, n, 4),
            "fact": "a deprecated alias the pinned release still accepts (it sets both cuda-graph backends to "
            "disabled)",
        }
        n = line_of(args, r"^    max_total_tokens: A\[")
        facts["max_total_tokens"] = {
            "file": "sglang/srt/server_args.py",
            "line": n,
            "fact": "unset, the KV pool is sized from the memory fraction (on a CPU: the machine's memory; measured "
            "69 M tokens, 16.5 GB, and the scheduler killed on the first request); the stack passes "
            f"--max-total-tokens {real_sglang.MAX_TOTAL_TOKENS}",
        }
        n = line_of(args, r"^    enable_custom_logit_processor: A\[")
        facts["enable_custom_logit_processor"] = {
            "file": "sglang/srt/server_args.py",
            "line": n,
            "source": block(args, n, 4),
        }
        n = line_of(args, r"grpc_port_env if grpc_port_env is not None else self.port \+ (\d+)")
        offset = int(re.search(r"self.port \+ (\d+)", args[n - 1]).group(1))
        m = line_of(args, r"if not \(1 <= self.grpc_port <= 65535\)", n)
        facts["grpc_port"] = {
            "file": "sglang/srt/server_args.py",
            "line": n,
            "check_line": m,
            "offset": offset,
            "fact": "the gRPC port defaults to --port + offset and must be at most 65535 (gRPC on or off), so a "
            "server refuses a --port above 65535 - offset; polarstack.stack.real_sglang.free_server_port stays below it",
        }
        n = line_of(args, r"^    sleep_on_idle: A\[")
        facts["sleep_on_idle"] = {
            "file": "sglang/srt/server_args.py",
            "line": n,
            "source": block(args, n, 1),
            "fact": "without it an idle scheduler polls at ~90% of a core (measured); the stack passes --sleep-on-idle",
        }
        server = read(zf, "sglang/srt/entrypoints/http_server.py")
        n = line_of(server, r'^@app.get\("/health"\)')
        m = line_of(server, r"await asyncio.sleep\(1\)", n)
        environ = read(zf, "sglang/srt/environ.py")
        e = line_of(environ, r"SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION = ")
        facts["health_generation"] = {
            "file": "sglang/srt/entrypoints/http_server.py",
            "line": n,
            "sleep_line": m,
            "env": {"file": "sglang/srt/environ.py", "line": e, "source": block(environ, e, 1)},
            "fact": "by default /health generates one token and sleeps 1 s before it looks, so it never answers within "
            "the stack's 1-s readiness polls; the CPU servers run with SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION=0 "
            "(/health answers 200 once the warm-up finished)",
        }
        processor = read(zf, "sglang/srt/sampling/custom_logit_processor.py")
        n = line_of(processor, r"def _cache_from_str\(")
        batch = read(zf, "sglang/srt/managers/schedule_batch.py")
        m = line_of(batch, r'"__req__": self')
        facts["custom_logit_processor"] = {
            "file": "sglang/srt/sampling/custom_logit_processor.py",
            "line": n,
            "source": block(processor, n, 6),
            "req_injected": {"file": "sglang/srt/managers/schedule_batch.py", "line": m},
            "fact": "the request's custom_logit_processor string is dill-loaded on the server (a class defined in "
            "__main__ travels by value) and each request's custom_params carries its Req as __req__ (output_ids)",
        }
        manager = read(zf, "sglang/srt/managers/tokenizer_manager.py")
        n = line_of(manager, r"def _validate_one_request\(")
        too_long = line_of(manager, r"raise ValueError\(", n)
        total = line_of(manager, r'f"Requested token count exceeds the model', n)
        total_end = line_of(manager, r"to fit within the limit", total)
        facts["length_errors"] = {
            "file": "sglang/srt/managers/tokenizer_manager.py",
            "line": n,
            "input_too_long": fstring_text(manager, too_long + 1, too_long + 2),
            "total_tokens": fstring_text(manager, total, total_end),
            "fact": "the chat route answers these ValueErrors with HTTP 400 and the sentence as the message",
        }
    with zipfile.ZipFile(wheel(NEWER)) as zf:
        move = read(zf, "sglang/kernels/ops/kvcache/cache_move.py")
        n = line_of(move, r"from sgl_kernel import copy_all_layer_kv_cache_cpu")
        pool = read(zf, "sglang/srt/mem_cache/memory_pool.py")
        m = line_of(pool, r"from sglang.kernels.ops.kvcache.cache_move import")
        facts["newer_release_fails_on_cpu"] = {
            "version": NEWER,
            "file": "sglang/kernels/ops/kvcache/cache_move.py",
            "line": n,
            "source": block(move, n - 1, 2),
            "imported_by": {"file": "sglang/srt/mem_cache/memory_pool.py", "line": m},
            "fact": "with SGLANG_USE_CPU_ENGINE=1 the KV pool's module imports a CPU kernel that PyPI's CUDA-only "
            "sgl-kernel wheel lacks, outside any try/except, so the server cannot start on a CPU: the pin stays",
        }
    record = {
        "what": "What polarstack.stack.real_sglang relies on to run the pinned sglang on a CPU (issue 21).",
        "regenerate": ".venv/bin/python scripts/tools/record_real_sglang.py > configs/upstream/real-sglang-cpu.json",
        "sglang_version": version,
        "launch_args": real_sglang.launch_args("MODEL", 0, served_model_name="NAME", tool_call_parser="PARSER"),
        "facts": facts,
    }
    json.dump(record, sys.stdout, indent=2)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
