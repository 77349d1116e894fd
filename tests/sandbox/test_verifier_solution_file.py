"""Pins issue 33, findings 2 and 3: the solution file is read safely, and a set-up failure the candidate's files
cause is a wrong answer, never a refusal.

An agent's patch can make `solution.py` a symbolic link (git's mode 120000, which Polar's `git apply` replays): on
f6ba232 the verifier read it with `Path.read_text()` outside any sandbox, so a link to /dev/zero grew the verifier
until something killed it (no verdict line), a FIFO blocked it, and a 270 MiB file filled the sandbox's 256 MB
tmpfs at set-up, which the verifier reported as "the host cannot isolate" (exit 8, `(not verified)`, a refusal the
gate counts). Now: opened with O_NOFOLLOW | O_NONBLOCK, a regular file by fstat, at most SOLUTION_LIMIT (1 MiB)
bytes; anything else, and any failure to write the candidate's files into the sandbox, is `FAILED` (exit 1).

The command line runs as Polar's evaluator runs it (the bundled file, `python3 -I`), under an address-space cap
of its own (so that the f6ba232 behaviour, run against this file, fails the test instead of eating the machine);
its peak resident size (wait4's ru_maxrss: the verifier and the supervisor it waited for) is asserted below
VERIFIER_RSS_MIB."""

import json
import os
import subprocess
import time

import pytest

from polarstack.reward import tasks, verifier
from polarstack.reward.verifier import bundle, verdict
from polarstack.reward.verifier.limits import Limits

pytestmark = pytest.mark.sandbox
VERIFIER_RSS_MIB = 64  # measured: see docs/tasks.md ("The solution file")


def _problem():
    return next(p for p in tasks.load_humaneval() if p["task_id"] == "HumanEval/2")


@pytest.fixture
def evaldir(tmp_path):
    bundle.write(tmp_path / "verifier.py")
    (tmp_path / "problem.json").write_text(json.dumps(tasks.verifier_problem_of("humaneval", _problem())))
    return tmp_path


# Runs the verifier under a 1 GiB address-space cap as its child and reports the child's peak resident size (wait4's
# ru_maxrss covers the child and every descendant it waited for: the verifier, and a supervisor if one started).
WRAPPER = r"""
import os, resource, sys
resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
pid = os.fork()
if pid == 0:
    os.execv(sys.argv[1], sys.argv[1:])
_, status, usage = os.wait4(pid, 0)
sys.stderr.write("MAXRSS_KIB %d" % usage.ru_maxrss)
sys.exit(os.waitstatus_to_exitcode(status))
"""


