"""Pins issue 20, finding 1's oracle: the judge no longer tells, through its call pattern, which answer was right.
For every HumanEval task the calls a wrong candidate receives (one that returns None, or raises every third call)
are the calls the canonical solution receives, in the same order: each candidate logs what it is called with and
prints a digest on its stderr at exit. The rewriting keeps the tests' meaning (short-circuit `and`/`or`, `x if c
else y` and all()/any() evaluate every operand, then combine as Python does) and flags tests whose control flow
depends on the answers."""

import ast
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from polarstack.reward import tasks, verifier
from polarstack.reward.verifier.candidate import _CODEC
from polarstack.reward.verifier.judge_side import _JUDGE_SIDE
from polarstack.reward.verifier.limits import Limits, Outcome

pytestmark = pytest.mark.sandbox
SEED = 20
FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "mbpp_sample.jsonl"

# Appended to a solution: wraps the entry point, logs every call from outside (not its own recursion) and prints
# `CALLS <count> <digest>` at exit. WRONG: what the wrapper answers instead of calling the solution.
LOGGER = r"""
import atexit as _atexit, hashlib as _hashlib, sys as _sys
_real = {entry}
_log, _count, _depth = _hashlib.sha256(), [0], [0]


def _canon(x):
    if isinstance(x, (set, frozenset)):
        return (type(x).__name__, sorted(repr(_canon(v)) for v in x))
    if isinstance(x, (list, tuple)):
        return (type(x).__name__, [_canon(v) for v in x])
    if isinstance(x, dict):
        return ("dict", [(_canon(k), _canon(v)) for k, v in x.items()])
    return (type(x).__name__, repr(x))


def {entry}(*args, **kwargs):
    if _depth[0] == 0:
        _log.update(repr(_canon((args, kwargs))).encode())
        _count[0] += 1
    _depth[0] += 1
    try:
        {body}
    finally:
        _depth[0] -= 1


_atexit.register(lambda: _sys.stderr.write("CALLS %d %s\n" % (_count[0], _log.hexdigest())))
"""
RIGHT = "return _real(*args, **kwargs)"
WRONG = "if _count[0] % 3 == 0:\n            raise ValueError('wrong')\n        return None"


def _calls(outcome: Outcome) -> tuple[int, str]:
    found = re.findall(r"CALLS (\d+) ([0-9a-f]{64})", outcome.stderr_tail)
    assert found, outcome
    return int(found[-1][0]), found[-1][1]


def _completion(problem: dict, body: str) -> str:
    solution = problem["canonical_solution"] if body == RIGHT else "    return None\n"
    return problem["prompt"] + solution + LOGGER.format(entry=problem["entry_point"], body=body)


def test_every_humaneval_task_calls_a_wrong_candidate_as_it_calls_the_canonical_one():
    problems = tasks.load_humaneval()
    items = [(p, body) for p in problems for body in (RIGHT, WRONG)]

    def one(item):
        problem, body = item
        return verifier.verify(problem, _completion(problem, body), Limits(timeout=20), seed=SEED)

    with ThreadPoolExecutor(max_workers=2) as pool:
        outcomes = list(pool.map(one, items))
    differ = []
    for index, problem in enumerate(problems):
        right, wrong = outcomes[2 * index], outcomes[2 * index + 1]
        assert right.passed, (problem["task_id"], right.detail)  # the logger keeps the canonical solution right
        assert not wrong.passed, problem["task_id"]
        if _calls(right) != _calls(wrong):
            differ.append((problem["task_id"], _calls(right)[0], _calls(wrong)[0]))
    assert differ == [], differ
    assert len(problems) == 164


def _mbpp(tests: list[str]) -> dict:
    return {"kind": "mbpp", "task_id": "synthetic", "test_list": tests, "test_setup_code": ""}


