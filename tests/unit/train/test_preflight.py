"""Pins the rehearsal's plan (`make preflight DRY_RUN=1`, issue 19): for every working profile a small model with
slime's own Megatron arguments (configs/upstream/slime-models.json), tiny GRPO settings that satisfy Megatron's and
slime's batch rules at the profile's data-parallel size, two jobs on one checkpoint directory (a save, then a
--load), and the report's path under the run state; the refusals (a diagnostic profile, a batch that breaks
Megatron's microbatch rule); verify-offline's check of it, which must fail on a drifted model script."""

import importlib.util
import json
import sys

import pytest

from polarstack.cli.main import main
from polarstack.errors import ExitCode, StackError
from polarstack.offline import verify as verify_offline
from polarstack.pins import repo_root
from polarstack.stack import profiles
from polarstack.stack.cluster import load as load_cluster
from polarstack.train import model_size, preflight

pytestmark = pytest.mark.unit
WORKING = ("engine-direct", "router-passthrough", "patched-router")


@pytest.fixture(autouse=True)
def no_local_state(tmp_path, monkeypatch):
    monkeypatch.setenv("POLARSTACK_RUN_DIR", str(tmp_path / "run"))


def dry_run(capsys, profile, *extra):
    code = main(["preflight", "--profile", profile, "--dry-run", "--json", *extra])
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out)


@pytest.mark.parametrize("name", WORKING)
def test_dry_run_renders_the_rehearsal(capsys, name):
    plan = dry_run(capsys, name)
    record = json.loads((repo_root() / preflight.MODELS_RECORD).read_text())
    expected = record["models"]["qwen2.5-3B"]["args"]
    train, resume = plan["phases"]
    submit = next(c for c in train["commands"] if c.startswith("ray job submit"))
    assert " ".join(expected) in submit  # slime's scripts/models/qwen2.5-3B.sh, token by token
    assert "--hf-checkpoint /models/Qwen2.5-3B-Instruct" in submit
    assert "--num-rollout 2" in submit and "--save-interval 2" in submit and "--load" not in submit
    resumed = next(c for c in resume["commands"] if c.startswith("ray job submit"))
    assert f"--load {train['checkpoint_dir']}" in resumed and "--num-rollout 3" in resumed
    assert train["checkpoint_dir"] == resume["checkpoint_dir"]
    dp = plan["data_parallel_size"]
    assert dp == len(profiles.load(name).trainer_gpus) // train["tensor_model_parallel_size"]
    assert 12 % dp == 0 and "--global-batch-size 12" in submit
    assert plan["report"].startswith(".run/train/") and plan["report"].endswith("rehearsal-report.json")
    assert plan["stack_env"]["MODEL_PATH"] == "/models/Qwen2.5-3B-Instruct"
    assert len(plan["task_ids"]) == 9


def test_diagnostic_profile_is_refused(capsys):
    assert main(["preflight", "--profile", "stock-router", "--dry-run"]) == ExitCode.USAGE
    assert "diagnostic" in capsys.readouterr().err


def test_megatron_batch_rule_refuses_a_batch_dp_does_not_divide(capsys):
    # engine-direct: 3 trainer ranks at TP 1. 8 samples per batch cannot split over 3 ranks at micro-batch 1.
    code = main(
        [
            "preflight",
            "--profile",
            "engine-direct",
            "--dry-run",
            "--set",
            "grpo.global_batch_size=8",
            "--set",
            "grpo.n_samples_per_prompt=4",
            "--set",
            "grpo.rollout_batch_size=2",
        ]
    )
    err = capsys.readouterr().err
    assert code == ExitCode.USAGE and "data-parallel size 3" in err and "global_batch_size=12" in err
    # the same settings are fine at DP 1
    assert (
        preflight.batch_problems(
            profiles.load("patched-router"),
            {"grpo": {"n_samples_per_prompt": 4, "rollout_batch_size": 4, "global_batch_size": 8}},
            2,
        )
        == []
    )


def test_slime_num_steps_rule():
    config = {
        "grpo": {
            "n_samples_per_prompt": 4,
            "rollout_batch_size": 3,
            "global_batch_size": 12,
            "num_steps_per_rollout": 2,
        }
    }
    problems = preflight.batch_problems(profiles.load("patched-router"), config, 2)
    assert len(problems) == 1 and "num_steps_per_rollout=2" in problems[0]


def test_model_facts_match_slime_scripts():
    seven = model_size.model_facts(preflight.slime_model_args("7B"))
    # README's weight figure for the 7B: 7,615,616,512 parameters computed from slime's qwen2.5-7B.sh.
    assert seven["parameters"] == 7_615_616_512 and not seven["tied_embeddings"]
    assert (seven["vocab_size"], seven["num_query_groups"]) == (152064, 4)
    for size in ("0.5B", "1.5B", "3B"):
        small = model_size.model_facts(preflight.slime_model_args(size))
        assert small["tied_embeddings"] and (small["vocab_size"], small["num_query_groups"]) == (151936, 2)


def test_unknown_size_is_usage():
    with pytest.raises(StackError) as info:
        preflight.slime_model_args("14B")
    assert info.value.code == ExitCode.USAGE


def test_recorder_parses_bash_arrays():
    spec = importlib.util.spec_from_file_location(
        "record_slime_models", repo_root() / "scripts/tools/record_slime_models.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules["record_slime_models"] = module
    spec.loader.exec_module(module)
    tokens, lines = module.parse_model_args('#!/bin/bash\nMODEL_ARGS=(\n   --swiglu\n   --normalization "RMSNorm"\n)\n')
    assert tokens == ["--swiglu", "--normalization", "RMSNorm"] and lines == {"--swiglu": 3, "--normalization": 4}


def test_verify_offline_checks_the_rehearsal(monkeypatch):
    profile = profiles.load("engine-direct")
    assert verify_offline.check_preflight(profile, load_cluster()).ok
    drifted = preflight.models_record()
    drifted["models"]["qwen2.5-7B"]["args"] = drifted["models"]["qwen2.5-7B"]["args"][:-1]  # a flag lost upstream
    monkeypatch.setattr(preflight, "models_record", lambda: drifted)
    check = verify_offline.check_preflight(profile, load_cluster())
    assert not check.ok and any("qwen2.5-7B.sh" in p for p in check.problems)


def test_make_targets_pass_the_knobs():
    import subprocess

    def rendered(*words):
        proc = subprocess.run(["make", "-n", *words], capture_output=True, text=True, cwd=repo_root())
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    assert 'preflight --profile "patched-router" --dry-run' in rendered(
        "preflight", "DRY_RUN=1", "PROFILE=patched-router"
    )
    assert "--without-rehearsal" in rendered("train", "TASK=humaneval", "ALLOW_NO_PREFLIGHT=1")
    assert "--without-rehearsal" not in rendered("train", "TASK=humaneval")
