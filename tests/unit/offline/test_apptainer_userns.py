"""Pins issue 32's recorded fact (configs/upstream/apptainer-userns.json) and what `make verify-offline` checks it
means: the record is of APPTAINER_RELEASE and names the lines of apptainer's source; the verifier's host detection
classes the recorded map `0 0 1` as its one-uid shape (a full map not); the stack sets no APPTAINER_FAKEROOT, no
--fakeroot and no POLAR_APPTAINER_ISOLATE_PID anywhere it ships or renders. Each broken case is a problem."""

import json
from pathlib import Path

import pytest

from polarstack.offline import apptainer_userns
from polarstack.pins import pins
from polarstack.stack.cluster import load as load_cluster

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
    assert apptainer_userns.problems(cluster=load_cluster()) == []


@pytest.mark.parametrize(
    "change,expected",
    [
        ({"apptainer_release": "v1.3.6"}, "not APPTAINER_RELEASE"),
        ({"uid_map_for_root": "0 0 4294967295"}, "does not class the recorded uid map"),
        ({"uid_map_for_root": "0 0 1\n61000 61000 1000"}, "does not class the recorded uid map"),
    ],
)
def test_a_broken_record_is_a_problem(change, expected):
    found = apptainer_userns.problems(dict(RECORD, **change), texts={}, cluster=load_cluster())
    assert any(expected in p for p in found), found


@pytest.mark.parametrize(
    "switch", ["APPTAINER_FAKEROOT", "SINGULARITY_FAKEROOT", "--fakeroot", "POLAR_APPTAINER_ISOLATE_PID"]
)
def test_a_stack_that_changes_the_shape_is_a_problem(switch):
    texts = {"launch.sh": f"export {switch}=1\n" if not switch.startswith("--") else f"apptainer exec {switch} x\n"}
    found = apptainer_userns.problems(RECORD, texts=texts, cluster=load_cluster())
    assert len(found) == 1 and switch in found[0] and "launch.sh" in found[0], found


OLD_GRANT = ["seccomp=unconfined", "apparmor=unconfined", "systempaths=unconfined"]  # compose.yaml before the review


def test_the_record_says_proc_is_the_trainers_without_a_pid_namespace_and_tmp_is_bound_by_default():
    proc = RECORD["facts"]["proc_bound_without_pid_namespace"]
    assert proc["file"] == "internal/pkg/runtime/engine/apptainer/container_linux.go"
    assert proc["function"] == "container.addKernelMount" and "kernel.core_pattern" in proc["fact"]
    tmp = RECORD["facts"]["tmp_bound_by_default"]
    assert tmp["function"] == "container.addTmpMount" and "POLAR_APPTAINER_NO_MOUNT_TMP" in tmp["fact"]
    assert RECORD["proc_sys_lifted_by"] == "systempaths=unconfined"


def test_lifting_proc_sys_for_sessions_run_as_the_nodes_root_is_a_problem():
    """The trainer as composed before the review: Docker's read-only /proc/sys lifted while the sessions' uid 0 is
    the node's root with the trainer's /proc bound in (no PID namespace)."""
    found = apptainer_userns.procfs_problems(OLD_GRANT, {"POLAR_APPTAINER_NO_INSTANCE": "1"})
    assert len(found) == 1 and "kernel.core_pattern" in found[0], found
    assert f"container_linux.go:{RECORD['facts']['proc_bound_without_pid_namespace']['line']}" in found[0]
    assert apptainer_userns.procfs_problems(OLD_GRANT[:2], {}) == []


@pytest.mark.parametrize(
    "change",
    [
        {"facts": {}},  # the record no longer says how the sessions' /proc is made
        {"uid_map_for_root": "0 1000 1"},  # a shape this check was not written for
    ],
)
def test_lifting_proc_sys_in_an_unrecorded_shape_is_still_a_problem(change):
    assert apptainer_userns.procfs_problems(OLD_GRANT, {}, dict(RECORD, **change))
    assert apptainer_userns.procfs_problems(OLD_GRANT[:2], {}, dict(RECORD, **change)) == []


def test_global_root_is_read_from_the_map():
    assert apptainer_userns.maps_global_root("0 0 1") and apptainer_userns.maps_global_root("0 0 4294967295")
    assert not apptainer_userns.maps_global_root("0 1000 1") and not apptainer_userns.maps_global_root("1 0 1")


