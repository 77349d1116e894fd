"""Issue 18 point 1: the batch layout Megatron's micro-batch calculator and slime's step split accept, per profile.

engine-direct trains on 3 GPUs at TP 1 (data-parallel size 3); Megatron asserts global_batch_size %
(micro_batch_size x DP) == 0 at start-up (configs/upstream/batch-rules.json), so the old 64 cannot start there."""

import copy

import pytest

from polarstack.cli.main import main
from polarstack.errors import ExitCode
from polarstack.offline.verify import check_batch_layout
from polarstack.paths import load_defaults
from polarstack.stack import profiles
from polarstack.stack.cluster import load as load_cluster
from polarstack.train import batch_layout
from polarstack.train.plan import build_plan

pytestmark = pytest.mark.unit

WORKING = ("engine-direct", "router-passthrough", "patched-router")


@pytest.fixture(autouse=True)
def no_local_state(tmp_path, monkeypatch):
    monkeypatch.setenv("POLARSTACK_RUN_DIR", str(tmp_path / "run"))


def test_the_record_names_each_rule_where_it_is_in_the_pinned_sources():
    facts = batch_layout.record()
    assert facts["megatron"]["constant_calculator"]["statement"] == (
        "assert global_batch_size % micro_batch_times_data_parallel_size == 0"
    )
    assert facts["megatron"]["commit_read"] == "1dcf0dafa884ad52ffb243625717a3471643e087"
    assert facts["slime"]["micro_batch_size_default"]["value"] == 1
    assert facts["slime"]["microbatch_calculator_call"]["file"] == "slime/backends/megatron_utils/initialize.py"


@pytest.mark.parametrize("name", WORKING)
def test_every_working_profile_renders_a_layout_megatron_and_slime_accept(name):
    plan = build_plan("humaneval", profiles.load(name), run_id="t", config=load_defaults(), cluster=load_cluster())
    layout = batch_layout.from_train_args(plan.train_args)
    assert batch_layout.problems(layout) == []
    check = check_batch_layout(profiles.load(name), cluster=load_cluster())
    assert check.ok, check.problems
    assert layout.data_parallel_size == (3 if name == "engine-direct" else 1)


def test_the_old_global_batch_of_64_is_refused_on_engine_direct_naming_the_numbers_and_a_valid_choice(capsys):
    code = main(
        [
            "train",
            "--task",
            "humaneval",
            "--dry-run",
            "--set",
            "grpo.rollout_batch_size=8",
            "--set",
            "grpo.global_batch_size=64",
        ]
    )
    err = capsys.readouterr().err.strip()
    assert code == ExitCode.USAGE and len(err.splitlines()) == 1, err
    assert "global_batch_size=64 is not divisible by micro_batch_size 1 x data-parallel size 3" in err
    choice = err.split('a valid choice: SET="')[1].split('"')[0]
    # the suggested choice itself passes
    argv = [a for kv in choice.split() for a in ("--set", kv)]
    assert main(["train", "--task", "humaneval", "--dry-run", *argv]) == 0, capsys.readouterr().err


def test_verify_offline_fails_a_layout_that_breaks_megatrons_rule(monkeypatch):
    config = load_defaults(["grpo.rollout_batch_size=8", "grpo.global_batch_size=64"])
    monkeypatch.setattr("polarstack.offline.verify.load_defaults", lambda *a, **k: copy.deepcopy(config))
    assert not check_batch_layout(profiles.load("engine-direct"), cluster=load_cluster()).ok
    assert check_batch_layout(profiles.load("patched-router"), cluster=load_cluster()).ok  # DP 1 there: 64 is fine


@pytest.mark.parametrize(
    "layout,needle",
    [
        (batch_layout.Layout(8, 8, 64, 1, 3), "not divisible by micro_batch_size 1 x data-parallel size 3"),
        (batch_layout.Layout(8, 6, 48, 2, 5), "not divisible by micro_batch_size 2 x data-parallel size 5"),
        (batch_layout.Layout(8, 6, 48, 1, 3, num_steps_per_rollout=2), "num_steps_per_rollout 2"),
        (batch_layout.Layout(8, 3, 48, 1, 1), "below global_batch_size=48"),
        (batch_layout.Layout(8, 9, 48, 1, 1), "drops the trailing 24 trajectories"),
    ],
)
def test_each_rule(layout, needle):
    found = batch_layout.problems(layout)
    assert any(needle in p for p in found), found
    fixed = batch_layout.valid_choice(layout)
    values = dict(kv.split("=") for kv in fixed.split())
    repaired = batch_layout.Layout(
        layout.n_samples_per_prompt,
        int(values.get("grpo.rollout_batch_size", layout.rollout_batch_size)),
        int(values["grpo.global_batch_size"]),
        layout.micro_batch_size,
        layout.data_parallel_size,
    )
    assert batch_layout.problems(repaired) == [], (fixed, batch_layout.problems(repaired))
