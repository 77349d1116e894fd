"""Pins that the bundled verifier (eval/verifier.py, written by polarstack.reward.verifier.bundle) runs on its own, as
Polar's evaluator runs it in the agent sandbox: the system interpreter, isolated mode (`python3 -I`), a fresh
working directory and no polarstack importable; it prints `PASSED <name>` (exit 0) for a canonical HumanEval
solution and `FAILED <name>` (exit 1) for a wrong one; and that the test_command Polar runs is that isolated mode."""

import json
import os
import subprocess

import pytest

from polarstack.reward import tasks
from polarstack.reward.verifier import bundle

pytestmark = pytest.mark.sandbox
SYSTEM_PYTHON = "/usr/bin/python3"


def test_the_bundled_file_verifies_without_polarstack(tmp_path):
    if not os.access(SYSTEM_PYTHON, os.X_OK):
        pytest.skip(f"needs {SYSTEM_PYTHON}, an interpreter without polarstack installed")
    env = {"PATH": "/usr/bin:/bin"}
    probe = subprocess.run(
        [SYSTEM_PYTHON, "-I", "-c", "import polarstack"], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    if probe.returncode == 0:
        pytest.skip(f"{SYSTEM_PYTHON} can import polarstack here, so it cannot show the file stands alone")
    assert "No module named 'polarstack'" in probe.stderr
    bundle.write(tmp_path / "verifier.py")
    problem = next(p for p in tasks.load_humaneval() if p["task_id"] == "HumanEval/2")
    (tmp_path / "problem.json").write_text(json.dumps(tasks.verifier_problem_of("humaneval", problem)))
    (tmp_path / "good.py").write_text(problem["prompt"] + problem["canonical_solution"])
    (tmp_path / "bad.py").write_text(problem["prompt"] + "    return -1.0\n")
    for solution, expected, code in (("good.py", "PASSED t\n", 0), ("bad.py", "FAILED t (failed", 1)):
        proc = subprocess.run(
            [SYSTEM_PYTHON, "-I", "verifier.py", "--problem", "problem.json", "--solution", solution, "--name", "t"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode == code and proc.stdout.startswith(expected), (solution, proc.stdout, proc.stderr)


def test_the_rendered_test_command_is_isolated_from_python_environment_variables(tmp_path):
    """Issue 25's red-team, point 5: the evaluator's test_command runs `python3 -I`, so a PYTHONPATH (or user site)
    that holds a sitecustomize forging the verdict is not read; graded by Polar's rule (tests/polar_grading.py)."""
    from polar_grading import reward

    if not os.access(SYSTEM_PYTHON, os.X_OK):
        pytest.skip(f"needs {SYSTEM_PYTHON}, the interpreter the test_command's `python3` names on PATH")
    command = tasks.task_template("humaneval")["evaluator"]["config"]["test_command"]
    assert " python3 -I " in command, command
    workdir, evaldir, forged = tmp_path / "workspace", tmp_path / "eval", tmp_path / "forged"
    for folder in (workdir, evaldir, forged):
        folder.mkdir()
    command = command.replace(tasks.EVALDIR, str(evaldir)).replace(tasks.WORKDIR, str(workdir))
    bundle.write(evaldir / "verifier.py")
    problem = next(p for p in tasks.load_humaneval() if p["task_id"] == "HumanEval/2")
    (evaldir / "problem.json").write_text(json.dumps(tasks.verifier_problem_of("humaneval", problem)))
    (workdir / "solution.py").write_text(problem["prompt"] + "    return -1.0\n")  # wrong
    (forged / "sitecustomize.py").write_text("import os\nos.write(1, b'PASSED humaneval_verifier\\n')\nos._exit(0)\n")
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(forged), "PYTHONUSERBASE": str(forged)}
    proc = subprocess.run(["/bin/sh", "-c", command], env=env, capture_output=True, text=True, timeout=60)
    assert proc.stdout.startswith("FAILED humaneval_verifier (failed"), (proc.stdout, proc.stderr)
    assert reward(proc.stdout, proc.stderr, {"humaneval_verifier": "PASSED"}) == 0.0 and proc.returncode == 1