# --- review point 6: what of Polar's environment a session gets --------------------------------------------------


def test_the_record_has_apptainers_environment_rule():
    rule = RECORD["environment"]
    assert {"HOME", "PATH", "LD_LIBRARY_PATH"} <= set(rule["always_omitted"]) and "TERM" in rule["always_passed"]
    assert rule["prefixes_not_forwarded"] == ["APPTAINER_", "SINGULARITY_"] and rule["cleanenv_sets"] == {"LANG": "C"}
    for name in ("environment_without_cleanenv", "environment_with_cleanenv"):
        assert RECORD["facts"][name]["file"] == "internal/pkg/util/env/create.go", name


POLAR_ENV = {"WANDB_API_KEY": "k", "PATH": "/trainer/bin", "TERM": "xterm", "APPTAINER_BIND": "/x", "RAY_X": "1"}


def test_without_cleanenv_a_session_inherits_polars_environment_with_cleanenv_only_its_command_line():
    inherited = apptainer_userns.session_environment(POLAR_ENV, {"HOME": "/polar/session/home"}, cleanenv=False)
    assert inherited == {"WANDB_API_KEY": "k", "TERM": "xterm", "RAY_X": "1", "HOME": "/polar/session/home"}
    clean = apptainer_userns.session_environment(POLAR_ENV, {"HOME": "/polar/session/home"}, cleanenv=True)
    assert clean == {"LANG": "C", "TERM": "xterm", "HOME": "/polar/session/home"}
    override = {**POLAR_ENV, "APPTAINERENV_WANDB_API_KEY": "k"}  # apptainer's override prefix, cleanenv or not
    assert apptainer_userns.session_environment(override, {}, cleanenv=True)["WANDB_API_KEY"] == "k"


def test_a_pass_through_secret_reaching_the_sessions_is_a_problem():
    found = apptainer_userns.secret_problems(["WANDB_API_KEY"], POLAR_ENV, {}, "launch.sh")
    assert len(found) == 1 and found[0].startswith("WANDB_API_KEY, passed through to the trainer, reaches"), found
    assert (
        apptainer_userns.secret_problems(["WANDB_API_KEY"], {**POLAR_ENV, "POLAR_APPTAINER_CLEANENV": "1"}, {}, "x")
        == []
    )


# --- review point 1: the sessions' /dev, IPC and PID namespaces --------------------------------------------------
DOCKERFILE = (ROOT / "images" / "trainer" / "Dockerfile").read_text()


def test_the_record_says_dev_is_the_trainers_by_default_and_pid_needs_a_fresh_proc():
    for name in ("dev_bound_by_default", "dev_minimal", "fresh_proc_with_pid_namespace", "mount_failure_is_fatal"):
        fact = RECORD["facts"][name]
        assert fact["file"] == "internal/pkg/runtime/engine/apptainer/container_linux.go" and fact["line"] > 0, name
    assert RECORD["facts"]["ipc_namespace_only_when_asked"]["file"] == "internal/pkg/runtime/launch/launcher_linux.go"
    assert RECORD["mount_dev"]["default"] == "yes" and RECORD["mount_dev"]["stack_sets"] == "minimal"


def test_the_trainer_image_sets_the_staged_dev_and_checks_it():
    assert apptainer_userns.dev_problems(DOCKERFILE) == []
    line = "RUN sed -i 's/^mount dev = .*/mount dev = minimal/' /etc/apptainer/apptainer.conf"
    assert line in DOCKERFILE
    found = apptainer_userns.dev_problems(DOCKERFILE.replace(line, "RUN true"))
    assert len(found) == 1 and "container_linux.go:" in found[0] and "/dev/fuse" in found[0], found
    yes = DOCKERFILE.replace("mount dev = minimal", "mount dev = yes")
    assert apptainer_userns.dev_problems(yes)  # the default again: the trainer's /dev in every session


def test_a_record_whose_staged_dev_holds_a_gpu_is_a_problem():
    record = json.loads(json.dumps(RECORD))
    record["mount_dev"]["minimal_devices"].append("/dev/nvidia0")
    assert any("/dev/nvidia0" in p for p in apptainer_userns.dev_problems(DOCKERFILE, record))
