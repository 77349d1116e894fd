"""Pins the GRPO launch that `make train` renders: engine addresses, the profile's router arguments, Polar's
rollout function behind the gate, Polar's hooks and GRPO settings; and the refusals (unknown task, missing
model path, GPU layouts that do not fit, a TP size that does not divide the 4 query groups, batch sizes that
GRPO's normalization would treat as one group)."""

import json

import pytest
import yaml

from polarstack.cli.main import main
from polarstack.errors import ExitCode
from polarstack.stack.cluster import load as load_cluster

pytestmark = pytest.mark.unit


@pytest.fixture(autouse=True)
def no_local_state(tmp_path, monkeypatch):
    monkeypatch.setenv("POLARSTACK_RUN_DIR", str(tmp_path / "run"))


def plan(capsys, *extra):
    code = main(["train", "--task", "humaneval", "--dry-run", "--json", *extra])
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out)


def submitted(p):
    return next(c for c in p["commands"] if c.startswith("ray job submit"))


def test_engine_direct_launch(capsys):
    p = plan(capsys)
    cmd = submitted(p)
    assert p["profile"] == "engine-direct" and p["trainer_gpus"] == [1, 2, 3]
    assert "--rollout-external-engine-addrs 127.0.0.1:30000 --hf-checkpoint" in cmd
    assert "--sglang-router-ip" not in cmd
    assert "--rollout-function-path polarstack.train.gate.generate_rollout_gated" in cmd
    for flag in (
        "--advantage-estimator grpo",
        "--kl-loss-type low_var_kl",
        "--eps-clip 0.2",
        "--eps-clip-high 0.28",
        "--lr 1e-06",
        "--use-tis",
        "--use-kl-loss",
        "--custom-rm-path slime_bridge.reward.reward_func",
        "--tensor-model-parallel-size 1",
        "--num-query-groups 4",
    ):
        assert flag in cmd, flag
    # Polar's CeilEpoch data source needs slime API v0.3.1 lacks (issue 10 point 2): slime's default is used.
    assert "--data-source-path" not in cmd
    assert "--dynamic-history" not in cmd  # slime v0.3.1 would silently ignore it
    config = yaml.safe_load(p["files"]["polar_config.yaml"])
    assert config["polar_gate_delegate"] == "slime_bridge.rollout.generate_rollout_polar_async"
    # dynamic_history: inert at these pins (docs/gpu-facts.md), kept so the rendered plan stays as recorded
    assert config["polar_gate_base_url"] == "http://127.0.0.1:30000" and config["dynamic_history"] is True
    topology = yaml.safe_load(p["files"]["topology.yaml"])
    assert topology["gateway"]["nodes"][0]["inference"] == {"engine": "sglang", "base_url": "http://127.0.0.1:30000"}


def test_patched_router_registers_with_slime(capsys):
    cmd = submitted(plan(capsys, "--profile", "patched-router"))
    assert "--rollout-external-engine-addrs 127.0.0.1:30000 127.0.0.1:30010" in cmd
    assert "--sglang-router-ip 127.0.0.1 --sglang-router-port 30080" in cmd
    assert "--tensor-model-parallel-size 2" in cmd and "--sequence-parallel" in cmd
    assert '"POLAR_WORKER_DISCOVERY": "off"' in cmd


def test_router_passthrough_keeps_slime_off_the_static_router(capsys):
    p = plan(capsys, "--profile", "router-passthrough")
    assert "--sglang-router-ip" not in submitted(p)  # 0.1.4 has no POST /workers
    assert (
        yaml.safe_load(p["files"]["topology.yaml"])["gateway"]["nodes"][0]["inference"]["base_url"]
        == "http://127.0.0.1:30080"
    )


@pytest.mark.parametrize(
    "argv,env,needle",
    [
        (
            ["--set", "parallel.default.tensor_model_parallel_size=3", "--profile", "patched-router"],
            {},
            "does not divide Qwen2.5-7B-Instruct's 4 query groups",
        ),
        (["--set", "parallel.engine-direct.tensor_model_parallel_size=2"], {}, "does not divide the 3 trainer GPU"),
        (["--set", "grpo.global_batch_size=60"], {}, "not a multiple of n_samples_per_prompt=8"),
        (["--set", "grpo.global_batch_size=96"], {}, "would treat the batch as one group"),
        (["--set", "grpo.n_samples_per_prompt=1", "--set", "grpo.global_batch_size=8"], {}, "at least 2 samples"),
        ([], {"MODEL_PATH": ""}, "no model path"),
        ([], {"MODEL_PATH": "models/q"}, "must be an absolute path"),
        ([], {"TRAINER_GPUS": "1,2,3,4"}, "GPU 4 does not exist on a 4-GPU node"),
        (["--set", "grpo.nope=1"], {}, "has no key 'nope'"),
    ],
)
def test_refusals(capsys, monkeypatch, argv, env, needle):
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    code = main(["train", "--task", "humaneval", "--dry-run", *argv])
    err = capsys.readouterr().err
    assert code == ExitCode.USAGE, err
    assert needle in err and len(err.strip().splitlines()) == 1


def test_unknown_task(capsys):
    assert main(["train", "--task", "nope", "--dry-run"]) == ExitCode.USAGE
    assert "choose one of humaneval, mbpp" in capsys.readouterr().err


@pytest.mark.parametrize(
    "override",
    [
        "grpo.rollout_max_response_len=abc",
        "context.seq_length=1.5",
        "grpo.max_tokens_per_gpu=-4",
        "checkpoint.save_interval=0",
        "grpo.lr=nan",
        "polar.gateway_port=70000",
        "context.harness_margin_tokens=-1",
    ],
)
def test_set_values_of_the_wrong_type_are_usage_errors_naming_the_key(override, capsys):
    """A `--set` value that is not what train_async.py's flag takes ends as USAGE naming the key (issue 12 point 11's
    class of edge inputs), not as an internal error when the budget or the launch reads it."""
    from polarstack.cli.main import main

    code = main(["train", "--task", "humaneval", "--runtime", "docker", "--dry-run", "--set", override])
    err = capsys.readouterr().err
    assert code == 2 and override.split("=")[0] in err and "internal error" not in err


# --- issue 18 point 6: the Ray job does not depend on its working directory ---------------------------------------
@pytest.mark.parametrize("name", ["engine-direct", "router-passthrough", "patched-router", "stock-router"])
@pytest.mark.parametrize("task", ["humaneval", "mbpp"])
def test_the_job_needs_no_working_directory(name, task):
    from polarstack.stack import profiles
    from polarstack.train import ray_job
    from polarstack.train.plan import build_plan

    submit = build_plan(task, profiles.load(name), run_id="t", cluster=load_cluster()).commands[-1]
    assert ray_job.problems(submit) == []
    entrypoint = submit[submit.index("--") + 1 :]
    assert entrypoint[:2] == ["python3", "/root/slime/train_async.py"]
    assert not any(t.startswith("--working-dir") for t in submit[: submit.index("--")])


def test_the_old_submit_is_refused_naming_both_problems():
    from polarstack.train import ray_job

    old = [
        "ray",
        "job",
        "submit",
        "--working-dir=/root/slime",
        "--",
        "python3",
        "train_async.py",
        "--prompt-data",
        "x/y",
    ]
    found = ray_job.problems(old)
    assert len(found) == 2 and "512 MiB" in found[0] and "train_async.py, x/y" in found[1]
