"""Pins issue 25's red-team findings 1 and 2 (follow-up): a solution that only raises StopIteration (or
StopAsyncIteration) does not pass tests that call it through map, filter or iter, which read that exception as
"no more items" (since issue 33 such shapes are refused before the first call, for every candidate); and a bool
does not stand for an int inside a set or as a dict key. Each candidate runs through
the bundled verifier's command line and is graded by Polar's rule (tests/polar_grading.py)."""

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from polar_grading import reward, status_lines
from polarstack.reward.verifier import bundle

pytestmark = pytest.mark.sandbox
VERIFIER = bundle.write(Path(tempfile.mkdtemp(prefix="polarstack-verifier-")) / "verifier.py")  # as tasks writes it
NAME = "task_verifier"


def _run(tmp_path: Path, problem: dict, solution: str) -> subprocess.CompletedProcess:
    (tmp_path / "problem.json").write_text(json.dumps(problem))
    (tmp_path / "solution.py").write_text(solution)
    args = ["--problem", str(tmp_path / "problem.json"), "--solution", str(tmp_path / "solution.py")]
    return subprocess.run(
        [sys.executable, str(VERIFIER), *args, "--name", NAME, "--timeout", "10"],
        capture_output=True,
        text=True,
        timeout=90,
        env={"PATH": "/usr/bin:/bin"},
    )


def _reward(proc: subprocess.CompletedProcess) -> float:
    return reward(proc.stdout, proc.stderr, {NAME: "PASSED"})


def _mbpp(tests: list[str]) -> dict:
    return {"kind": "mbpp", "task_id": 9001, "text": "t", "test_setup_code": "", "test_list": tests}


EVEN = "def is_even(n):\n    return n % 2 == 0\n"
MBPP_TESTS = {  # each holds for EVEN, and held (reward 1) for a raising solution before the fix
    "all_map": ["assert all(map(is_even, [2, 4, 6]))"],
    "filter_empty": ["assert list(filter(is_even, [1, 3, 5])) == []"],
    "sum_map": ["assert sum(map(is_even, [1, 3, 5])) == 0"],
    "iter_sentinel": ["assert list(iter(lambda: is_even(2), True)) == []"],
}
RAISING = {
    "stop_iteration": "def is_even(n):\n    raise StopIteration\n",
    "stop_iteration_with_value": "def is_even(n):\n    raise StopIteration(True)\n",
    "stop_async_iteration": "def is_even(n):\n    raise StopAsyncIteration\n",
}


# Since issue 33 these shapes (the solution's function passed to map, filter, iter, or called in a lambda) are
# refused before the first call, for every candidate, since how often they call it depends on its answers; the
# raising solution still gets 0. The PEP 479 conversion stays for what is still graded (an explicit `next()`).
REFUSED = "the task's tests branch on the solution's answers (line 1 "


@pytest.mark.parametrize("raising", sorted(RAISING))
@pytest.mark.parametrize("case", sorted(MBPP_TESTS))
def test_a_solution_raising_stop_iteration_fails_tests_that_map_or_filter_it(tmp_path, case, raising):
    right = _run(tmp_path, _mbpp(MBPP_TESTS[case]), EVEN)
    assert _reward(right) == 0.0 and REFUSED in right.stdout, right  # refused by shape (issue 33)
    proc = _run(tmp_path, _mbpp(MBPP_TESTS[case]), RAISING[raising])
    assert [s for s, _ in status_lines(proc.stdout + proc.stderr)] == ["FAILED"], proc
    assert _reward(proc) == 0.0 and proc.returncode == 1, proc


@pytest.mark.parametrize("raising", sorted(RAISING))
def test_a_stop_iteration_does_not_end_an_iteration_of_the_tests(tmp_path, raising):
    tests = ["it = iter([is_even(2), is_even(4)])", "assert next(it, 'end') is True and next(it, 'end') is True"]
    right = _run(tmp_path, _mbpp(tests), EVEN)
    assert _reward(right) == 1.0, right
    proc = _run(tmp_path, _mbpp(tests), RAISING[raising])
    assert _reward(proc) == 0.0 and proc.returncode == 1, proc


def test_a_humaneval_check_mapping_the_candidate_fails_a_stop_iteration(tmp_path):
    problem = {
        "kind": "humaneval",
        "task_id": "X/1",
        "entry_point": "is_even",
        "prompt": "def is_even(n):\n    '''n even'''\n",
        "test": "def check(candidate):\n    assert all(map(candidate, [2, 4, 6]))\n"
        "    assert not any(map(candidate, [1, 3]))\n",
    }
    right = _run(tmp_path, problem, problem["prompt"] + "    return n % 2 == 0\n")
    assert _reward(right) == 0.0 and "the task's tests branch on the solution's answers (line 2 " in right.stdout, right
    proc = _run(tmp_path, problem, problem["prompt"] + "    raise StopIteration\n")
    assert _reward(proc) == 0.0 and proc.returncode == 1, proc


def test_a_test_expecting_a_builtin_error_still_sees_it(tmp_path):
    tests = ["try:\n    f(0)\nexcept ValueError:\n    pass\nelse:\n    assert False", "assert f(1) == 1"]
    proc = _run(tmp_path, _mbpp(tests), "def f(x):\n    if x == 0:\n        raise ValueError(x)\n    return x\n")
    assert _reward(proc) == 1.0, proc


@pytest.mark.parametrize(
    "tests,solution",
    [
        (["assert odd_positions([5, 7]) == {0, 1}"], "def odd_positions(xs):\n    return {False, True}\n"),
        (["assert keyed() == {1: 'a'}"], "def keyed():\n    return {True: 'a'}\n"),
        (["assert keyed() == {(1, 0): 'a'}"], "def keyed():\n    return {(True, False): 'a'}\n"),
        (["assert nested() == {frozenset({1})}"], "def nested():\n    return {frozenset({True})}\n"),
    ],
)
def test_a_bool_does_not_stand_for_an_int_in_a_set_or_as_a_dict_key(tmp_path, tests, solution):
    proc = _run(tmp_path, _mbpp(tests), solution)
    assert _reward(proc) == 0.0 and proc.returncode == 1, proc
    right = solution.replace("True", "1").replace("False", "0")
    assert _reward(_run(tmp_path, _mbpp(tests), right)) == 1.0
