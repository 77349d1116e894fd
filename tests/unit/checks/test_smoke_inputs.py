"""Pins the smoke's inputs as two frozen objects (issue 35 point 3, checks/smoke_inputs.py): `run_smoke(target,
options)` takes those two and nothing else; the options' defaults are written once (the CLI parser's defaults are
the dataclass's, and no other module under scripts/ restates them); `to_argv` and the CLI's parser round-trip
the options (the in-trainer command line is built from them); and no argparse Namespace or SimpleNamespace
travels below cli/ for the smoke. The scans read the source with `ast` (comments and docstrings do not count)."""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from polarstack.checks import docker_smoke, smoke
from polarstack.checks.smoke_inputs import SmokeKnobs, SmokeOptions, SmokeTarget
from polarstack.cli import main as cli_main
from polarstack.pins import repo_root
from polarstack.stack import profiles
from polarstack.stack.target import Target

pytestmark = pytest.mark.unit
SCRIPTS = repo_root() / "scripts"
PACKAGE = SCRIPTS / "polarstack"
HOME = PACKAGE / "checks" / "smoke_inputs.py"
URL = "http://engine.invalid"
# The smoke's own flags (SmokeOptions.add_arguments) and the field each fills; tokenizer_name has none (from_args
# reads it from --polar-config).
FLAGS = {
    "--model": "model",
    "--requests": "requests",
    "--turns": "turns",
    "--timeout": "timeout",
    "--max-tokens": "max_tokens",
    "--strict": "strict",
    "--allow-retokenized": "allow_retokenized",
    "--polar-config": "polar_config",
}


def smoke_parser() -> argparse.ArgumentParser:
    """The `smoke` subparser of the real CLI (cli.main.build_parser), not a parser built for the test."""
    parser = cli_main.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices["smoke"]


def parsed(argv: list[str]) -> argparse.Namespace:
    return cli_main.build_parser().parse_args(["smoke", *argv])


# --- run_smoke(target, options) -----------------------------------------------------------------------------


def test_run_smoke_takes_the_target_and_the_options_only():
    parameters = list(inspect.signature(smoke.run_smoke).parameters.values())
    assert len(parameters) <= 2
    assert [p.name for p in parameters] == ["target", "options"]
    assert all(p.kind is p.POSITIONAL_OR_KEYWORD and p.default is p.empty for p in parameters)


def test_both_inputs_are_frozen():
    for value in (SmokeOptions(), SmokeTarget(URL)):
        assert dataclasses.is_dataclass(value) and type(value).__dataclass_params__.frozen
        with pytest.raises(dataclasses.FrozenInstanceError):
            value.route = "polar"  # type: ignore[misc]


def test_the_report_holds_its_inputs_apart_from_its_results():
    from polarstack.checks.exchange import SmokeReport

    names = [f.name for f in dataclasses.fields(SmokeReport)]
    assert names[:2] == ["target", "options"]
    inputs = {f.name for f in dataclasses.fields(SmokeOptions)} | {f.name for f in dataclasses.fields(SmokeTarget)}
    # model is a result: the one asked for, or the one discovered (GET /v1/models)
    assert inputs & set(names) == {"model"}


# --- defaults written once ----------------------------------------------------------------------------------


def test_the_cli_parser_defaults_are_the_dataclass_defaults():
    parser = smoke_parser()
    defaults = SmokeOptions()
    actions = {a.option_strings[0]: a for a in parser._actions if a.option_strings}
    for flag, name in FLAGS.items():
        if name == "timeout":  # None: without --timeout the target decides (cli.main), from_args fills in the default
            assert actions[flag].default is None
        else:
            assert actions[flag].default == getattr(defaults, name), flag
    # the help states the same defaults
    assert f"(default {defaults.requests}," in actions["--requests"].help
    assert f"(default {defaults.turns};" in actions["--turns"].help
    assert f"(default {defaults.max_tokens})" in actions["--max-tokens"].help
    assert f"(default {defaults.timeout:g};" in actions["--timeout"].help
    # the stack's rendered template sets no tokenizer (tests/integration/test_retokenized.py), so no flag is no option
    assert SmokeOptions.from_args(parsed([])) == defaults


