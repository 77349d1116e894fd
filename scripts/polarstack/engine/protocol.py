"""sglang's own request/response models, taken from the pinned sglang wheel without its runtime.

The emulator must validate requests and shape responses exactly as the pinned sglang does, so it does
not re-declare them: it downloads the sglang wheel once (`pip download --no-deps`, never installed,
since installing it with its dependencies pulls CUDA torch), extracts the few source files it needs into
the cache, and loads `sglang/srt/entrypoints/openai/protocol.py` as a module. That file imports only
pydantic, openai types, typing_extensions and `sglang.utils.convert_json_schema_to_str`; the last one is
provided by a small shim (`_convert_json_schema_to_str` below) while the file loads.

`/generate` takes `GenerateReqInput`, a dataclass in `sglang/srt/managers/io_struct.py` whose module
imports torch and zmq; its field names, annotations and defaults are read from the source with `ast`
and rebuilt as a pydantic model (annotations that name sglang-internal types become `Any`).
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import json
import subprocess
import sys
import types
import typing
import zipfile
from pathlib import Path
from typing import Any

from polarstack.errors import ExitCode, StackError
from polarstack.paths import cache_dir
from polarstack.pins import pin
from polarstack.processes import child_env, file_lock

# Files read from the wheel, by their path inside it.
PROTOCOL_PATH = "sglang/srt/entrypoints/openai/protocol.py"
IO_STRUCT_PATH = "sglang/srt/managers/io_struct.py"
HTTP_SERVER_PATH = "sglang/srt/entrypoints/http_server.py"
SERVER_ARGS_PATH = "sglang/srt/server_args.py"
SERVING_CHAT_PATH = "sglang/srt/entrypoints/openai/serving_chat.py"
EXTRACTED = (PROTOCOL_PATH, IO_STRUCT_PATH, HTTP_SERVER_PATH, SERVER_ARGS_PATH, SERVING_CHAT_PATH)


def sglang_version() -> str:
    return pin("SGLANG_VERSION")


def source_dir(version: str | None = None) -> Path:
    """Folder holding the extracted sglang source files for `version`, fetching them on first use."""
    version = version or sglang_version()
    target = cache_dir() / "sglang-src" / version
    marker = target / ".complete"
    if marker.exists():
        return target
    # Parallel test workers (and two CLIs) fetch it once: the second waits for the first, then finds the marker.
    with file_lock(target.parent / f"{version}.lock"):
        if marker.exists():
            return target
        return _fetch(version, target, marker)


def _fetch(version: str, target: Path, marker: Path) -> Path:
    wheel_dir = cache_dir() / "wheels"
    wheel_dir.mkdir(parents=True, exist_ok=True)
    wheel = find_wheel(wheel_dir, version)
    if wheel is None:
        print(f"polarstack: downloading the sglang {version} wheel (no dependencies) once ...", file=sys.stderr)
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--quiet",
            "--disable-pip-version-check",
            "-d",
            str(wheel_dir),
            f"sglang=={version}",
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=child_env())
        wheel = find_wheel(wheel_dir, version)
        if proc.returncode != 0 or wheel is None:
            last = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
            raise StackError(
                f"could not download the sglang {version} wheel from the package index ({last[0]}); "
                "connect to PyPI once, or set POLARSTACK_CACHE to a cache that holds it.",
                ExitCode.ENVIRONMENT,
            )
    target.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        for member in EXTRACTED:
            if member not in names:
                raise StackError(f"the sglang {version} wheel has no {member}; is the pin right?", ExitCode.USAGE)
            out = target / member
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_bytes(zf.read(member))
    marker.write_text(wheel.name + "\n")
    return target


def find_wheel(folder: Path, version: str) -> Path | None:
    found = sorted(folder.glob(f"sglang-{version}-*.whl"))
    return found[0] if found else None


def _convert_json_schema_to_str(json_schema: Any) -> str:
    """Stand-in for `sglang.utils.convert_json_schema_to_str` (same contract: dict, str or model class)."""
    if isinstance(json_schema, dict):
        return json.dumps(json_schema)
    if isinstance(json_schema, str):
        return json_schema
    if isinstance(json_schema, type) and hasattr(json_schema, "model_json_schema"):
        return json.dumps(json_schema.model_json_schema())
    raise ValueError("Unsupported JSON schema type.")


@functools.cache
def protocol() -> types.ModuleType:
    """sglang's protocol.py at the pinned version, loaded as `polarstack._sglang_protocol`."""
    path = source_dir() / PROTOCOL_PATH
    name = "polarstack._sglang_protocol"
    shim_pkg = types.ModuleType("sglang")
    shim_utils = types.ModuleType("sglang.utils")
    shim_utils.convert_json_schema_to_str = _convert_json_schema_to_str  # type: ignore[attr-defined]
    shim_pkg.utils = shim_utils  # type: ignore[attr-defined]
    saved = {key: sys.modules.get(key) for key in ("sglang", "sglang.utils")}
    sys.modules["sglang"], sys.modules["sglang.utils"] = shim_pkg, shim_utils
    try:
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec and spec.loader
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    finally:
        for key, value in saved.items():
            if value is None:
                sys.modules.pop(key, None)
            else:
                sys.modules[key] = value
    return module


