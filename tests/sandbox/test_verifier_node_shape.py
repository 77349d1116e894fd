"""Issue 33's adversarial programs in the node's shape: root in a user namespace that maps only uid 0, as apptainer
gives Polar's sessions, reproduced by `unshare --user --map-root-user --mount --fork` (as root here). The bundled
verifier runs there as Polar's evaluator runs it (`python3 -I verifier.py ...`).

What the verifier decides before any sandbox (the solution file's checks) holds in every shape. What needs the
sandbox (a right answer passes, a task whose calls go through a lambda is refused before its first call) holds there
since the verifier isolates in that shape (issue 32: the candidate as that uid 0 with no capability, no /proc and no
way to make a process; tests/sandbox/test_verifier_one_uid.py); on f6ba232 it refused there (exit 8)."""

import json
import os
import resource
import shutil
import subprocess

import pytest

from polarstack.reward import tasks
from polarstack.reward.verifier import bundle, verdict

pytestmark = pytest.mark.sandbox
SYSTEM_PYTHON = "/usr/bin/python3"


def _cap():
    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))


@pytest.fixture
def node_shape(tmp_path):
    """A function running the bundled verifier in the node's shape on a solution file of `tmp_path`."""
    if os.geteuid() != 0:
        pytest.skip("needs root, to reproduce the node's shape with unshare --user --map-root-user")
    if shutil.which("unshare") is None or not os.access(SYSTEM_PYTHON, os.X_OK):
        pytest.skip(f"needs util-linux's unshare and {SYSTEM_PYTHON}")
    probe = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "--fork", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"unshare --user --map-root-user is refused here: {probe.stderr.decode()[-200:]}")
    bundle.write(tmp_path / "verifier.py")

    def run(problem: dict, solution_name: str = "solution.py") -> subprocess.CompletedProcess:
        (tmp_path / "problem.json").write_text(json.dumps(problem))
        command = [SYSTEM_PYTHON, "-I", "verifier.py", "--problem", "problem.json", "--solution", solution_name]
        return subprocess.run(
            ["unshare", "--user", "--map-root-user", "--mount", "--fork", *command, "--name", "t"],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
            preexec_fn=_cap,  # a verifier that reads what it should not dies of it, never this machine
        )

    run.dir = tmp_path
    return run


def _humaneval():
    problem = next(p for p in tasks.load_humaneval() if p["task_id"] == "HumanEval/2")
    return problem, tasks.verifier_problem_of("humaneval", problem)


def _no_refusal(proc):
    assert not any(verdict.is_refusal(line) for line in (proc.stdout + proc.stderr).splitlines()), proc


@pytest.mark.parametrize("target", ["/dev/zero", "/etc/shadow"])
def test_a_symbolic_link_is_failed_in_the_nodes_shape(node_shape, target):
    _, problem = _humaneval()
    (node_shape.dir / "solution.py").symlink_to(target)
    proc = node_shape(problem)
    assert proc.returncode == 1 and "it is a symbolic link" in proc.stdout, proc
    _no_refusal(proc)


def test_a_fifo_and_an_oversized_file_are_failed_in_the_nodes_shape(node_shape):
    _, problem = _humaneval()
    os.mkfifo(node_shape.dir / "fifo.py")
    with open(node_shape.dir / "big.py", "wb") as handle:
        handle.truncate(270 << 20)  # sparse: larger than the sandbox's tmpfs, no disk used
    for name, says in (("fifo.py", "it is a FIFO"), ("big.py", "larger than the verifier's bound")):
        proc = node_shape(problem, name)
        assert proc.returncode == 1 and says in proc.stdout, proc
        _no_refusal(proc)


def _sandboxed(proc):
    _no_refusal(proc)  # the verifier isolates in this shape: a refusal (exit 8) is a failure
    return proc


def test_a_right_answer_passes_and_a_wrong_one_fails_in_the_nodes_shape(node_shape):
    source, problem = _humaneval()
    (node_shape.dir / "solution.py").write_text(source["prompt"] + source["canonical_solution"])
    right = _sandboxed(node_shape(problem))
    assert right.returncode == 0 and right.stdout.startswith("PASSED t"), right
    (node_shape.dir / "solution.py").write_text(source["prompt"] + "    return 0.0\n")
    wrong = node_shape(problem)
    assert wrong.returncode == 1 and wrong.stdout.startswith("FAILED t (failed"), wrong
    _no_refusal(wrong)


def test_calls_through_a_lambda_are_refused_before_the_first_call_in_the_nodes_shape(node_shape):
    problem = {
        "kind": "mbpp",
        "task_id": "synthetic",
        "test_list": ["assert list(filter(lambda x: f(x) > 1, [1, 2, 3])) == [1, 2, 3]"],
        "test_setup_code": "",
    }
    (node_shape.dir / "solution.py").write_text("def f(x):\n    return x + 1\n")
    proc = _sandboxed(node_shape(problem))
    assert proc.returncode == 1 and "the task's tests branch on the solution's answers (line 1" in proc.stdout, proc
    _no_refusal(proc)