def _constant(node: ast.AST) -> object:
    return node.value if isinstance(node, ast.Constant) else inspect.Parameter.empty


SMOKE_NAMES = {"run_smoke", "SmokeOptions", "SmokeTarget", "docker_smoke", "run_in_trainer", "trainer_command"}


def _name(node: ast.AST) -> str | None:
    return node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None


def _mentions_the_smoke(node: ast.AST) -> bool:
    return getattr(node, "name", None) in SMOKE_NAMES or any(_name(n) in SMOKE_NAMES for n in ast.walk(node))


def restated_defaults(path: Path) -> list[str]:
    """Where `path` writes one of SmokeOptions' defaults again. In a module that uses the smoke: a keyword argument
    named like a count option (requests, turns, max_tokens) given its default value. In a function that uses it:
    a parameter of those names defaulting to it, and the default timeout as a number (except as the timeout of
    another call, say an HTTP request's). Beside add_parser("smoke"): an add_argument of the smoke's flags."""
    defaults = SmokeOptions()
    counts = {name: getattr(defaults, name) for name in ("requests", "turns", "max_tokens")}
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []

    def same(value: object, default: object) -> bool:
        return type(value) in (int, float) and value == default

    if _mentions_the_smoke(tree):
        for node in ast.walk(tree):
            for keyword in node.keywords if isinstance(node, ast.Call) else []:
                if keyword.arg in counts and same(_constant(keyword.value), counts[keyword.arg]):
                    found.append(f"{path.name}:{keyword.lineno} {keyword.arg}={counts[keyword.arg]}")
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        calls = [n for n in ast.walk(node) if isinstance(n, ast.Call)]
        if _mentions_the_smoke(node):
            args = node.args
            positional = args.posonlyargs + args.args
            pairs = list(zip(positional[len(positional) - len(args.defaults) :], args.defaults, strict=True))
            pairs += [(a, d) for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True) if d is not None]
            for arg, default in pairs:
                if arg.arg in counts and same(_constant(default), counts[arg.arg]):
                    found.append(f"{path.name}:{arg.lineno} parameter {arg.arg}={counts[arg.arg]}")
            others = {
                id(k.value)
                for c in calls
                if _name(c.func) not in SMOKE_NAMES | {"replace"}
                for k in c.keywords
                if k.arg == "timeout"
            }
            for inner in ast.walk(node):
                if isinstance(inner, ast.Constant) and same(inner.value, defaults.timeout) and id(inner) not in others:
                    found.append(f"{path.name}:{inner.lineno} {inner.value!r} (the smoke's default timeout)")
        if any(_name(c.func) == "add_parser" and c.args and _constant(c.args[0]) == "smoke" for c in calls):
            for call in calls:
                if _name(call.func) == "add_argument" and call.args and _constant(call.args[0]) in FLAGS:
                    found.append(f"{path.name}:{call.lineno} add_argument({_constant(call.args[0])!r})")
    return sorted(set(found))


def test_no_other_module_under_scripts_writes_the_smokes_defaults():
    modules = sorted(p for p in SCRIPTS.rglob("*.py") if p != HOME)
    assert len(modules) > 100 and PACKAGE / "cli" / "main.py" in modules  # the scan sees the package
    offences = [line for path in modules for line in restated_defaults(path)]
    assert offences == []


def test_the_scan_finds_the_shapes_the_defaults_used_to_be_restated_in(tmp_path):
    """The scan can fail: the places issue 35 found the defaults written again, in their shape before the fix."""
    before = tmp_path / "before.py"
    before.write_text(
        "def run_smoke(base_url, *, requests=2, turns=2, timeout=10.0, max_tokens=16):\n"
        "    pass\n"
        "def _smoke_args():\n"
        "    return SimpleNamespace(requests=2, turns=2, max_tokens=16)\n"
        "def _add_smoke(sub):\n"
        "    p = sub.add_parser('smoke')\n"
        "    p.add_argument('--requests', default=2)\n"
        "def _cmd_smoke(args):\n"
        "    args.timeout = local_options.get('timeout', 10.0)\n"
        "    return smoke.run_smoke(args.base_url)\n"
        "def unrelated(url):\n"
        "    return httpx.get(url, timeout=10.0, params={'turns': 3})\n"
        "def bench(url):\n"
        "    httpx.get(url, timeout=10)\n"
        "    return run_smoke(SmokeTarget(url), SmokeOptions(timeout=10.0))\n"
    )
    found = restated_defaults(before)
    assert [line.split(" ", 1)[0] for line in found].count("before.py:1") == 4  # the three counts and the timeout
    assert "before.py:4 requests=2" in found and "before.py:4 max_tokens=16" in found
    assert "before.py:7 add_argument('--requests')" in found
    assert "before.py:9 10.0 (the smoke's default timeout)" in found
    assert "before.py:15 10.0 (the smoke's default timeout)" in found
    # another timeout of 10 s is not the smoke's
    assert not any(line.startswith(("before.py:12", "before.py:14")) for line in found)


