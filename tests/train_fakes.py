"""`polarstack train --runtime docker` in-process with the GPU node faked, for the tests that drive make train's launch:
`make up` ran (the run state names engine-direct), the node check and the agent-sandbox probe pass, the smoke gate
passes, the task data is an empty folder. What the trainer container answers stays each test's own `run_compose`."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from polarstack.stack.cluster import load as load_cluster

TRAIN_ARGS = ["train", "--task", "humaneval", "--runtime", "docker", "--without-rehearsal"]


def fake_node_for_train(monkeypatch, tmp_path, *, prepare=None, smoke_report=None) -> None:
    from polarstack.checks import smoke
    from polarstack.reward import tasks
    from polarstack.stack import compose

    report = smoke_report or SimpleNamespace(ok=True, message="42 trainable tokens")
    monkeypatch.setenv("POLARSTACK_RUN_DIR", str(tmp_path / "run"))
    monkeypatch.setattr(compose, "check_node", lambda *a, **kw: None)
    monkeypatch.setattr(
        "polarstack.stack.docker_state.usable", lambda requested, where, **_: {"profile": "engine-direct"}
    )
    monkeypatch.setattr("polarstack.checks.sandbox_probe.check_in_trainer", lambda profile, where: None)
    # and the verifier in Polar's namespace shape (its own tests: tests/unit/checks/test_shape_probe.py)
    monkeypatch.setattr("polarstack.checks.shape_probe.check_docker", lambda profile, where, running=False: None)
    monkeypatch.setattr(smoke, "run_smoke", lambda *a, **kw: report)
    monkeypatch.setattr(tasks, "prepare", prepare or (lambda task, out, **kw: out.mkdir(parents=True, exist_ok=True)))


def rendered_launch_sh(tmp_path, job: str, polar: str | None = None) -> Path:
    """The whole rendered launch.sh, run in tmp_path with fakes: `ray` (status answers, `job submit` runs `job`),
    `polar` servers that answer at once (or run `polar`, given), retention a no-op."""
    from polarstack.paths import load_defaults
    from polarstack.stack import profiles
    from polarstack.train.plan import build_plan

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    fakes = {
        "ray": f'#!/usr/bin/env bash\n[ "$1 $2" = "job submit" ] || exit 0\n{job}\n',
        "polar": f"#!/usr/bin/env bash\n{polar or ''}\ntouch {tmp_path}/healthy\nexec sleep 30\n",
    }
    for name, text in fakes.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    check = tmp_path / "healthcheck"
    check.write_text(f'import os, sys\nsys.exit(0 if os.path.exists("{tmp_path}/healthy") else 1)\n')
    config = load_defaults([f"model.save={tmp_path}/checkpoints"])
    plan = build_plan("humaneval", profiles.load("engine-direct"), run_id="r", config=config, cluster=load_cluster())
    script = tmp_path / "launch.sh"
    script.write_text(
        plan.files["launch.sh"]
        .replace("/run-polarstack/train/r", str(tmp_path))
        .replace("/usr/local/bin/polarstack-healthcheck", str(check))
        .replace("python3 -m polarstack.train.retention", "true")
    )
    return script
