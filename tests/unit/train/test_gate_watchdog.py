"""Pins the in-job gate's stops that need no engine (scripts/polarstack/train/gate.py):

- the watchdog measures progress, not the length of Polar's blocking rollout call: against a fake bridge shaped
  like the pinned Polar (src/slime_bridge/rollout.py at POLAR_COMMIT: a background worker thread that submits
  groups (`_group_counter`), hands trainable ones to the output queue (`polar/completed_groups`), drops zero-token
  ones inside and never returns them (`polar/dropped_groups`, `polar/dropped_zero_trainable_groups`), all in
  `_metrics` under `_state_lock`, exported by `snapshot_metrics` only with the `_since_worker_start` / `_delta`
  suffixes; the call blocks until a full batch exists) a slow-but-progressing rollout longer than
  watchdog_seconds is not stopped, a stalled one is, and one that drops everything is;
- all-zero rewards: a stop naming the verifier's refusal when the samples carry one, a loud warning otherwise;
- every stop path reaches `polarstack train` as exit 11 (GATE) with the gate's sentence, through the abort file
  whose path the rendered polar_config.yaml carries (the fake compose runs the gate in-process on that config).
The fake bridge is written here, not copied from Polar: only the names the gate reads match."""

from __future__ import annotations

import queue
import subprocess
import sys
import threading
import time
import types
from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest

from polar_grading import evaluation, sample_metadata
from polarstack.errors import ExitCode
from polarstack.reward.verifier import verdict
from polarstack.train import gate
from train_fakes import fake_node_for_train

pytestmark = pytest.mark.unit


@dataclass
class Sample:  # the fields of slime.utils.types.Sample the gate reads
    tokens: list = field(default_factory=list)
    response_length: int = 0
    loss_mask: list | None = None
    reward: object = None
    remove_sample: bool = False
    metadata: dict = field(default_factory=dict)


def group(trainable: bool, size: int = 2, reward: object = None, metadata: dict | None = None):
    if trainable:
        return [
            Sample(tokens=[1, 2, 3], response_length=2, loss_mask=[1, 1], reward=reward, metadata=dict(metadata or {}))
            for _ in range(size)
        ]
    return [
        Sample(tokens=[1], response_length=1, loss_mask=[0], remove_sample=True, reward=reward) for _ in range(size)
    ]


class FakeWorker:
    """AsyncPolarRolloutWorker as the gate sees it: a thread working through `script` ((seconds, group) pairs:
    submit, take that long, then complete or drop), counters in `_metrics` under `_state_lock`."""

    def __init__(self, script):
        self._metrics, self._state_lock, self._last_reported = {}, threading.RLock(), {}
        self._group_counter, self.script, self.output = 0, script, queue.Queue()
        self.running = True
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _inc_metric(self, key, value=1.0):
        with self._state_lock:
            self._metrics[key] = self._metrics.get(key, 0.0) + value

    @staticmethod
    def _has_trainable_tokens(samples):  # rollout.py `_has_trainable_tokens`, restated
        return any(not s.remove_sample and any(int(m) != 0 for m in (s.loss_mask or [])) for s in samples)

    def _run(self):
        while self.running:
            if not self.script:
                time.sleep(0.01)
                continue
            seconds, samples = self.script.pop(0)
            with self._state_lock:
                self._group_counter += 1  # submitted
            deadline = time.monotonic() + seconds
            while self.running and time.monotonic() < deadline:
                time.sleep(0.01)
            if not self.running:
                return
            if self._has_trainable_tokens(samples):
                self.output.put(samples)
                self._inc_metric("polar/completed_groups")
            else:  # _submit_and_collect: dropped inside, counted, never returned
                self._inc_metric("polar/dropped_groups")
                self._inc_metric("polar/dropped_zero_trainable_groups")
                self._inc_metric("polar/dropped_sessions", len(samples))

    def snapshot_metrics(self):
        with self._state_lock:
            out = {}
            for key, value in self._metrics.items():
                out[f"{key}_since_worker_start"] = value
                out[f"{key}_delta"] = value - self._last_reported.get(key, 0.0)
                self._last_reported[key] = value
            return out


