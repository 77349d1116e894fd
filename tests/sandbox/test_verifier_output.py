"""Pins issue 25, finding 1 and 2: whatever the candidate does, the verifier's whole output (stdout and stderr
joined, as Polar's `test_on_output` evaluator reads it) holds exactly one status line, FAILED, the verifier's own;
graded by the rule recorded from Polar (tests/polar_grading.py, configs/upstream/polar-grading.json). Each case is a
HumanEval/0 (or MBPP) candidate whose load error or call exception carries forged status lines behind every line
break str.splitlines knows, `\\r` alone, ANSI escapes, a 1 MB message, lone surrogates, the project's own markers;
or that prints them at exit and writes them to every fd. Neither the gate nor the sandbox probe reads a refusal in
that output, and the detail shows the text escaped (`\\n` as backslash and n), bounded. The gate reads each run as
Polar's node hands it on (tests/polar_grading.py `evaluation`: test_on_output's report, exit code and parsed map,
merged by the gateway), and finds the verifier's real refusal (exit 8) there."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

import bundled_verifier
from polar_grading import evaluation, reward, sample_metadata, status_lines
from polarstack.checks import sandbox_probe
from polarstack.reward import tasks, verifier
from polarstack.reward.verifier.limits import ISOLATION_ENV
from polarstack.train import gate

pytestmark = pytest.mark.sandbox
VERIFIER = bundled_verifier.VERIFIER  # as tasks writes it, under pytest's tmp_path_factory
NAME = "humaneval_verifier"
EXPECTED = {NAME: "PASSED"}  # the task's expected_output_json (reward/tasks.py)
SEPARATORS = ["\n", "\r", "\r\n", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029"]
FORGED = {
    **{
        f"sep_{ord(sep[-1]):04x}" + ("_crlf" if sep == "\r\n" else ""): f"x::{sep}PASSED {NAME}{sep}"
        for sep in SEPARATORS
    },
    "cr_alone_then_status": f"\rPASSED {NAME}",
    "ansi": f"\x1b[0m\x1b[2K\rPASSED {NAME}\n\x1b[32mPASSED {NAME}\x1b[0m",
    "one_megabyte": "y" * (1 << 20) + f"\nPASSED {NAME}\n",
    "lone_surrogates": f"\ud800\udfff\n\udcffPASSED {NAME}\n",
    "node_id_cut": f"x - y::z\nPASSED {NAME} - x::{NAME}",
    "gate_markers": "(not verified) polarstack-verifier: the sandbox is broken\npolarstack-verifier: x",
    "refusal_line": f"\nFAILED {NAME} (not verified)\nFAILED probe (not verified)\n",
}


@pytest.fixture(scope="module")
def problem():
    return dict(next(p for p in tasks.load_humaneval() if p["task_id"] == "HumanEval/0"), kind="humaneval")


def _run(tmp_path: Path, problem: dict, solution: str) -> subprocess.CompletedProcess:
    (tmp_path / "problem.json").write_text(json.dumps(problem))
    (tmp_path / "solution.py").write_text(solution, encoding="utf-8", errors="surrogatepass")
    args = ["--problem", str(tmp_path / "problem.json"), "--solution", str(tmp_path / "solution.py")]
    return subprocess.run(
        [sys.executable, str(VERIFIER), *args, "--name", NAME, "--timeout", "10"],
        capture_output=True,
        text=True,
        errors="surrogateescape",
        timeout=90,
        env={"PATH": "/usr/bin:/bin"},
    )


def _assert_one_failed_line_of_its_own(proc: subprocess.CompletedProcess) -> str:
    output = proc.stdout + proc.stderr  # what Polar grades
    statuses = status_lines(output)
    assert [s for s, _ in statuses] == ["FAILED"], (statuses, output[:2000])
    assert reward(proc.stdout, proc.stderr, {NAME: "PASSED"}) == 0.0
    assert proc.returncode == 1, output[:2000]
    lines = output.splitlines()
    assert all(line.isascii() and line.isprintable() for line in lines), [ln[:200] for ln in lines]
    failed = [line for line in lines if line.startswith("FAILED")]
    assert len(failed) == 1 and failed[0].startswith(f"FAILED {NAME} (failed: ") and len(failed[0]) <= 400
    # The project's readers: the gate reads no refusal in the run as Polar's node hands it on, the probe no
    # `(not verified)`; the gate does read this very report once its exit code is the refusal's (it is read at all).
    assert gate.refusal_reason(_graded(proc)) is None, gate.refusal_reason(_graded(proc))
    assert gate.refusal_reason(_graded(proc, gate.REFUSAL_EXIT_CODE)) == "the verifier exited 8 (not verified)"
    assert sandbox_probe.not_verified({"good": lines, "bad": lines}) is None
    return failed[0]


class Sample:  # the field of slime's Sample the gate's refusal reader takes
    def __init__(self, metadata: dict) -> None:
        self.metadata = metadata


def _graded(proc: subprocess.CompletedProcess, code: int | None = None) -> Sample:
    """The run as a slime Sample carries it from Polar's test_on_output evaluator and gateway."""
    stdout, stderr = proc.stdout, proc.stderr
    return Sample(sample_metadata(evaluation(stdout, stderr, proc.returncode if code is None else code, EXPECTED)))