def test_short_circuits_and_all_any_still_make_every_call_and_keep_their_meaning():
    tests = [
        "assert f(1) == 2 and f(2) == 3",
        "assert f(3) == 0 or f(4) == 5",
        "assert (f(5) if f(6) == 7 else f(7)) == 6",
        "assert all(f(x) == x + 1 for x in range(8, 11))",
        "assert not any(f(x) == 0 for x in range(11, 14))",
    ]
    right = "def f(x):\n    return x + 1\n" + LOGGER.format(entry="f", body=RIGHT)
    wrong = "def f(x):\n    return 0\n" + LOGGER.format(entry="f", body=WRONG)
    ran = [verifier.verify(_mbpp(tests), code, Limits(timeout=10)) for code in (right, wrong)]
    assert ran[0].passed, ran[0]
    assert not ran[1].passed
    assert _calls(ran[0]) == _calls(ran[1]) and _calls(ran[0])[0] == 13
    # Each rewritten form still decides as Python does: a falsy first operand fails `and` though the second holds.
    assert not verifier.verify(_mbpp(["assert f(1) == 0 and f(2) == 3"]), "def f(x):\n    return x + 1\n").passed
    assert verifier.verify(_mbpp(["assert f(1) == 0 or f(2) == 3"]), "def f(x):\n    return x + 1\n").passed


def test_a_failure_or_an_exception_is_recorded_and_the_tests_go_on():
    tests = ["assert f(1) == 99", "y = f(2)", "assert f(3) == 4"]
    raising = "def f(x):\n    if x == 1:\n        raise KeyError(x)\n    return x + 1\n"
    outcome = verifier.verify(_mbpp(tests), raising, Limits(timeout=10))
    assert not outcome.passed and outcome.calls == 3, outcome
    assert re.match(r"\d+ check\(s\) failed, first: KeyError at line 1", outcome.detail), outcome.detail


@pytest.fixture(scope="module")
def judge_side():
    namespace: dict = {}
    exec("import ast, builtins, json, os, random, select, sys, time\n" + _CODEC + _JUDGE_SIDE, namespace)
    return namespace


@pytest.mark.parametrize(
    "source,dependent",
    [
        ("def check(candidate):\n    if candidate(1) == 2:\n        assert candidate(3) == 4\n", True),
        ("def check(candidate):\n    x = candidate(1)\n    while x:\n        x = candidate(x)\n", True),
        ("def check(candidate):\n    for v in candidate(1):\n        candidate(v)\n", True),
        (
            "def check(candidate):\n    for v in range(3):\n        if v == 1:\n            v = 2\n        candidate(v)\n",
            False,
        ),
        ("def check(candidate):\n    s = candidate(1)\n    assert s == 2\n    assert candidate(3) == 4\n", False),
    ],
)
def test_control_flow_that_depends_on_answers_is_flagged(judge_side, source, dependent):
    assert bool(judge_side["answer_dependent"](ast.parse(source), {"f"})) is dependent


def test_no_humaneval_task_has_control_flow_that_depends_on_answers(judge_side):
    flagged = [
        p["task_id"]
        for p in tasks.load_humaneval()
        if judge_side["answer_dependent"](ast.parse(p["test"]), {p["entry_point"]})
    ]
    assert flagged == []


# --- issue 25, finding 4: a task whose tests branch on the answers is not graded, before any call -----------
# The page cache of the read-only binds survives a run and can carry bits to the next one (docs/tasks.md); it is
# harmless only while no run learns, from the calls it receives, which of its answers was right. For every task,
# including any MBPP file a user brings: tests whose control flow depends on the answers are refused before the
# first call, so the right and the wrong candidate receive the same calls (none).
BRANCHING_HUMANEVAL = {
    "kind": "humaneval",
    "task_id": "synthetic/branching",
    "prompt": "def f(x):\n",
    "entry_point": "f",
    "test": "def check(candidate):\n    if candidate(1) == 2:\n        assert candidate(3) == 4\n",
}
BRANCHING_MBPP = _mbpp(["x = f(1)", "for v in x: assert f(v) == [v + 1]"])


@pytest.mark.parametrize(
    "problem, right, wrong",
    [
        (BRANCHING_HUMANEVAL, "    return x + 1\n", "    return 0\n"),
        (BRANCHING_MBPP, "def f(x):\n    return [x + 1]\n", "def f(x):\n    return []\n"),
    ],
    ids=["humaneval", "mbpp"],
)
def test_tests_that_branch_on_answers_are_refused_before_the_first_call(problem, right, wrong):
    ran = [verifier.verify(problem, code, Limits(timeout=10)) for code in (right, wrong)]
    for outcome in ran:
        assert not outcome.passed and outcome.calls == 0, outcome
        assert outcome.detail.startswith("the task's tests branch on the solution's answers"), outcome.detail