def make_bridge(name="fake_polar_bridge"):
    module = types.ModuleType(name)
    module._global_async_worker = None  # created by the first call, like get_global_async_worker
    module.script, module.killed = [], threading.Event()

    def generate_rollout_polar_async(args, rollout_id, data_source, evaluation=False):
        if module._global_async_worker is None:
            module._global_async_worker = FakeWorker(module.script)
        worker, data = module._global_async_worker, []
        while len(data) < args.rollout_batch_size:  # blocks until a full batch, like the pinned Polar
            if module.killed.is_set():
                raise RuntimeError("rollout actor killed")
            try:
                data.append(worker.output.get(timeout=0.01))
            except queue.Empty:
                pass
        return SimpleNamespace(samples=data, metrics=worker.snapshot_metrics())

    module.generate_rollout_polar_async = generate_rollout_polar_async
    return module


@pytest.fixture
def fake_bridge(monkeypatch):
    module = make_bridge()
    monkeypatch.setitem(sys.modules, "fake_polar_bridge", module)
    stops = []

    def stop(message, args):
        stops.append(message)
        module.killed.set()  # what os._exit does to the blocked call

    monkeypatch.setattr(gate, "stop_job", stop)
    gate.reset()
    gate.gate_state.checked = True  # the first-rollout smoke is pinned in tests/integration/test_gate.py
    module.stops = stops
    yield module
    if module._global_async_worker is not None:
        module._global_async_worker.running = False
    gate.reset()


def bridge_args(**extra):
    values = {
        "polar_gate_delegate": "fake_polar_bridge.generate_rollout_polar_async",
        "polar_gate_max_zero_token_groups": 3,
        "polar_gate_watchdog_seconds": 30,
        "rollout_batch_size": 2,
    }
    return SimpleNamespace(**{**values, **extra})


def test_a_slow_rollout_that_keeps_finishing_groups_is_not_stopped(fake_bridge):
    """Each group takes half the watchdog's time; the whole call takes about twice it."""
    fake_bridge.script += [(0.5, group(True)) for _ in range(4)]
    started = time.monotonic()
    out = gate.generate_rollout_gated(bridge_args(polar_gate_watchdog_seconds=1.0, rollout_batch_size=4), 0, None)
    assert time.monotonic() - started > 1.0
    assert len(out.samples) == 4 and fake_bridge.stops == []


def test_a_rollout_that_stalls_after_progress_is_stopped(fake_bridge):
    fake_bridge.script += [(0.1, group(True))]  # one group, then the worker does nothing more
    with pytest.raises(
        gate.GateAbort,
        match=r"rollout 0 made no progress for 0.5 s: .*\(1 groups with trainable "
        r"tokens and 0 dropped",
    ):
        gate.generate_rollout_gated(bridge_args(polar_gate_watchdog_seconds=0.5), 0, None)
    assert len(fake_bridge.stops) == 1


def test_a_rollout_with_no_worker_activity_at_all_is_stopped(fake_bridge):
    with pytest.raises(gate.GateAbort, match="made no progress for 0.5 s"):
        gate.generate_rollout_gated(bridge_args(polar_gate_watchdog_seconds=0.5), 0, None)


def test_the_watchdogs_stop_names_polars_logs_in_the_run_directory(fake_bridge, tmp_path):
    """Polar's server logs are launch.sh's files in .run/train/<run>/ (beside the abort file), not the trainer's
    container log, which shows only the Ray head."""
    abort = tmp_path / "humaneval-engine-direct-1" / "gate-abort.txt"
    abort.parent.mkdir()
    args = bridge_args(polar_gate_watchdog_seconds=0.5, polar_gate_abort_file=str(abort))
    with pytest.raises(gate.GateAbort):
        gate.generate_rollout_gated(args, 0, None)
    sentence = abort.read_text().strip()
    assert sentence.endswith(
        "see .run/train/humaneval-engine-direct-1/polar-rollout.log and polar-gateway.log for the diagnosis."
    )
    assert "SERVICE=trainer" not in sentence


def test_a_rollout_whose_groups_polar_drops_inside_is_stopped(fake_bridge):
    fake_bridge.script += [(0.0, group(False)) for _ in range(5)]
    started = time.monotonic()
    with pytest.raises(
        gate.GateAbort,
        match=r"dropped 5 groups for zero trainable tokens during rollout 0 and no "
        r"group with trainable tokens arrived \(limit 3\)",
    ):
        gate.generate_rollout_gated(bridge_args(), 0, None)
    assert time.monotonic() - started < 10 and len(fake_bridge.stops) == 1
    assert fake_bridge.stops[0].startswith("polarstack gate: stopping the job")


