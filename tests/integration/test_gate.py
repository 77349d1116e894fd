"""Pins the in-job gate (slime's --rollout-function-path polarstack.gate.generate_rollout_gated) with stand-ins
shaped like slime's Sample and Polar's rollout function (slime.md: a synchronous fn(args, rollout_id,
data_source, evaluation=False) returning samples grouped per prompt, optionally with metrics): it checks the
path at the first rollout, aborts there through a router that drops Polar's fields, and aborts after K
consecutive zero-token groups, counting the groups Polar's bridge already dropped (the `_delta` /
`_since_worker_start` keys the pinned Polar exports). A fake bridge reproducing the pinned Polar (rollout.py at
POLAR_COMMIT: zero-token groups dropped inside the worker and never returned, the call blocking until a full batch
of accepted groups exists, only the suffixed counters exported) pins that the watchdog stops such a job.
The fake is written here, not copied: only the names the gate reads match."""

import sys
import threading
import time
import types
from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest

from polarstack import gate
from polarstack.pins import pin

pytestmark = pytest.mark.router
STOCK = f"{pin('ROUTER_STOCK_PACKAGE')}=={pin('ROUTER_STOCK_VERSION')}"


@dataclass
class Sample:  # the fields of slime.utils.types.Sample the gate reads
    tokens: list = field(default_factory=list)
    response_length: int = 0
    loss_mask: list | None = None
    reward: float | None = None
    remove_sample: bool = False


def group(trainable: bool, size: int = 2):
    if trainable:
        return [Sample(tokens=[1, 2, 3], response_length=2, loss_mask=[1, 1]) for _ in range(size)]
    return [Sample(tokens=[1], response_length=1, loss_mask=[0], remove_sample=True) for _ in range(size)]


@pytest.fixture
def delegate(monkeypatch):
    """A module `standin_polar_rollout` whose function returns what the test queues."""
    module = types.ModuleType("standin_polar_rollout")
    module.queue = []
    module.calls = []

    def generate(args, rollout_id, data_source, evaluation=False):
        module.calls.append((rollout_id, evaluation))
        return module.queue.pop(0)

    module.generate = generate
    monkeypatch.setitem(sys.modules, "standin_polar_rollout", module)
    gate.reset()
    yield module
    gate.reset()


def args_for(url, limit=3):
    return SimpleNamespace(polar_gate_base_url=url, polar_gate_route="base", polar_gate_max_zero_token_groups=limit,
                           polar_gate_delegate="standin_polar_rollout.generate", polar_served_model_name=None)


def test_first_rollout_passes_on_a_good_path_and_delegates(engine, delegate):
    out = [group(True), group(True)]
    delegate.queue.append(out)
    assert gate.generate_rollout_gated(args_for(engine.url), 0, data_source=None) is out
    assert delegate.calls == [(0, False)]


def test_first_rollout_aborts_through_a_router_that_drops_the_fields(engine, router_factory, delegate):
    router = router_factory(STOCK, [engine.url])
    with pytest.raises(gate.GateAbort, match="return_prompt_token_ids and return_meta_info"):
        gate.generate_rollout_gated(args_for(router.url), 0, data_source=None)
    assert delegate.calls == []  # nothing ran before the abort


def test_aborts_after_k_consecutive_zero_groups(engine, delegate):
    args = args_for(engine.url, limit=3)
    delegate.queue += [[group(True), group(False)], [group(False)], [group(False), group(False)]]
    gate.generate_rollout_gated(args, 0, None)  # one zero group after the last trainable one
    gate.generate_rollout_gated(args, 1, None)  # two
    with pytest.raises(gate.GateAbort, match="4 consecutive rollout groups had zero trainable tokens"):
        gate.generate_rollout_gated(args, 2, None)


def test_a_trainable_group_resets_the_count(engine, delegate):
    args = args_for(engine.url, limit=2)
    delegate.queue += [[group(False)], [group(True)], [group(False)]]
    for rollout in range(3):
        gate.generate_rollout_gated(args, rollout, None)