# --- issue 33, finding 4: answer dependence refused by shape (an allowlist), not by a search for branches ------
# Calls made through a lambda, a higher-order function or a lazy consumer are made, or not, depending on what the
# solution answered: filter(lambda ...) and takewhile(lambda ...) gave a right and a wrong candidate different
# call counts on f6ba232 and were graded. Each shape below is refused before the first call, for a right and a
# wrong candidate alike (none of them is in HumanEval's 164; test_no_humaneval_task_... keeps those accepted).
HIDDEN_DEPENDENCE = {
    "filter_lambda": ["assert list(filter(lambda x: f(x) > 1, [1, 2, 3])) == [1, 2, 3]"],
    "takewhile_lambda": [
        "import itertools",
        "assert list(itertools.takewhile(lambda x: f(x) > 1, [1, 2, 3])) == [1, 2, 3]",
    ],
    "map": ["assert list(map(f, [1, 2, 3])) == [2, 3, 4]"],
    "sorted_key": ["assert sorted([3, 1, 2], key=f) == [1, 2, 3]"],
    "reduce": ["import functools", "assert functools.reduce(lambda a, b: a + f(b), [1, 2, 3], 0) == 9"],
    "sum_of_a_generator": ["assert sum(f(x) for x in range(3)) == 6"],
    "set_comprehension": ["assert {f(x) for x in range(3)} == {1, 2, 3}"],
    "two_calls_in_an_element": ["assert [f(x) + f(x + 10) for x in range(3)] == [13, 15, 17]"],
    "iteration_over_an_answer": ["assert [f(v) for v in f([1, 2])] == [1, 2]"],
    "answer_as_an_argument": ["x = f(1)", "assert f(x) == 3"],
    "answer_through_a_mutation": ["xs = []", "xs.append(f(1))", "assert f(xs[0]) == 3"],
    "try_around_a_call": ["try:\n    assert f(1) == 2\n    assert f(2) == 3\nexcept TypeError:\n    pass"],
    "break_on_an_answer": ["for i in range(3):\n    if f(i) == 99:\n        break\n    assert f(i + 10) == i + 11"],
    "function_of_the_tests": ["def twice(x):\n    return f(x) + f(x)", "assert twice(1) == 4"],
}


@pytest.mark.parametrize("tests", list(HIDDEN_DEPENDENCE.values()), ids=list(HIDDEN_DEPENDENCE))
def test_calls_hidden_in_lambdas_and_higher_order_functions_are_refused_before_the_first_call(tests):
    right = "def f(x):\n    if isinstance(x, list):\n        return x\n    return x + 1\n"
    wrong = "def f(x):\n    raise TypeError('wrong')\n"
    for code in (right, wrong):
        outcome = verifier.verify(_mbpp(tests), code, Limits(timeout=10))
        assert not outcome.passed and outcome.calls == 0, outcome
        assert outcome.detail.startswith("the task's tests branch on the solution's answers (line "), outcome.detail


def test_the_mbpp_fixture_and_the_shapes_it_allows_are_still_graded():
    for record in tasks.load_mbpp(source=FIXTURE):
        outcome = verifier.verify(record, record["code"], Limits(timeout=10))
        assert outcome.passed, (record["task_id"], outcome)
    allowed = [
        "assert all(f(x) == x + 1 for x in range(3))",
        "assert [f(x) for x in range(3)] == [1, 2, 3]",
        "assert list(f(x) for x in range(3)) == [1, 2, 3]",
        "assert f(1) == 2 and f(2) == 3",
        "import math",
        "assert math.isclose(f(1), 2.0, rel_tol=0.001)",
        "y = f(4)",
        "assert y == 5",
    ]
    right = verifier.verify(_mbpp(allowed), "def f(x):\n    return x + 1\n", Limits(timeout=10))
    assert right.passed and right.calls == 13, right
    wrong = verifier.verify(_mbpp(allowed), "def f(x):\n    return 0\n", Limits(timeout=10))
    assert not wrong.passed and wrong.calls == 13, wrong
