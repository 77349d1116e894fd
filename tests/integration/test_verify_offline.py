"""Pins `make verify-offline`: every command line the stack renders is accepted by the parser of the exact pinned
release (sglang's ServerArgs from the wheel, each router's own parse_router_args, the recorded slime v0.3.1 and
ray tables), every image pin resolves on the package index, and one source holds the pins. Deliberately broken
inputs (a misspelled engine flag in a profile, a pin to a release that does not exist) fail with a sentence
naming the command, the flag and the release."""

import json
import shutil

import pytest

from polarstack import pins
from polarstack.cli.main import main
from polarstack.engine import protocol as sglang_protocol
from polarstack.errors import ExitCode
from polarstack.offline import flags
from polarstack.routers.catalog import RouterRelease
from polarstack.stack import profiles
from polarstack.stack.cluster import load as load_cluster
from polarstack.train.plan import build_plan

pytestmark = pytest.mark.router


def test_the_stack_as_committed_passes(capsys):
    code = main(["verify-offline", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0, [c for c in report["checks"] if not c["ok"]]
    names = " ".join(c["name"] for c in report["checks"])
    for expected in (
        "sglang.launch_server",
        "smg.launch_router",
        "sglang_router.launch_router",
        "ray start",
        "train_async.py",
        "names every pin",
        "recorded upstream options match the pins",
    ):
        assert expected in names


def test_misspelled_engine_flag_in_a_profile_fails_naming_it(monkeypatch, capsys):
    monkeypatch.setenv("ENGINE_EXTRA_ARGS", "--mem-fraction-statik 0.5")
    assert main(["verify-offline", "--skip-downloads"]) == ExitCode.USAGE
    err = capsys.readouterr().err
    assert "--mem-fraction-statik is not an option of sglang.launch_server of sglang" in err
    assert sglang_protocol.sglang_version() in err and "profile " in err


def test_value_missing_for_an_engine_flag(monkeypatch, capsys):
    monkeypatch.setenv("ENGINE_EXTRA_ARGS", "--context-length")
    assert main(["verify-offline", "--skip-downloads"]) == ExitCode.USAGE
    assert "--context-length needs a value" in capsys.readouterr().err


def test_router_flag_the_release_does_not_know():
    old = RouterRelease.parse("sglang-router==0.1.4")
    problems = flags.router_check(
        old, ["--host", "127.0.0.1", "--port", "30080", "--prometheus-port", "30081"], command="test"
    )
    assert (
        problems and "--prometheus-port" in problems[0].sentence() and "sglang-router==0.1.4" in problems[0].sentence()
    )


def test_slime_silently_ignores_dynamic_history_and_the_check_says_so():
    table, program = flags.slime_table()
    plan = build_plan("humaneval", profiles.load("engine-direct"), run_id="t", cluster=load_cluster())
    assert flags.check_tokens(plan.train_args, table, command="t", program=program) == []
    problems = flags.check_tokens([*plan.train_args, "--dynamic-history"], table, command="t", program=program)
    assert [p.flag for p in problems] == ["--dynamic-history"] and "slime v0.3.1" in problems[0].message


@pytest.fixture
def copied_root(tmp_path, monkeypatch):
    root = tmp_path / "repo"
    for entry in ("configs", "compose", "images"):
        shutil.copytree(pins.repo_root() / entry, root / entry)
    shutil.copy(pins.repo_root() / "pyproject.toml", root / "pyproject.toml")
    monkeypatch.setenv("POLARSTACK_ROOT", str(root))
    pins.pins.cache_clear()
    flags.clear_caches()
    yield root
    pins.pins.cache_clear()
    flags.clear_caches()


def test_pin_to_a_release_that_does_not_exist_fails_naming_it(copied_root, capsys):
    path = copied_root / "configs" / "pins.env"
    path.write_text(path.read_text().replace("ROUTER_STOCK_VERSION=", "ROUTER_STOCK_VERSION=0.0.99\n#", 1))
    assert main(["verify-offline", "--json"]) == ExitCode.USAGE
    out, err = capsys.readouterr()
    failed = [c for c in json.loads(out)["checks"] if not c["ok"]]
    assert any(
        "sglang-router==0.0.99" in p and "does not resolve on the package index" in p
        for c in failed
        for p in c["problems"]
    ), failed
    assert "0.0.99" in err


def test_recorded_tables_must_follow_the_pins(copied_root, capsys):
    path = copied_root / "configs" / "pins.env"
    text = path.read_text()
    current = pins.pins()["RAY_VERSION"]
    path.write_text(text.replace(f"RAY_VERSION={current}", "RAY_VERSION=9.9.9"))
    pins.pins.cache_clear()
    assert main(["verify-offline", "--skip-downloads", "--json"]) == ExitCode.USAGE
    problems = [p for c in json.loads(capsys.readouterr().out)["checks"] for p in c["problems"]]
    assert (
        f"configs/upstream/ray-flags.json was recorded for ray {current}, not RAY_VERSION=9.9.9; rerecord it"
        in problems
    )
    assert "images/README.md does not name RAY_VERSION=9.9.9" in problems


def test_sglang_table_comes_from_the_pinned_wheel():
    table = flags.sglang_table()
    assert table["--model-path"] == "one" and table["--model"] == "one"  # Arg(aliases=["--model"])
    assert table["--trust-remote-code"] == "none"  # bool -> store_true
    assert table["--tensor-parallel-size"] == table["--tp-size"] == "one"
