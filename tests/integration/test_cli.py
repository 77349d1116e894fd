"""Pins the CLI contract: exit codes, --json output, one sentence on stderr and no traceback on failures.

Calls `polarstack.cli.main.main([...])` in-process against an emulator on loopback (marker emulator)."""

import json
import time

import pytest

from conftest import FAULT_EXIT_CODES, FAULT_WARNINGS
from polarstack.cli.main import main
from polarstack.errors import ExitCode


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.emulator
def test_smoke_direct_passes_with_json(engine, capsys):
    code, out, err = run(capsys, "smoke", "--base-url", engine.url, "--json")
    report = json.loads(out)
    assert code == 0 and report["verdict"] == "pass"
    assert report["trainable_tokens"] > 0
    # 2 single-turn + a 2-turn session + the tool-call request (issue 10 point 4)
    assert [r["kind"] for r in report["requests"]] == ["single", "single", "session", "session", "tools", "tools"]
    assert err == ""


@pytest.mark.emulator
def test_smoke_human_output_has_a_table(engine, capsys):
    code, out, _ = run(capsys, "smoke", "--base-url", engine.url, "--requests", "1", "--turns", "3")
    assert code == 0
    assert "verdict: PASS" in out and "session" in out


@pytest.mark.unit
def test_smoke_unreachable_is_fast_and_clean(capsys):
    started = time.monotonic()
    code, out, err = run(capsys, "smoke", "--base-url", "http://127.0.0.1:9", "--json")
    assert time.monotonic() - started < 5
    assert code == ExitCode.UNREACHABLE
    assert json.loads(out)["code"] == "UNREACHABLE"
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


@pytest.mark.emulator
@pytest.mark.parametrize("mode,code", FAULT_EXIT_CODES)
def test_smoke_failure_modes_have_distinct_codes(engine_factory, capsys, mode, code):
    engine = engine_factory()
    engine.fault(mode)
    got, out, err = run(capsys, "smoke", "--base-url", engine.url, "--json")
    assert got == code, err
    assert json.loads(out)["exit_code"] == int(code)
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


@pytest.mark.emulator
@pytest.mark.parametrize("mode,codes", FAULT_WARNINGS)
def test_faults_polar_trains_through_warn_and_block_only_with_strict(engine_factory, capsys, mode, codes):
    engine = engine_factory()
    engine.fault(mode)
    got, out, _ = run(capsys, "smoke", "--base-url", engine.url, "--json")
    report = json.loads(out)
    assert got == 0 and report["polar_verdict"] == "trainable" and report["polar_trainable_tokens"] > 0
    assert codes <= {f["code"] for f in report["findings"]} and report["warnings"]
    got, out, err = run(capsys, "smoke", "--base-url", engine.url, "--json", "--strict")
    assert got == ExitCode.INVARIANT and "--strict" in err and len(err.strip().splitlines()) == 1


@pytest.mark.emulator
def test_smoke_timeout_is_unreachable(engine_factory, capsys):
    engine = engine_factory()
    engine.fault("delay", seconds=3)
    code, _, err = run(capsys, "smoke", "--base-url", engine.url, "--timeout", "0.5", "--requests", "1", "--turns", "0")
    assert code == ExitCode.UNREACHABLE and "did not answer within" in err


@pytest.mark.emulator
def test_engine_accepts_any_model_name_like_sglang(engine, capsys):
    # sglang echoes whatever model a request names; the 404 model_not_found comes from smg, tested in
    # tests/integration/test_real_routers.py (test_smg_model_mismatch_is_an_http_error_naming_the_fix).
    code, out, _ = run(capsys, "smoke", "--base-url", engine.url, "--model", "other", "--json")
    assert code == 0 and json.loads(out)["model"] == "other"


@pytest.mark.unit
def test_bad_arguments_are_usage_errors(capsys):
    code, _, err = run(capsys, "smoke", "--base-url", "http://127.0.0.1:9", "--requests", "0", "--turns", "0")
    assert code == ExitCode.USAGE and "--requests" in err
    with pytest.raises(SystemExit) as exc:
        main(["smoke", "--timeout", "soon"])
    assert exc.value.code == 2


@pytest.mark.emulator
def test_probe_direct_against_itself_preserves(engine, capsys):
    code, out, _ = run(capsys, "probe", "--direct", engine.url, "--via", engine.url, "--json")
    assert code == 0 and json.loads(out)["diagnosis"] == "token fields preserved"