# --- to_argv and from_args --------------------------------------------------------------------------------


def tokenizer_config(tmp_path: Path, name: str) -> str:
    path = tmp_path / "polar_config.yaml"
    template = {"builder": {"strategy": "prefix_merging", "config": {"tokenizer_name_or_path": name}}}
    path.write_text(yaml.safe_dump({"polar_task_template": template}))
    return str(path)


def test_the_default_options_round_trip_through_the_command_line():
    options = SmokeOptions()
    assert SmokeOptions.from_args(parsed(options.to_argv())) == options


def test_options_that_differ_from_every_default_round_trip(tmp_path):
    config = tokenizer_config(tmp_path, "Qwen/Qwen2.5-0.5B-Instruct")
    options = SmokeOptions(
        model="served",
        requests=5,
        turns=0,
        timeout=2.5,
        max_tokens=8,
        strict=True,
        allow_retokenized=True,
        polar_config=config,
        tokenizer_name="Qwen/Qwen2.5-0.5B-Instruct",
    )
    defaults = SmokeOptions()
    flagged = [f.name for f in dataclasses.fields(SmokeOptions) if f.name != "knobs"]  # the knobs: no flags (below)
    assert all(getattr(options, name) != getattr(defaults, name) for name in flagged)
    assert SmokeOptions.from_args(parsed(options.to_argv())) == options
    # and the other way: a command line survives options and back
    argv = ["--requests", "3", "--turns", "1", "--timeout", "60.0", "--max-tokens", "32", "--strict"]
    assert SmokeOptions.from_args(parsed(argv)).to_argv() == argv


def test_the_knobs_are_no_flags_the_trainer_reads_its_own_environment():
    """The smoke's environment knobs (SmokeKnobs: POLARSTACK_SMOKE_*) are read by whoever builds the options (the
    CLI: its environment); to_argv leaves them out, so the smoke inside the trainer reads the trainer's own."""
    knobs = SmokeKnobs(tool_pad="0", tool_max_tokens="256", timeout="90", agent_request="/x.json")
    options = SmokeOptions(requests=1, knobs=knobs)
    assert options.to_argv() == SmokeOptions(requests=1).to_argv()
    assert SmokeOptions.from_args(parsed(options.to_argv())) == SmokeOptions(requests=1)
    assert SmokeOptions.from_args(parsed([]), knobs) == SmokeOptions(knobs=knobs)


def test_a_tokenizer_without_its_config_has_no_command_line():
    with pytest.raises(ValueError, match="--polar-config"):
        SmokeOptions(tokenizer_name="tok").to_argv()


def test_the_in_trainer_command_is_the_options_to_argv(tmp_path, monkeypatch):
    monkeypatch.setenv("POLARSTACK_RUN_DIR", str(tmp_path / "run"))
    options = SmokeOptions(requests=1, turns=0, timeout=60.0, strict=True)
    command = docker_smoke.trainer_command(options, "stock-router", route="polar")
    argv = options.to_argv()
    assert any(command[i : i + len(argv)] == argv for i in range(len(command)))
    inner = cli_main.build_parser().parse_args(command[1:])
    assert SmokeOptions.from_args(inner) == options and inner.route == "polar" and inner.in_trainer


# --- no Namespace below cli/ ------------------------------------------------------------------------------


