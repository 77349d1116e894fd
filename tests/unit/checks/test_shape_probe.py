"""Issue 32 point 3: the reward in the namespace shape of Polar's sessions is found at `make up`, not at step 4.

apptainer v1.4.1 runs Polar's sessions for the trainer's root (no CAP_SYS_ADMIN) in a user namespace mapping only uid 0,
with its own mount namespace; `unshare --user --map-root-user --mount --fork` reproduces it. `make up` (docker, local),
`make preflight` before it brings anything up, and `make train` beside its sandbox probe run the task's test_command
there on HumanEval/0's canonical answer and a wrong one (polarstack.checks.shape_probe), and refuse in seconds (exit 8)
before Compose or any process starts. The verifier is replaced here by a fake bundle that records where it ran and
answers as told (the real one in that shape: tests/sandbox/test_shape_probe_real.py). Docker is the fake node
(tests/fake_node.py) whose Compose runs the probe's script on this host (FAKE_SHAPE_RUN=1), unshare included.
"""

from __future__ import annotations

import json
import os
import shutil
import time

import pytest

import fake_node
from polarstack.checks import sandbox_probe, shape_probe
from polarstack.cli.main import main
from polarstack.errors import ExitCode, StackError
from polarstack.reward.verifier import bundle

pytestmark = [
    pytest.mark.unit,
    pytest.mark.skipif(shutil.which("unshare") is None, reason="needs unshare (util-linux) on this host"),
]

FAKE_VERIFIER = r"""
import json, os, sys
args = sys.argv[1:]
name = args[args.index("--name") + 1]
solution = open(args[args.index("--solution") + 1]).read()
with open(os.environ["FAKE_SHAPE_RECORD"], "a") as record:
    record.write(json.dumps({
        "uid_map": " ".join(open("/proc/self/uid_map").read().split()),
        "userns": os.readlink("/proc/self/ns/user"),
        "mntns": os.readlink("/proc/self/ns/mnt"),
        "uid": os.getuid(),
        "isolation": os.environ.get("POLARSTACK_VERIFIER_ISOLATION"),
        "cwd": os.getcwd(),
        "isolated_mode": sys.flags.isolated,
        "argv": args,
    }) + "\n")
if os.environ.get("FAKE_SHAPE_REFUSE") == "1":
    print(f"FAILED {name} (not verified)")
    print("polarstack-verifier: the verifier's sandbox cannot be set up here (a fake refusal)", file=sys.stderr)
    sys.exit(8)
print(f"PASSED {name}" if "return True" in solution else f"FAILED {name} (failed: wrong)")  # the canonical one
"""


@pytest.fixture
def fake_verifier(tmp_path, monkeypatch):
    """The probe's eval/verifier.py is the fake above; returns the file it records each run in."""
    record = tmp_path / "shape-record.jsonl"
    monkeypatch.setenv("FAKE_SHAPE_RECORD", str(record))
    monkeypatch.delenv("FAKE_SHAPE_REFUSE", raising=False)
    monkeypatch.setattr(bundle, "write", lambda path: path.write_text(FAKE_VERIFIER))
    return record


def runs(record) -> list[dict]:
    return [json.loads(line) for line in record.read_text().splitlines()] if record.exists() else []


def assert_in_polars_shape(found: list[dict]) -> None:
    assert len(found) == len(sandbox_probe.PROBE_CASES), found
    for run in found:
        assert run["uid_map"] == "0 0 1" and run["uid"] == 0, run
        assert run["userns"] != os.readlink("/proc/self/ns/user"), "not in a user namespace of its own"
        assert run["mntns"] != os.readlink("/proc/self/ns/mnt"), "not in a mount namespace of its own"
        assert run["isolated_mode"] == 1 and run["cwd"].endswith("/workspace")  # the test_command, as written
        assert run["argv"][-2:] == ["--name", sandbox_probe.PROBE_NAME]
        assert run["isolation"] == "namespaces"  # configs/stack.env's value reaches the command's environment


