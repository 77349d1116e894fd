"""Pins issue 25's red-team finding 2 (follow-up): the judge's strict_eq keeps bool apart from int inside sets and
frozensets and for dict keys, nested in tuples too, as it already did in lists, tuples and dict values; equal
numbers still compare by value there (1 and 1.0, as == has them)."""

import pytest

from polarstack.reward.verifier.candidate import _CODEC
from polarstack.reward.verifier.judge_side import _JUDGE_SIDE


@pytest.fixture(scope="module")
def strict_eq():
    namespace: dict = {}
    exec("import ast, builtins, json, os, random, select, sys, time\n" + _CODEC + _JUDGE_SIDE, namespace)
    return namespace["strict_eq"]


NOT_EQUAL = [
    ({False, True}, {0, 1}),
    (frozenset({True}), frozenset({1})),
    ({True: "a"}, {1: "a"}),
    ({(True, 0): "a"}, {(1, 0): "a"}),
    ({frozenset({True})}, {frozenset({1})}),
    ({(1, (False,))}, {(1, (0,))}),
    ({1: True}, {1: 1}),  # values, as before
    ({1: "a", 2: "b"}, {1: "a", 3: "b"}),
    ({1, 2}, {1, 2, 3}),
    ({"k": [True]}, {"k": [1]}),
]
EQUAL = [
    ({0, 1}, {0, 1}),
    ({False, True}, {True, False}),
    ({1: "a"}, {1.0: "a"}),
    ({1, 2.0}, {1.0, 2}),
    ({(1, "x"): [1, 2]}, {(1, "x"): [1, 2]}),
    ({frozenset({1, 2})}, {frozenset({2, 1})}),
    ({True: {False: 1}}, {True: {False: 1}}),
    (set(), set()),
    ({}, {}),
]


@pytest.mark.parametrize("a,b", NOT_EQUAL, ids=[repr(a) for a, _ in NOT_EQUAL])
def test_bool_is_not_int_in_sets_and_dict_keys(strict_eq, a, b):
    assert not strict_eq(a, b) and not strict_eq(b, a)


@pytest.mark.parametrize("a,b", EQUAL, ids=[repr(a) for a, _ in EQUAL])
def test_equal_containers_stay_equal(strict_eq, a, b):
    assert strict_eq(a, b) and strict_eq(b, a)