def namespace_uses(path: Path) -> list[str]:
    """Imports or uses of argparse.Namespace and types.SimpleNamespace in `path`."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module in ("argparse", "types"):
            found += [f"{path.name}:{node.lineno} {a.name}" for a in node.names if a.name.endswith("Namespace")]
        if isinstance(node, ast.Attribute) and node.attr.endswith("Namespace"):
            found.append(f"{path.name}:{node.lineno} .{node.attr}")
    return found


def test_no_namespace_below_cli():
    # offline/ builds fake slime objects (a worker, samples) as SimpleNamespace for its offline checks of slime's
    # API; they are not the smoke's arguments and may stay.
    allowed = (PACKAGE / "cli", PACKAGE / "offline")
    modules = [p for p in PACKAGE.rglob("*.py") if not any(p.is_relative_to(a) for a in allowed)]
    assert PACKAGE / "checks" / "docker_demo.py" in modules and PACKAGE / "checks" / "docker_smoke.py" in modules
    assert [line for path in sorted(modules) for line in namespace_uses(path)] == []


def test_the_scan_finds_a_namespace(tmp_path):
    before = tmp_path / "before.py"
    before.write_text(
        "import argparse\nimport types\nfrom types import SimpleNamespace\n"
        "def f(args: argparse.Namespace):\n    return types.SimpleNamespace(requests=1)\n"
    )
    assert namespace_uses(before) == [
        "before.py:3 SimpleNamespace",
        "before.py:4 .Namespace",
        "before.py:5 .SimpleNamespace",
    ]


def test_the_cli_hands_the_smoke_its_two_objects(monkeypatch, capsys):
    seen = []

    def fake(target, options):
        seen.append((target, options))
        raise SystemExit(0)

    monkeypatch.setattr(smoke, "run_smoke", fake)
    with pytest.raises(SystemExit):
        cli_main.main(["smoke", "--base-url", URL, "--requests", "1", "--strict"])
    target, options = seen[0]
    assert type(target) is SmokeTarget and type(options) is SmokeOptions
    assert target == SmokeTarget(URL) and options == SmokeOptions(requests=1, strict=True)


def test_the_cli_reads_the_smokes_knobs_from_its_environment(monkeypatch):
    """POLARSTACK_SMOKE_* (docs/tool-calls.md) are read by the CLI, not by the smoke: they reach it in the options."""
    seen = []

    def fake(target, options):
        seen.append(options)
        raise SystemExit(0)

    monkeypatch.setattr(smoke, "run_smoke", fake)
    monkeypatch.setenv("POLARSTACK_SMOKE_TOOL_PAD", "0")
    monkeypatch.setenv("POLARSTACK_SMOKE_TIMEOUT", "90")
    with pytest.raises(SystemExit):
        cli_main.main(["smoke", "--base-url", URL])
    assert seen[0].knobs == SmokeKnobs(tool_pad="0", timeout="90")


@pytest.mark.parametrize("argv, timeout", [([], 60.0), (["--timeout", "5"], 5.0)])
def test_the_cli_hands_the_trainer_smoke_options_with_the_targets_timeout(monkeypatch, capsys, argv, timeout):
    """The docker runtime on the host: the real CPU engines' timeout unless --timeout is given, in the options the
    in-trainer command is built from (before: argparse's Namespace, its timeout rewritten in place)."""
    profile = profiles.load("engine-direct")
    monkeypatch.setattr(
        cli_main.stack_target,
        "resolve_target",
        lambda *a, **k: Target("docker", profile.name, URL, None, loaded=profile),
    )
    monkeypatch.setattr(docker_smoke, "real_engine_options", lambda *a: {"timeout": 60.0})
    seen = []

    def in_trainer(options, loaded, runtime, route=None, record=None):
        seen.append((options, loaded, route))
        return {"verdict": "pass", "exit_code": 0, "code": "OK", "message": "ok", "requests": []}

    monkeypatch.setattr(docker_smoke, "run_in_trainer", in_trainer)
    assert cli_main.main(["smoke", "--json", "--route", "polar", *argv]) == 0
    options, loaded, route = seen[0]
    assert type(options) is SmokeOptions and not isinstance(options, (argparse.Namespace, SimpleNamespace))
    assert options == SmokeOptions(timeout=timeout) and loaded is profile and route == "polar"