@pytest.fixture
def node(tmp_path, monkeypatch):
    log = fake_node.install(tmp_path, monkeypatch)
    monkeypatch.setenv("FAKE_VOLUME", "1")
    monkeypatch.setenv("FAKE_IMAGES", fake_node.IMAGES)
    monkeypatch.setenv("FAKE_SHAPE_RUN", "1")
    return log


def compose_calls(log) -> list[str]:
    return [line for line in log.read_text().splitlines() if line.startswith("compose ")]


def test_make_up_runs_the_verifier_in_polars_namespace_shape_in_the_trainer_image(node, fake_verifier, capsys):
    assert main(["compose", "up", "--profile", "engine-direct"]) == 0
    assert_in_polars_shape(runs(fake_verifier))
    calls = compose_calls(node)
    probe = next(i for i, c in enumerate(calls) if " run --rm --no-deps -T trainer sh -c " in c)
    up = next(i for i, c in enumerate(calls) if " up --detach --wait" in c)
    assert probe < up, calls
    err = capsys.readouterr().err
    assert "namespace shape of Polar's sessions in the trainer image (uid_map 0 0 1): PASSED probe" in err


def test_a_verifier_refusal_in_the_shape_stops_make_up_before_compose_up(node, fake_verifier, monkeypatch, capsys):
    monkeypatch.setenv("FAKE_SHAPE_REFUSE", "1")
    started = time.monotonic()
    assert main(["compose", "up", "--profile", "engine-direct"]) == ExitCode.ENVIRONMENT
    assert time.monotonic() - started < 30  # seconds, not an engine's start
    assert_in_polars_shape(runs(fake_verifier))
    assert not any(" up " in f" {c} " for c in compose_calls(node) if " run --rm" not in c), compose_calls(node)
    err = capsys.readouterr().err.strip().splitlines()
    sentence = next(line for line in err if "refusing before anything starts" in line)
    assert "a fake refusal" in sentence and "uid_map `0 0 1`" in sentence
    assert "POLARSTACK_VERIFIER_ISOLATION=none in configs/stack.env or the environment" in sentence
    assert not (fake_verifier.parent / "run" / "train").exists() or not any(
        (fake_verifier.parent / "run" / "train").iterdir()
    ), "the probe's sessions are removed"


def test_the_cpu_stack_runs_the_same_probe_before_compose_up(node, fake_verifier, monkeypatch, capsys):
    """DEVICE=cpu: the same `compose run` in the CPU trainer image (its bases and tiny model are prepared first)."""
    from polarstack.stack import assets, device

    monkeypatch.setenv("POLARSTACK_DEVICE", "cpu")
    # the CLI writes the CPU stack's defaults into the environment (device.apply_cpu_defaults): undone after the test
    for key in [*device.CPU_PORTS, "MODEL_PATH", "ENGINE_START_PERIOD", "HEALTHCHECK_INTERVAL", "MODEL_DIR"]:
        monkeypatch.setenv(key, "")
        monkeypatch.delenv(key)
    monkeypatch.setenv("FAKE_SHAPE_REFUSE", "1")
    monkeypatch.setattr(device, "prepare", lambda progress: None)
    monkeypatch.setattr(assets, "check_before_up", lambda profile, **_: None)
    assert main(["compose", "up", "--profile", "engine-direct"]) == ExitCode.ENVIRONMENT
    assert_in_polars_shape(runs(fake_verifier))
    calls = compose_calls(node)
    assert any(" run --rm --no-deps -T trainer sh -c " in c and "compose.cpu.yaml" in c for c in calls), calls
    assert not any("up --detach" in c for c in calls)


def test_make_preflight_refuses_before_the_rehearsal_brings_anything_up(node, fake_verifier, monkeypatch, capsys):
    from polarstack.train import rehearsal_run

    monkeypatch.setenv("FAKE_SHAPE_REFUSE", "1")
    monkeypatch.setattr(rehearsal_run, "run", lambda *a, **k: pytest.fail("the rehearsal started"))
    assert main(["preflight", "--profile", "engine-direct"]) == ExitCode.ENVIRONMENT
    assert_in_polars_shape(runs(fake_verifier))
    assert not any("up --detach" in c for c in compose_calls(node))
    assert "refusing before anything starts" in capsys.readouterr().err


