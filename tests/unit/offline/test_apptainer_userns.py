"""Pins issue 32's recorded fact (configs/upstream/apptainer-userns.json) and what `make verify-offline` checks it
means: the record is of APPTAINER_RELEASE and names the lines of apptainer's source; the verifier's host detection
classes the recorded map `0 0 1` as its one-uid shape (a full map not); the stack sets no APPTAINER_FAKEROOT, no
--fakeroot and no POLAR_APPTAINER_ISOLATE_PID anywhere it ships or renders. Each broken case is a problem."""

import json
from pathlib import Path

import pytest

from polarstack.offline import apptainer_userns
from polarstack.pins import pins

ROOT = Path(__file__).resolve().parents[3]
RECORD = json.loads((ROOT / apptainer_userns.RECORD).read_text())


def test_the_record_is_of_the_pinned_release_and_cites_the_source():
    assert RECORD["apptainer_release"] == pins()["APPTAINER_RELEASE"]
    assert RECORD["uid_map_for_root"] == "0 0 1"
    assert RECORD["reproduced_by"] == ["unshare", "--user", "--map-root-user", "--mount", "--fork"]
    for name, fact in RECORD["facts"].items():
        assert fact["file"].endswith(".go") and fact["line"] > 0 and fact["fact"], name
    assert RECORD["facts"]["one_uid_map"]["file"] == "internal/pkg/runtime/launch/launcher_linux.go"


def test_the_shipped_stack_is_in_the_recorded_shape():
    assert apptainer_userns.problems() == []


@pytest.mark.parametrize(
    "change,expected",
    [
        ({"apptainer_release": "v1.3.6"}, "not APPTAINER_RELEASE"),
        ({"uid_map_for_root": "0 0 4294967295"}, "does not class the recorded uid map"),
        ({"uid_map_for_root": "0 0 1\n61000 61000 1000"}, "does not class the recorded uid map"),
    ],
)
def test_a_broken_record_is_a_problem(change, expected):
    found = apptainer_userns.problems(dict(RECORD, **change), texts={})
    assert any(expected in p for p in found), found


@pytest.mark.parametrize(
    "switch", ["APPTAINER_FAKEROOT", "SINGULARITY_FAKEROOT", "--fakeroot", "POLAR_APPTAINER_ISOLATE_PID"]
)
def test_a_stack_that_changes_the_shape_is_a_problem(switch):
    texts = {"launch.sh": f"export {switch}=1\n" if not switch.startswith("--") else f"apptainer exec {switch} x\n"}
    found = apptainer_userns.problems(RECORD, texts=texts)
    assert len(found) == 1 and switch in found[0] and "launch.sh" in found[0], found
