"""Pins the in-job gate (slime's --rollout-function-path polarstack.train.gate.generate_rollout_gated) with stand-ins
shaped like slime's Sample and Polar's rollout function (slime.md: a synchronous fn(args, rollout_id,
data_source, evaluation=False) returning samples grouped per prompt, optionally with metrics): it checks the
path at the first rollout, aborts there through a router that drops Polar's fields, and aborts after K
consecutive zero-token groups, counting the groups Polar's bridge already dropped (the `_delta` /
`_since_worker_start` keys the pinned Polar exports). The watchdog (against a fake bridge shaped like the pinned
Polar), the reward check and every stop's way to `polarstack train` are pinned in tests/unit/train/test_gate_watchdog.py."""

import sys
import types
from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest

from polarstack.pins import pin
from polarstack.stack.cluster import load as load_cluster
from polarstack.train import gate
from train_fakes import fake_node_for_train

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
    return SimpleNamespace(
        polar_gate_base_url=url,
        polar_gate_route="base",
        polar_gate_max_zero_token_groups=limit,
        polar_gate_delegate="standin_polar_rollout.generate",
        polar_served_model_name=None,
    )


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


@pytest.mark.unit
def test_the_rendered_polar_config_carries_the_watchdog_settings():
    import yaml

    from polarstack.stack import profiles
    from polarstack.train.plan import build_plan

    plan = build_plan("humaneval", profiles.load("stock-router"), run_id="r1", cluster=load_cluster())
    config = yaml.safe_load(plan.files["polar_config.yaml"])
    assert config["polar_gate_watchdog_seconds"] == 3600 and config["polar_gate_allow_retokenized"] is False
    assert config["polar_gate_zero_reward_rollouts"] == 3
    assert config["polar_gate_abort_file"].endswith("/r1/gate-abort.txt")


@pytest.mark.unit
def test_train_reports_the_watchdogs_sentence_with_the_gate_code(tmp_path, monkeypatch, capsys):
    """The job's process dies (os._exit in the watchdog); `polarstack train` finds gate-abort.txt in the run dir it
    shares with the trainer and ends with that sentence and exit 11, not a generic job failure."""
    import subprocess

    from polarstack.cli.main import main
    from polarstack.stack import compose

    passed = SimpleNamespace(ok=True, message="42 trainable tokens")
    fake_node_for_train(monkeypatch, tmp_path, smoke_report=passed)
    sentence = "polarstack gate: stopping the job, no group with trainable tokens came back within 3600 s"

    def job(profile, args, **kw):
        script = args[-1]  # <TRAINER_RUN_DIR>/<run_id>/launch.sh; the run dir is shared with the host
        if not script.endswith("/launch.sh"):  # the pre-launch look inside the trainer (assets): all present
            return subprocess.CompletedProcess(args, 0, "", "")
        run_id = script.rsplit("/", 2)[-2]
        (tmp_path / "run" / "train" / run_id / "gate-abort.txt").write_text(sentence + "\n")
        return subprocess.CompletedProcess(args, 1)

    monkeypatch.setattr(compose, "run_compose", job)
    code = main(["train", "--task", "humaneval", "--runtime", "docker", "--without-rehearsal"])  # issue 19's record
    err = capsys.readouterr().err
    assert code == 11 and err.strip().splitlines()[-1].endswith(sentence) and "Traceback" not in err