def test_make_train_runs_it_in_the_running_trainer_before_the_sandbox_probe(node, fake_verifier, monkeypatch):
    """Where `make train` runs its sandbox probe: in the running trainer (`compose exec`), first."""
    from polarstack.stack import profiles
    from polarstack.stack.resolved import read_now
    from polarstack.train import launch

    monkeypatch.setenv("FAKE_SHAPE_REFUSE", "1")
    monkeypatch.setattr(
        sandbox_probe, "check_in_trainer", lambda profile, where: pytest.fail("sandbox probe ran first")
    )
    plan = type("Plan", (), {"run_id": "shape-test", "memory": None})()
    with pytest.raises(StackError) as refused:
        launch.launch_in_trainer(None, plan, profiles.load("engine-direct"), read_now())
    assert refused.value.code == ExitCode.ENVIRONMENT and "refusing before anything starts" in refused.value.message
    assert_in_polars_shape(runs(fake_verifier))
    assert " exec -T trainer sh -c command -v unshare" in node.read_text()  # the script begins so


def test_make_up_local_runs_it_on_this_host_and_a_refusal_starts_nothing(tmp_path, fake_verifier, monkeypatch, capsys):
    from polarstack.stack import local

    monkeypatch.setenv("POLARSTACK_RUN_DIR", str(tmp_path / "run"))
    monkeypatch.delenv("POLARSTACK_VERIFIER_ISOLATION", raising=False)
    monkeypatch.setenv("FAKE_SHAPE_REFUSE", "1")
    monkeypatch.setattr(local, "_fresh_state", lambda *a, **k: pytest.fail("the local topology started"))
    started = time.monotonic()
    assert main(["up", "--profile", "engine-direct"]) == ExitCode.ENVIRONMENT
    assert time.monotonic() - started < 30
    assert_in_polars_shape(runs(fake_verifier))
    assert "in the namespace shape of Polar's sessions on this host" in capsys.readouterr().err
    assert local.read_state(tmp_path / "run") is None
    assert not (tmp_path / "run" / "shape-probe").exists()  # the probe's sessions are removed


def test_the_opt_out_reaches_the_probe_and_is_named(tmp_path, fake_verifier, monkeypatch, capsys):
    monkeypatch.setenv("POLARSTACK_RUN_DIR", str(tmp_path / "run"))
    monkeypatch.setenv("POLARSTACK_VERIFIER_ISOLATION", "none")
    shape_probe.check_local()
    assert {r["isolation"] for r in runs(fake_verifier)} == {"none"}
    assert "POLARSTACK_VERIFIER_ISOLATION=none is active" in capsys.readouterr().err


@pytest.mark.parametrize(
    "stdout, words",
    [
        ("shape-failed: unshare: unshare failed: Operation not permitted\n", "cannot reproduce the namespace shape"),
        ("uid-map: 0 0 4294967295\nverifier-good: PASSED probe\nverifier-bad: FAILED probe (x)\n", "not '0 0 1'"),
        ("uid-map: 0 0 1\nverifier-good: PASSED probe\nverifier-bad: PASSED probe\n", "did not print `FAILED probe`"),
        ("uid-map: 0 0 1\nverifier-good: FAILED probe (failed: x)\nverifier-bad: FAILED probe (x)\n", "canonical"),
    ],
)
def test_every_other_outcome_refuses_with_one_sentence(stdout, words):
    with pytest.raises(StackError) as refused:
        shape_probe.judge("on this host", stdout, {"POLARSTACK_VERIFIER_ISOLATION": "namespaces"})
    assert refused.value.code == ExitCode.ENVIRONMENT and words in refused.value.message
    assert "\n" not in refused.value.message