def test_drops_keep_the_worker_busy_but_still_stop_the_job(fake_bridge):
    """Slow drops are progress for the timer, so only the drop count can stop this one."""
    fake_bridge.script += [(0.3, group(False)) for _ in range(10)]
    with pytest.raises(gate.GateAbort, match="no group with trainable tokens arrived"):
        gate.generate_rollout_gated(bridge_args(polar_gate_watchdog_seconds=1.0), 0, None)


def test_zero_token_drops_among_trainable_groups_do_not_fire_the_watchdog(fake_bridge):
    fake_bridge.script += [(0.0, group(True))] + [(0.0, group(False)) for _ in range(4)] + [(0.0, group(True))]
    out = gate.generate_rollout_gated(bridge_args(polar_gate_watchdog_seconds=2.0), 0, None)
    assert len(out.samples) == 2 and fake_bridge.stops == []
    assert out.metrics["polar/dropped_zero_trainable_groups_delta"] == 4.0


def test_trainable_rollouts_keep_the_watchdog_quiet(fake_bridge):
    fake_bridge.script += [(0.0, g) for g in (group(True), group(False), group(True), group(True), group(True))]
    args = bridge_args()
    first = gate.generate_rollout_gated(args, 0, None)
    assert first.metrics["polar/dropped_zero_trainable_groups_delta"] == 1.0
    assert first.metrics["polar/completed_groups_since_worker_start"] >= 2.0
    assert gate.generate_rollout_gated(args, 1, None).metrics["polar/dropped_zero_trainable_groups_delta"] == 0.0
    assert fake_bridge.stops == []


def test_default_stop_writes_the_sentence_and_exits_with_the_gate_code(tmp_path, monkeypatch):
    exits = []
    monkeypatch.setattr(gate.os, "_exit", exits.append)
    abort = tmp_path / "gate-abort.txt"
    gate.stop_job("polarstack gate: stopping the job, reason", SimpleNamespace(polar_gate_abort_file=str(abort)))
    assert exits == [11] and abort.read_text().strip() == "polarstack gate: stopping the job, reason"


# --- rewards ------------------------------------------------------------------------------------------------


@pytest.fixture
def returning(monkeypatch):
    """A delegate returning what the test queues (no watchdog activity needed)."""
    module = types.ModuleType("standin_reward_rollout")
    module.queue = []
    module.generate = lambda args, rollout_id, data_source, evaluation=False: module.queue.pop(0)
    monkeypatch.setitem(sys.modules, "standin_reward_rollout", module)
    gate.reset()
    gate.gate_state.checked = True
    yield module
    gate.reset()


def reward_args(tmp_path, k=2):
    return SimpleNamespace(
        polar_gate_delegate="standin_reward_rollout.generate",
        polar_gate_watchdog_seconds=30,
        polar_gate_zero_reward_rollouts=k,
        polar_gate_abort_file=str(tmp_path / "abort.txt"),
    )


REFUSED = {"verifier_error": "the sandbox cannot be set up: unshare(CLONE_NEWUSER) failed"}
# What Polar's test_on_output evaluator and gateway hand on for the verifier's runs (tests/polar_grading.py, built from
# configs/upstream/polar-grading.json): its refusal (the refusal line, the reason on stderr, exit 8), an ordinary
# FAILED (exit 1), and each of the refusal's two signals alone.
EXPECTED = {"humaneval_verifier": "PASSED"}
REFUSAL_LINE = verdict.refusal_line("humaneval_verifier") + "\n"
REFUSAL_NOTE = verdict.refusal_note("the sandbox cannot be set up: unshare(CLONE_NEWUSER) failed") + "\n"
ORDINARY = verdict.failed_line("humaneval_verifier", "failed", "1 check(s) failed") + "\n"
EVALUATED_REFUSAL = sample_metadata(evaluation(REFUSAL_LINE, REFUSAL_NOTE, 8, EXPECTED))
EVALUATED_FAILURE = sample_metadata(evaluation(ORDINARY, verdict.limits_note("the watchdog") + "\n", 1, EXPECTED))