def _run(evaldir, solution: str, timeout: float = 30):
    """(exit code, stdout, stderr, seconds, peak RSS in MiB) of the bundled verifier on `solution`."""
    started = time.monotonic()
    command = ["/usr/bin/python3", "-I", "verifier.py", "--problem", "problem.json", "--solution", solution]
    process = subprocess.Popen(
        ["/usr/bin/python3", "-I", "-c", WRAPPER, *command, "--name", "t"],
        cwd=evaldir,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()  # by its own handle: the wrapper this test started (the verifier dies with its pipes)
        process.communicate()
        pytest.fail(f"the verifier did not finish within {timeout} s on {solution}")
    err, _, rss = err.decode().rpartition("MAXRSS_KIB ")
    return process.returncode, out.decode(), err, time.monotonic() - started, int(rss) >> 10


def _assert_failed(result, says: str):
    code, out, err, seconds, rss = result
    assert code == 1, result
    assert out.startswith("FAILED t (failed: the solution file solution.py is not read: "), result
    assert says in out, result
    assert not any(verdict.is_refusal(line) for line in (out + err).splitlines()), result
    assert seconds < 10, result
    assert rss < VERIFIER_RSS_MIB, result


@pytest.mark.parametrize("target", ["/dev/zero", "/dev/urandom", "/etc/passwd"])
def test_a_symbolic_link_is_not_followed(evaldir, target):
    (evaldir / "solution.py").symlink_to(target)
    _assert_failed(_run(evaldir, "solution.py"), "it is a symbolic link")


def test_a_fifo_is_not_read(evaldir):
    os.mkfifo(evaldir / "solution.py")  # no writer: reading it would block for ever
    _assert_failed(_run(evaldir, "solution.py"), "it is a FIFO, not a regular file")


def test_a_device_or_a_directory_is_not_read(evaldir):
    os.mknod(evaldir / "solution.py", 0o600 | 0o020000, os.makedev(1, 5)) if os.geteuid() == 0 else None
    if os.geteuid() == 0:  # a character device node of /dev/zero's numbers, as a patch cannot make but root can
        _assert_failed(_run(evaldir, "solution.py"), "it is a character device, not a regular file")
        (evaldir / "solution.py").unlink()
    (evaldir / "solution.py").mkdir()
    _assert_failed(_run(evaldir, "solution.py"), "it is a directory, not a regular file")


def test_a_file_over_the_bound_is_not_read_even_when_it_is_right(evaldir):
    problem = _problem()
    padding = "#" * 99 + "\n"
    text = problem["prompt"] + problem["canonical_solution"] + padding * (verifier.SOLUTION_LIMIT // 100 + 1)
    (evaldir / "solution.py").write_text(text)
    _assert_failed(_run(evaldir, "solution.py"), f"larger than the verifier's bound of {verifier.SOLUTION_LIMIT} bytes")
    assert not verifier.verify(problem, text).passed  # the slime hook's path bounds it too


def test_a_solution_that_would_fill_the_sandboxs_disk_is_a_wrong_answer_not_a_refusal(evaldir):
    # 270 MiB (a sparse file: no disk used here), larger than the sandbox's 256 MB tmpfs: on f6ba232, exit 8.
    with open(evaldir / "solution.py", "wb") as handle:
        handle.truncate(270 << 20)
    _assert_failed(_run(evaldir, "solution.py"), "larger than the verifier's bound")


def test_a_set_up_failure_the_candidates_files_cause_is_failed_with_exit_1(evaldir, monkeypatch, capsys):
    # A sandbox disk smaller than the solution (1 MiB of tmpfs, a right solution of 1.5 MiB, the bound raised to
    # 2 MiB for this test): the write at set-up fails with ENOSPC inside the sandbox. That is the candidate's
    # doing: FAILED, exit 1, and no line the gate counts.
    monkeypatch.setattr(verifier, "TMPFS_MB", 1)
    monkeypatch.setattr(verifier, "SOLUTION_LIMIT", 2 << 20)
    problem = _problem()
    text = problem["prompt"] + problem["canonical_solution"]
    text += ("#" * 99 + "\n") * 15000
    outcome = verifier.verify(problem, text)
    assert not outcome.passed and outcome.reason == "failed", outcome
    assert outcome.detail.startswith("the sandbox cannot hold the solution's files (solution.py: No space left"), (
        outcome
    )
    (evaldir / "solution.py").write_text(text)
    code = verifier.main(["--problem", str(evaldir / "problem.json"), "--solution", str(evaldir / "solution.py")])
    captured = capsys.readouterr()
    assert code == 1, captured
    assert captured.out.startswith("FAILED verifier (failed: the sandbox cannot hold the solution's files"), captured
    assert not any(verdict.is_refusal(line) for line in (captured.out + captured.err).splitlines()), captured


@pytest.mark.parametrize("isolation", ["namespaces", "none"])
def test_text_the_sandbox_cannot_write_is_a_wrong_answer_not_a_refusal(isolation):
    # A completion with a lone surrogate (slime's hook passes the model's text as it is) cannot be written as
    # UTF-8 at set-up: on f6ba232 that raised IsolationUnavailable (exit 8 on the command line, a refusal).
    problem = {"kind": "mbpp", "task_id": "synthetic", "test_list": ["assert f(1) == 2"], "test_setup_code": ""}
    outcome = verifier.verify(problem, "def f(x):\n    return x + 1\n# \udc80\n", Limits(isolation=isolation))
    assert not outcome.passed and outcome.reason == "failed", outcome
    assert outcome.detail.startswith("the sandbox cannot hold the solution's files ("), outcome