def test_groups_dropped_by_polars_bridge_count(engine, delegate):
    """Polar drops zero-token groups itself and reports polar/dropped_zero_trainable_groups."""
    args = args_for(engine.url, limit=3)
    delegate.queue.append(SimpleNamespace(samples=[], metrics={gate.DELTA_METRIC: 3.0}))
    with pytest.raises(gate.GateAbort, match="3 dropped by Polar's bridge"):
        gate.generate_rollout_gated(args, 0, None)


def test_evaluation_rollouts_are_not_gated(delegate):
    out = [group(False)]
    delegate.queue.append(out)
    assert gate.generate_rollout_gated(args_for("http://127.0.0.1:9"), 0, None, evaluation=True) is out


# --- the watchdog against a fake bridge shaped like the pinned Polar -----------------------------------------


class FakeWorker:
    """AsyncPolarRolloutWorker's counters: `_metrics` under `_state_lock`, exported by snapshot_metrics only with
    the `_since_worker_start` / `_delta` suffixes."""

    def __init__(self):
        self._metrics, self._state_lock, self._reported = {}, threading.Lock(), {}
        self.stopped = threading.Event()

    def _inc_metric(self, key, value=1.0):
        with self._state_lock:
            self._metrics[key] = self._metrics.get(key, 0.0) + value

    def snapshot_metrics(self):
        with self._state_lock:
            out = {}
            for key, value in self._metrics.items():
                out[f"{key}_since_worker_start"] = value
                out[f"{key}_delta"] = value - self._reported.get(key, 0.0)
                self._reported[key] = value
            return out


@pytest.fixture
def fake_bridge(monkeypatch):
    module = types.ModuleType("fake_polar_bridge")
    module._global_async_worker = FakeWorker()
    module.produced = []  # groups the background sessions finish, in order

    def generate_rollout_polar_async(args, rollout_id, data_source, evaluation=False):
        worker, data = module._global_async_worker, []
        while len(data) < args.rollout_batch_size:  # blocks until a full batch, like the pinned Polar
            if worker.stopped.is_set():
                raise RuntimeError("rollout actor killed")
            if not module.produced:
                time.sleep(0.01)
                continue
            group = module.produced.pop(0)
            if gate.trainable_tokens(group):
                data.append(group)
            else:  # _submit_and_collect: dropped inside, counted, never returned
                worker._inc_metric("polar/dropped_groups")
                worker._inc_metric("polar/dropped_zero_trainable_groups")
        return SimpleNamespace(samples=data, metrics=worker.snapshot_metrics())

    module.generate_rollout_polar_async = generate_rollout_polar_async
    monkeypatch.setitem(sys.modules, "fake_polar_bridge", module)
    stops = []

    def stop(message, args):
        stops.append(message)
        module._global_async_worker.stopped.set()  # what os._exit does to the blocked call

    monkeypatch.setattr(gate, "stop_job", stop)
    gate.reset()
    gate._state.checked = True  # the first-rollout smoke is pinned above
    module.stops = stops
    yield module
    module._global_async_worker.stopped.set()
    gate.reset()


def bridge_args(**extra):
    values = {"polar_gate_delegate": "fake_polar_bridge.generate_rollout_polar_async",
              "polar_gate_max_zero_token_groups": 3, "polar_gate_watchdog_seconds": 30, "rollout_batch_size": 2}
    return SimpleNamespace(**{**values, **extra})


def test_watchdog_stops_a_job_whose_groups_polar_drops_inside(fake_bridge):
    fake_bridge.produced += [group(False) for _ in range(5)]
    started = time.monotonic()
    with pytest.raises(gate.GateAbort, match=r"dropped 5 groups for zero trainable tokens during rollout 0 and returned none"):
        gate.generate_rollout_gated(bridge_args(), 0, None)
    assert time.monotonic() - started < 10 and len(fake_bridge.stops) == 1
    assert fake_bridge.stops[0].startswith("polarstack gate: stopping the job")


