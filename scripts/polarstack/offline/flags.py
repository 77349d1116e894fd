"""Command-line options of the pinned upstreams, and a checker for the command lines the stack renders.

Sources, one per program (never a hand-kept list):
- sglang.launch_server: the pinned wheel's `sglang/srt/server_args.py`, read with `ast` (importing it needs the
  GPU stack). `ServerArgs` fields annotated `A[T, ...]` become `--field-name` (or `Arg(cli_name=...)`) plus
  `Arg(aliases=[...])`; `bool` fields are store_true, `List[...]` take one or more values, the rest one value;
  `Arg(no_cli=True)` fields are skipped; the manual `parser.add_argument(...)` calls of `add_cli_args` are
  added (sglang/srt/arg_groups/arg_utils.py, `add_cli_args_from_dataclass`).
- routers: each pinned release's own `parse_router_args(argv)`, run in its cached virtual environment.
- train_async.py (slime v0.3.1 + Megatron-LM) and ray: recorded once from their own parsers into
  configs/upstream/*.json (scripts/tools/record_upstream_flags.py), since neither runs here.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from polarstack.engine.protocol import SERVER_ARGS_PATH, sglang_version, source_dir
from polarstack.errors import ExitCode, StackError
from polarstack.paths import cache_dir
from polarstack.pins import repo_root
from polarstack.routers.catalog import RouterRelease
from polarstack.routers.harness import install

NONE, ONE, OPTIONAL, ONE_OR_MORE, ANY, UNKNOWN = "none", "one", "optional", "one_or_more", "any", "unknown"


@dataclass
class FlagProblem:
    command: str  # which rendered command (profile, service)
    program: str  # the program and its pinned release
    flag: str
    message: str

    def sentence(self) -> str:
        return f"{self.command}: {self.message} ({self.program})"


def check_tokens(tokens: list[str], table: dict[str, str], *, command: str, program: str) -> list[FlagProblem]:
    """Walk `tokens` (options only, no program name) against {--flag: arity}."""
    problems: list[FlagProblem] = []
    i = 0
    while i < len(tokens):
        token = tokens[i]
        if not token.startswith("--"):
            problems.append(
                FlagProblem(command, program, token, f"stray argument {token!r} where an option was expected")
            )
            i += 1
            continue
        name, has_inline, _ = token.partition("=")
        arity = table.get(name)
        if arity is None:
            problems.append(FlagProblem(command, program, name, f"{name} is not an option of {program}"))
            i += 1
            while i < len(tokens) and not tokens[i].startswith("--"):
                i += 1  # skip what would have been its values
            continue
        i += 1
        values = []
        if has_inline:
            values.append(token.split("=", 1)[1])
        while (
            i < len(tokens)
            and not _is_option(tokens[i])
            and (
                arity in (ONE_OR_MORE, ANY, UNKNOWN)
                or (arity in (ONE, OPTIONAL) and not values)
                or (arity.startswith("exactly_") and len(values) < int(arity[8:]))
            )
        ):
            values.append(tokens[i])
            i += 1
        if arity == NONE and values:
            problems.append(FlagProblem(command, program, name, f"{name} takes no value, got {values[0]!r}"))
        elif arity == ONE and len(values) != 1:
            problems.append(FlagProblem(command, program, name, f"{name} needs a value"))
        elif arity == ONE_OR_MORE and not values:
            problems.append(FlagProblem(command, program, name, f"{name} needs at least one value"))
        elif arity.startswith("exactly_") and len(values) != int(arity[8:]):
            problems.append(FlagProblem(command, program, name, f"{name} needs {arity[8:]} values"))
    return problems


def _is_option(token: str) -> bool:
    if not token.startswith("-"):
        return False
    try:
        float(token)  # a negative number is a value
        return False
    except ValueError:
        return True


# --- sglang ------------------------------------------------------------------------------------------------


def _literal(node: ast.AST):
    try:
        return ast.literal_eval(node)
    except ValueError:
        return None


def _annotation_kind(node: ast.expr) -> str:
    text = ast.unparse(node)
    inner = text
    for wrapper in ("Optional[", "Union["):
        if inner.startswith(wrapper):
            inner = inner[len(wrapper) :]
    if inner.startswith("bool"):
        return NONE
    if inner.startswith(("List[", "list[")):
        return ONE_OR_MORE
    return ONE


@functools.cache
def sglang_table(version: str | None = None) -> dict[str, str]:
    path = source_dir(version) / SERVER_ARGS_PATH
    tree = ast.parse(path.read_text(encoding="utf-8"))
    table: dict[str, str] = {}
    for node in tree.body:
        if not (isinstance(node, ast.ClassDef) and node.name == "ServerArgs"):
            continue
        for item in node.body:
            if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                ann = item.annotation
                if not (isinstance(ann, ast.Subscript) and getattr(ann.value, "id", None) == "A"):
                    continue  # no A[...] annotation: registered manually, or not a CLI option
                parts = ann.slice.elts if isinstance(ann.slice, ast.Tuple) else [ann.slice]
                kind = _annotation_kind(parts[0])
                names = ["--" + item.target.id.replace("_", "-")]
                meta = parts[1] if len(parts) > 1 else None
                if isinstance(meta, ast.Call) and getattr(meta.func, "id", None) == "Arg":
                    kw = {k.arg: k.value for k in meta.keywords}
                    if kw.get("no_cli") is not None and _literal(kw["no_cli"]) is True:
                        continue
                    if "cli_name" in kw and isinstance(_literal(kw["cli_name"]), str):
                        names = [_literal(kw["cli_name"])]
                    if "aliases" in kw:
                        names += [a for a in (_literal(kw["aliases"]) or []) if isinstance(a, str)]
                    if "action" in kw:
                        kind = UNKNOWN
                    elif "nargs" in kw:
                        nargs = _literal(kw["nargs"])
                        kind = {"?": OPTIONAL, "+": ONE_OR_MORE, "*": ANY}.get(nargs, ONE)
                    elif "type_parser" in kw and kind == ONE_OR_MORE:
                        kind = ONE
                for name in names:
                    table[name] = kind
            if isinstance(item, ast.FunctionDef) and item.name == "add_cli_args":
                for call in ast.walk(item):
                    if (
                        isinstance(call, ast.Call)
                        and isinstance(call.func, ast.Attribute)
                        and call.func.attr == "add_argument"
                    ):
                        names = [_literal(a) for a in call.args if isinstance(_literal(a), str)]
                        kw = {k.arg: _literal(k.value) for k in call.keywords}
                        action = kw.get("action")
                        kind = (
                            NONE
                            if action in ("store_true", "store_false", "store_const")
                            else (
                                UNKNOWN
                                if "action" in {k.arg for k in call.keywords} and action is None
                                else {"?": OPTIONAL, "+": ONE_OR_MORE, "*": ANY}.get(kw.get("nargs"), ONE)
                            )
                        )
                        for name in names:
                            if name.startswith("--"):
                                table[name] = kind
    if "--model-path" not in table:
        raise StackError(
            f"{path} no longer declares --model-path as expected; polarstack.offline.flags needs updating "
            "for this sglang release.",
            ExitCode.INTERNAL,
        )
    return table


def sglang_program() -> str:
    return f"sglang.launch_server of sglang {sglang_version()}"


# --- routers ----------------------------------------------------------------------------------------------


def router_check(release: RouterRelease, args: list[str], *, command: str) -> list[FlagProblem]:
    """Parse `args` with the release's own parse_router_args, in its cached venv; no router starts."""
    try:
        python = install(release)
    except StackError as exc:
        return [FlagProblem(command, release.spec, release.spec, f"cannot check the router's arguments: {exc.message}")]
    returncode, stderr = _parse_router_args(release, python, args)
    if returncode == 0:
        return []
    line = next(
        (ln for ln in reversed(stderr.strip().splitlines()) if "error" in ln.lower()),
        stderr.strip().splitlines()[-1] if stderr.strip() else f"exit {returncode}",
    )
    flag = next((tok for tok in args if tok.startswith("--") and tok in line), line)
    return [
        FlagProblem(
            command,
            f"{release.module} of {release.spec}",
            flag,
            f"the router's own parser refuses the arguments: {line.strip()}",
        )
    ]


