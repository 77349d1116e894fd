"""`polarstack train --runtime docker` in-process with the GPU node faked, for the tests that drive make train's launch:
`make up` ran (the run state names engine-direct), the node check and the agent-sandbox probe pass, the smoke gate
passes, the task data is an empty folder. What the trainer container answers stays each test's own `run_compose`."""

from __future__ import annotations

from types import SimpleNamespace

TRAIN_ARGS = ["train", "--task", "humaneval", "--runtime", "docker", "--without-rehearsal"]


def fake_node_for_train(monkeypatch, tmp_path, *, prepare=None, smoke_report=None) -> None:
    from polarstack.checks import smoke
    from polarstack.reward import tasks
    from polarstack.stack import compose

    report = smoke_report or SimpleNamespace(ok=True, message="42 trainable tokens")
    monkeypatch.setenv("POLARSTACK_RUN_DIR", str(tmp_path / "run"))
    monkeypatch.setattr(compose, "check_node", lambda *a, **kw: None)
    monkeypatch.setattr("polarstack.stack.docker_state.usable", lambda requested: {"profile": "engine-direct"})
    monkeypatch.setattr("polarstack.checks.sandbox_probe.check_in_trainer", lambda profile: None)
    # and the verifier in Polar's namespace shape (its own tests: tests/unit/checks/test_shape_probe.py)
    monkeypatch.setattr("polarstack.checks.shape_probe.check_docker", lambda profile, running=False: None)
    monkeypatch.setattr(smoke, "run_smoke", lambda *a, **kw: report)
    monkeypatch.setattr(tasks, "prepare", prepare or (lambda task, out, **kw: out.mkdir(parents=True, exist_ok=True)))