def test_watchdog_stops_a_job_that_returns_nothing_in_time(fake_bridge):
    with pytest.raises(gate.GateAbort, match="no group with trainable tokens came back within 0.5 s"):
        gate.generate_rollout_gated(bridge_args(polar_gate_watchdog_seconds=0.5), 0, None)


def test_trainable_rollouts_keep_the_watchdog_quiet(fake_bridge):
    fake_bridge.produced += [group(True), group(False), group(True), group(True), group(True)]
    args = bridge_args()
    first = gate.generate_rollout_gated(args, 0, None)
    assert first.metrics == {"polar/dropped_groups_since_worker_start": 1.0, "polar/dropped_groups_delta": 1.0,
                             "polar/dropped_zero_trainable_groups_since_worker_start": 1.0,
                             "polar/dropped_zero_trainable_groups_delta": 1.0}
    assert gate.generate_rollout_gated(args, 1, None).metrics["polar/dropped_zero_trainable_groups_delta"] == 0.0
    assert fake_bridge.stops == []


def test_default_stop_writes_the_sentence_and_exits_with_the_gate_code(tmp_path, monkeypatch):
    exits = []
    monkeypatch.setattr(gate.os, "_exit", exits.append)
    abort = tmp_path / "gate-abort.txt"
    gate.stop_job("polarstack gate: stopping the job, reason", SimpleNamespace(polar_gate_abort_file=str(abort)))
    assert exits == [11] and abort.read_text().strip() == "polarstack gate: stopping the job, reason"


@pytest.mark.unit
def test_the_rendered_polar_config_carries_the_watchdog_settings():
    import yaml

    from polarstack import profiles
    from polarstack.train import build_plan

    plan = build_plan("humaneval", profiles.load("stock-router"), run_id="r1")
    config = yaml.safe_load(plan.files["polar_config.yaml"])
    assert config["polar_gate_watchdog_seconds"] == 3600 and config["polar_gate_allow_retokenized"] is False
    assert config["polar_gate_abort_file"].endswith("/r1/gate-abort.txt")


@pytest.mark.unit
def test_train_reports_the_watchdogs_sentence_with_the_gate_code(tmp_path, monkeypatch, capsys):
    """The job's process dies (os._exit in the watchdog); `polarstack train` finds gate-abort.txt in the run dir it
    shares with the trainer and ends with that sentence and exit 11, not a generic job failure."""
    import subprocess

    from polarstack import compose, smoke, tasks
    from polarstack.cli import main

    monkeypatch.setenv("POLARSTACK_RUN_DIR", str(tmp_path / "run"))
    monkeypatch.setattr(compose, "check_node", lambda *a, **kw: None)
    monkeypatch.setattr("polarstack.docker_state.usable", lambda requested: {"profile": "engine-direct"})  # `make up` ran
    passed = SimpleNamespace(ok=True, message="42 trainable tokens")
    monkeypatch.setattr(smoke, "run_smoke", lambda *a, **kw: passed)
    monkeypatch.setattr(tasks, "prepare", lambda task, out, **kw: out.mkdir(parents=True, exist_ok=True))
    sentence = "polarstack gate: stopping the job, no group with trainable tokens came back within 3600 s"

    def job(profile, args, **kw):
        script = args[-1]  # <TRAINER_RUN_DIR>/<run_id>/launch.sh; the run dir is shared with the host
        if not script.endswith("/launch.sh"):  # the pre-launch look inside the trainer (assets): all present
            return subprocess.CompletedProcess(args, 0, "", "")
        run_id = script.rsplit("/", 2)[-2]
        (tmp_path / "run" / "train" / run_id / "gate-abort.txt").write_text(sentence + "\n")
        return subprocess.CompletedProcess(args, 1)

    monkeypatch.setattr(compose, "run_compose", job)
    code = main(["train", "--task", "humaneval", "--runtime", "docker"])
    err = capsys.readouterr().err
    assert code == 11 and err.strip().splitlines()[-1].endswith(sentence) and "Traceback" not in err