def _parse_router_args(release: RouterRelease, python: Path, args: list[str]) -> tuple[int, str]:
    """(exit code, stderr) of the release's parse_router_args on `args`, run in its venv. The verdict is remembered
    under the cache, keyed by the release, the exact arguments and that venv's install marker (a reinstall makes a new
    key): a router's import takes seconds and `make verify-offline` (and the tests running it) parse the same
    arguments again and again."""
    marker = python.parent.parent / ".installed"
    try:
        installed = f"{marker.stat().st_mtime_ns}:{marker.read_text()}"
    except OSError:
        installed = None
    key = hashlib.sha256(json.dumps([release.spec, str(python), installed, args]).encode()).hexdigest()[:32]
    memo = cache_dir() / "router-args" / f"{key}.json"
    if installed is not None:
        try:
            known = json.loads(memo.read_text())
            return int(known["returncode"]), str(known["stderr"])
        except (OSError, ValueError, KeyError, TypeError):
            pass
    code = "import sys\nfrom {mod} import parse_router_args\nparse_router_args(sys.argv[1:])\n".format(
        mod=release.module
    )
    proc = subprocess.run([str(python), "-c", code, *args], capture_output=True, text=True, timeout=60)
    if installed is not None and proc.returncode in (0, 2):  # accepted, or argparse's refusal: never a crash
        memo.parent.mkdir(parents=True, exist_ok=True)
        tmp = memo.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"returncode": proc.returncode, "stderr": proc.stderr}))
        tmp.replace(memo)
    return proc.returncode, proc.stderr


# --- recorded tables --------------------------------------------------------------------------------------


@functools.cache
def _recorded(name: str) -> dict:
    path = repo_root() / "configs" / "upstream" / name
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise StackError(
            f"cannot read {path} ({exc}); restore it from git or rerecord it with "
            "scripts/tools/record_upstream_flags.py.",
            ExitCode.USAGE,
        ) from None


def slime_table() -> tuple[dict[str, str], str]:
    data = _recorded("slime-flags.json")
    return data["flags"], f"train_async.py of slime {data['slime_tag']} ({data['slime_commit'][:12]})"


def ray_table(command: str) -> tuple[dict[str, str], str]:
    data = _recorded("ray-flags.json")
    return data["commands"][command], f"`{command}` of ray {data['ray_version']}"


def recorded_versions() -> dict[str, str]:
    return {
        "slime_commit": _recorded("slime-flags.json")["slime_commit"],
        "ray_version": _recorded("ray-flags.json")["ray_version"],
    }


def clear_caches() -> None:
    _recorded.cache_clear()
    sglang_table.cache_clear()


__all__ = ["FlagProblem", "check_tokens", "sglang_table", "router_check", "slime_table", "ray_table"]