# --- GenerateReqInput (/generate) -------------------------------------------------------------------

_TYPING_NAMES = {
    name: getattr(typing, name) for name in ("Any", "Dict", "List", "Optional", "Tuple", "Union", "Literal")
}


def _annotation(node: ast.expr) -> Any:
    """Evaluate an annotation from io_struct.py; names of sglang-internal types become Any."""
    source = ast.unparse(node)
    namespace = dict(_TYPING_NAMES, list=list, dict=dict, tuple=tuple, int=int, float=float, str=str, bool=bool)
    try:
        return eval(source, {"__builtins__": {}}, namespace)  # noqa: S307 - typing expressions from a pinned file
    except Exception:
        return Any


def _default(call_or_value: ast.expr | None) -> tuple[bool, Any]:
    """(has_default, default) for a dataclass field's right-hand side."""
    if call_or_value is None:
        return False, None
    node = call_or_value
    if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "field":
        for kw in node.keywords:
            if kw.arg == "default":
                node = kw.value
                break
            if kw.arg == "default_factory":
                return True, None
        else:
            return False, None
    try:
        return True, ast.literal_eval(node)
    except ValueError:
        return True, None


@functools.cache
def generate_fields() -> dict[str, tuple[Any, Any]]:
    """{field: (annotation, default)} of GenerateReqInput, read from the pinned io_struct.py."""
    tree = ast.parse((source_dir() / IO_STRUCT_PATH).read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "GenerateReqInput":
            fields: dict[str, tuple[Any, Any]] = {}
            for item in node.body:
                if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    _, default = _default(item.value)
                    fields[item.target.id] = (_annotation(item.annotation), default)
            return fields
    raise StackError(f"{IO_STRUCT_PATH} at sglang {sglang_version()} has no GenerateReqInput.", ExitCode.USAGE)


@functools.cache
def generate_model() -> type:
    """A pydantic model with GenerateReqInput's fields (unknown fields ignored, as FastAPI does for it)."""
    import pydantic

    fields = {name: (ann, default) for name, (ann, default) in generate_fields().items()}
    return pydantic.create_model(
        "GenerateReqInput", __config__=pydantic.ConfigDict(extra="ignore", arbitrary_types_allowed=True), **fields
    )


def http_routes() -> list[tuple[str, str]]:
    """(METHOD, path) pairs declared with @app.get/post/api_route in the pinned http_server.py."""
    tree = ast.parse((source_dir() / HTTP_SERVER_PATH).read_text(encoding="utf-8"))
    routes: list[tuple[str, str]] = []
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for deco in node.decorator_list:
            if not (isinstance(deco, ast.Call) and isinstance(deco.func, ast.Attribute)):
                continue
            if getattr(deco.func.value, "id", None) != "app" or not deco.args:
                continue
            if not isinstance(deco.args[0], ast.Constant) or not isinstance(deco.args[0].value, str):
                continue
            path = deco.args[0].value
            attr = deco.func.attr
            if attr in ("get", "post", "put", "delete"):
                routes.append((attr.upper(), path))
            elif attr == "api_route":
                for kw in deco.keywords:
                    if kw.arg == "methods":
                        for method in ast.literal_eval(kw.value):
                            routes.append((method.upper(), path))
    return routes