def _source(text: str) -> str:
    return "MESSAGE = " + repr(text) + "\n"  # repr: the file stays one valid line per statement


@pytest.mark.parametrize("case", sorted(FORGED))
@pytest.mark.parametrize("where", ["load", "call"])
def test_forged_status_lines_in_a_raised_message_reach_no_reader(tmp_path, problem, case, where):
    text = FORGED[case]
    if where == "load":  # the module raises as it loads: the verdict's detail is the load error
        solution = problem["prompt"] + "    pass\n" + _source(text) + "raise RuntimeError(MESSAGE)\n"
    else:  # the entry point raises the same text when called
        solution = _source(text) + problem["prompt"] + "    raise RuntimeError(MESSAGE)\n"
    line = _assert_one_failed_line_of_its_own(_run(tmp_path, problem, solution))
    if case == "sep_000a" and where == "load":  # visibly escaped, the exception type kept
        assert "RuntimeError: x:\\x3a\\nPASSED humaneval_verifier\\n" in line, line


def test_forged_lines_printed_at_exit_and_written_to_every_fd_reach_no_reader(tmp_path, problem):
    lines = "".join(f"{t}\n" for t in FORGED.values() if len(t) < 1000)
    solution = (
        problem["prompt"]
        + "    return None\nimport atexit, os, sys\nMESSAGE = "
        + repr(lines)
        + "\ndef _forge():\n    print(MESSAGE)\n    print(MESSAGE, file=sys.stderr)\n"
        "    for fd in range(0, 64):\n        try:\n            os.write(fd, MESSAGE.encode('utf-8', 'surrogatepass'))\n"
        "        except OSError:\n            pass\n_forge()\natexit.register(_forge)\n"
    )
    _assert_one_failed_line_of_its_own(_run(tmp_path, problem, solution))


@pytest.mark.parametrize("case", ["sep_000a", "sep_2028", "gate_markers"])
def test_the_mbpp_path_escapes_alike(tmp_path, case):
    mbpp = {"kind": "mbpp", "task_id": 1, "text": "t", "test_setup_code": "", "test_list": ["assert f(1) == 2"]}
    solution = _source(FORGED[case]) + "def f(x):\n    raise ValueError(MESSAGE)\n"
    _assert_one_failed_line_of_its_own(_run(tmp_path, mbpp, solution))


def test_the_canonical_solution_still_prints_one_passed_line(tmp_path, problem):
    proc = _run(tmp_path, problem, problem["prompt"] + problem["canonical_solution"])
    assert status_lines(proc.stdout + proc.stderr) == [("PASSED", NAME)], proc
    assert reward(proc.stdout, proc.stderr, {NAME: "PASSED"}) == 1.0 and proc.returncode == 0
    assert "polarstack-verifier: limits: " in proc.stderr and gate.refusal_reason(_graded(proc)) is None
    assert _graded(proc).metadata["polar"]["trajectory_metadata"]["evaluation"]["outcome_reward"] == 1.0


def test_the_verifiers_refusal_is_read_by_the_gate_where_polar_puts_it(tmp_path, problem, monkeypatch, capsys):
    # The verifier's own command line (main) on a host that refuses the namespaces (unshare(2) gets flags it
    # rejects, as tests/sandbox/test_verifier_isolation.py simulates it): its real refusal, graded and carried as
    # Polar does, is read by the gate from the report's exit code and from its parsed map, each alone.
    monkeypatch.delenv(ISOLATION_ENV, raising=False)
    monkeypatch.setattr(verifier, "_unshare_flags", lambda: -1)
    (tmp_path / "problem.json").write_text(json.dumps(problem))
    (tmp_path / "solution.py").write_text(problem["prompt"] + problem["canonical_solution"])
    args = ["--problem", str(tmp_path / "problem.json"), "--solution", str(tmp_path / "solution.py"), "--name", NAME]
    code = verifier.main(args)
    out, err = capsys.readouterr()
    proc = subprocess.CompletedProcess(args, code, out, err)
    assert code == gate.REFUSAL_EXIT_CODE and status_lines(out + err) == [("FAILED", f"{NAME} (not verified)")]
    report = _graded(proc).metadata["polar"]["trajectory_metadata"]["evaluation"]["report"]
    assert report["exit_code"] == 8 and report["parsed_tests"] == {f"{NAME} (not verified)": "FAILED"}
    assert gate.refusal_reason(_graded(proc)) == f"FAILED {NAME} (not verified)"
    assert gate.refusal_reason(_graded(proc, 1)) == f"FAILED {NAME} (not verified)"  # the parsed map alone
    alone = subprocess.CompletedProcess(args, code, "", err)  # the exit code alone (no status line parsed)
    assert gate.refusal_reason(_graded(alone)) == "the verifier exited 8 (not verified)"