@pytest.mark.parametrize(
    "metadata, reason",
    [
        (REFUSED, "unshare"),
        (EVALUATED_REFUSAL, r"FAILED humaneval_verifier \(not verified\)"),
        (sample_metadata(evaluation("", REFUSAL_NOTE, 8, EXPECTED)), "exited 8"),
        (sample_metadata(evaluation(REFUSAL_LINE, "", 1, EXPECTED)), r"FAILED humaneval_verifier \(not verified\)"),
        ({"polar": {"trajectory_metadata": {"evaluation": {"verifier_exit_code": 8}}}}, "exited 8"),
    ],
    ids=["reward_func", "test_on_output_refusal", "report_exit_code", "report_parsed_tests", "harbor_exit_code"],
)
def test_all_zero_rewards_with_a_verifier_refusal_stop_the_job(returning, tmp_path, metadata, reason):
    args = reward_args(tmp_path, k=2)
    returning.queue += [[group(True, reward={"score": 0.0}, metadata=metadata)] for _ in range(2)]
    gate.generate_rollout_gated(args, 0, None)  # one all-zero rollout is not yet K
    with pytest.raises(
        gate.GateAbort,
        match=f"all 4 samples of the last 2 rollouts .* have reward 0 and 4 of them were not verified: .*{reason}",
    ):
        gate.generate_rollout_gated(args, 1, None)
    assert (tmp_path / "abort.txt").read_text().startswith("polarstack gate: stopping the job, all 4 samples")


def test_all_zero_rewards_without_a_reason_only_warn(returning, tmp_path, capsys):
    args = reward_args(tmp_path, k=2)
    returning.queue += [[group(True, reward=0.0, metadata={"verifier_reason": "wrong_answer"})] for _ in range(3)]
    for rollout in range(3):
        gate.generate_rollout_gated(args, rollout, None)
    err = capsys.readouterr().err
    assert err.count("WARNING all 4 samples of the last 2 rollouts") == 2 and "(0 carry a verifier refusal)" in err
    assert not (tmp_path / "abort.txt").exists()


def test_ordinary_failures_warn_and_then_refusals_stop_the_job(returning, tmp_path, capsys):
    # K rollouts of the verifier's ordinary FAILED only warn; K of its refusal, in the same shape, stop the job.
    args = reward_args(tmp_path, k=3)
    returning.queue += [[group(True, size=4, reward={"score": 0.0}, metadata=EVALUATED_FAILURE)] for _ in range(3)]
    returning.queue += [[group(True, size=4, reward={"score": 0.0}, metadata=EVALUATED_REFUSAL)] for _ in range(3)]
    for rollout in range(3):
        gate.generate_rollout_gated(args, rollout, None)
    err = capsys.readouterr().err
    assert "WARNING all 12 samples of the last 3 rollouts" in err and "(0 carry a verifier refusal)" in err
    assert not (tmp_path / "abort.txt").exists()
    gate.generate_rollout_gated(args, 3, None)  # 4 refused of 12: under half, a warning
    assert "(4 carry a verifier refusal)" in capsys.readouterr().err and not (tmp_path / "abort.txt").exists()
    with pytest.raises(gate.GateAbort, match=r"8 of them were not verified: FAILED humaneval_verifier \(not verif"):
        gate.generate_rollout_gated(args, 4, None)  # 8 of 12: the stop
    assert (tmp_path / "abort.txt").read_text().startswith("polarstack gate: stopping the job, all 12 samples")


def test_a_single_nonzero_reward_resets_the_count(returning, tmp_path, capsys):
    args = reward_args(tmp_path, k=2)
    solved = group(True, reward={"score": 0.0}, metadata=REFUSED)
    solved[0].reward = {"score": 1.0}
    returning.queue += [
        [group(True, reward={"score": 0.0}, metadata=REFUSED)],
        [solved],
        [group(True, reward={"score": 0.0}, metadata=REFUSED)],
    ]
    for rollout in range(3):
        gate.generate_rollout_gated(args, rollout, None)
    assert "WARNING" not in capsys.readouterr().err


@pytest.mark.parametrize(
    "reward, expected",
    [
        ({"score": 1.0}, 1.0),
        ({"other": 0.5}, 0.5),
        ({"score": "1"}, 1.0),
        (0.25, 0.25),
        ("1", 0.0),
        (True, 0.0),
        (float("nan"), 0.0),
        (None, 0.0),
    ],
)
def test_rewards_are_read_as_polars_reward_func_reads_them(reward, expected):
    assert gate.sample_reward(Sample(reward=reward)) == expected


# --- every stop reaches `polarstack train` as GATE ----------------------------------------------------------


def _run_the_job_in_process(tmp_path, monkeypatch, stop_path):
    """A fake `compose exec trainer bash launch.sh`: slime's rollout loop over the gate, with the args slime
    would build from the rendered polar_config.yaml, and slime_bridge.rollout replaced by a fake bridge."""
    import yaml

    from polarstack.checks import smoke
    from polarstack.paths import TRAINER_RUN_DIR

    bridge = make_bridge("slime_bridge.rollout")
    package = types.ModuleType("slime_bridge")
    package.rollout = bridge
    monkeypatch.setitem(sys.modules, "slime_bridge", package)
    monkeypatch.setitem(sys.modules, "slime_bridge.rollout", bridge)

    def job(profile, args, **kw):
        script = args[-1]
        if not script.endswith("/launch.sh"):  # the pre-launch look inside the trainer (assets): all present
            return subprocess.CompletedProcess(args, 0, "", "")
        run_id = script.rsplit("/", 2)[-2]
        host_dir = tmp_path / "run" / "train" / run_id
        config = yaml.safe_load((host_dir / "polar_config.yaml").read_text())
        assert config["polar_gate_abort_file"] == f"{TRAINER_RUN_DIR}/{run_id}/gate-abort.txt"
        config["polar_gate_abort_file"] = str(host_dir / "gate-abort.txt")  # the run dir is shared with the host
        config["rollout_batch_size"] = 2
        if stop_path == "smoke":
            monkeypatch.setattr(
                smoke,
                "run_smoke",
                lambda *a, **k: SimpleNamespace(
                    ok=False, code=ExitCode.TOKENS_MISSING, message="the router drops return_meta_info"
                ),
            )
        elif stop_path == "zero_tokens":
            bridge.generate_rollout_polar_async = lambda *a, **k: [group(False)]
        elif stop_path == "watchdog":
            config["polar_gate_watchdog_seconds"] = 0.5
            monkeypatch.setattr(gate.os, "_exit", lambda code: bridge.killed.set())  # the process would end
        elif stop_path == "zero_advantage":  # issue 19: every group rewarded alike for K=10 rollouts
            bridge.generate_rollout_polar_async = lambda *a, **k: [group(True, reward={"score": 1.0})]
        elif stop_path == "refused_rewards":
            bridge.generate_rollout_polar_async = lambda *a, **k: [group(True, reward={"score": 0.0}, metadata=REFUSED)]
        gate.reset()
        try:
            for rollout in range(10):
                gate.generate_rollout_gated(SimpleNamespace(**config), rollout, None)
        except gate.GateAbort:
            return subprocess.CompletedProcess(args, 1)  # slime's job fails on the raised stop
        finally:
            if bridge._global_async_worker is not None:
                bridge._global_async_worker.running = False
        return subprocess.CompletedProcess(args, 0)

    return job


@pytest.mark.parametrize(
    "stop_path, sentence",
    [
        ("smoke", "refusing to train, the inference path fails the smoke: the router drops return_meta_info"),
        ("zero_tokens", "3 consecutive rollout groups had zero trainable tokens"),
        ("watchdog", "rollout 0 made no progress for 0.5 s"),
        ("refused_rewards", "have reward 0 and 6 of them were not verified"),
        ("zero_advantage", "groups of the last 10 rollouts (up to rollout 9) has zero advantage"),
    ],
)
def test_every_gate_stop_reaches_train_as_the_gate_code(tmp_path, monkeypatch, capsys, stop_path, sentence):
    from polarstack.cli.main import main
    from polarstack.stack import compose

    fake_node_for_train(monkeypatch, tmp_path)
    monkeypatch.setattr(compose, "run_compose", _run_the_job_in_process(tmp_path, monkeypatch, stop_path))
    try:
        code = main(["train", "--task", "humaneval", "--runtime", "docker", "--without-rehearsal"])
    finally:
        gate.reset()
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]
    assert code == 11 and "Traceback" not in err, err
    assert sentence in last and "polarstack gate:" in last


def test_a_stale_abort_file_does_not_turn_a_job_failure_into_a_gate_stop(tmp_path, monkeypatch, capsys):
    from polarstack.cli.main import main
    from polarstack.stack import compose

    def prepare(task, out, **kw):
        out.mkdir(parents=True, exist_ok=True)
        (out.parent / "gate-abort.txt").write_text("polarstack gate: from an earlier attempt\n")

    fake_node_for_train(monkeypatch, tmp_path, prepare=prepare)
    monkeypatch.setattr(
        compose,
        "run_compose",
        lambda profile, args, **kw: subprocess.CompletedProcess(
            args, 1 if args[-1].endswith("/launch.sh") else 0, "", ""
        ),
    )  # the job fails; the pre-launch look passes
    assert main(["train", "--task", "humaneval", "--runtime", "docker", "--without-rehearsal"]) == 8
    assert "earlier attempt" not in capsys.readouterr().err
