"""`make preflight`: the rehearsal's plan. The real stack at toy scale: a small model of the family, two jobs.

The rehearsal is the real run's launch (train.build_plan, the same profile, images, Polar services, sandbox,
router, weight sync and gate) with three changes read from configs/train/preflight.yaml:
- the model: slime's own `scripts/models/qwen2.5-<size>.sh` at SLIME_COMMIT gives the Megatron arguments
  (configs/upstream/slime-models.json, recorded by scripts/tools/record_slime_models.py);
- tiny GRPO settings that satisfy Megatron's and slime's batch rules on the profile (`batch_problems`);
- two jobs on one checkpoint directory: `first` rollouts with a save, then a resume (--load) running
  `after_resume` more, so checkpoint and resume are part of what is rehearsed.
The engines serve the small model: `make preflight` needs the stack down, brings the profile up with
MODEL_PATH/SERVED_MODEL_NAME of the small model, runs both jobs, writes the report, and takes the stack down
again (docs/preflight.md, "How the engines come up").
"""

from __future__ import annotations

import copy
import json
import re
import shlex
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from polarstack.errors import ExitCode, StackError
from polarstack.paths import TRAINER_RUN_DIR, configs_dir, load_defaults, repo_root
from polarstack.pins import pins
from polarstack.stack import assets, docker_state, profiles
from polarstack.stack import cluster as cluster_mod
from polarstack.stack.cluster import Cluster
from polarstack.stack.profiles import Profile, stack_knobs
from polarstack.stack.resolved import Resolved
from polarstack.train import cluster_plan, memory, step_cost, synthetic_rollout
from polarstack.train.model_size import model_facts
from polarstack.train.plan import LaunchPlan, build_plan, check_task
from polarstack.train.ray_job import SUBMISSION_ID

MODELS_RECORD = "configs/upstream/slime-models.json"
PREFLIGHT_CONFIG = "configs/train/preflight.yaml"
REPORT_NAME = "rehearsal-report.json"  # under .run/train/<run>/ (the trainer sees it at TRAINER_RUN_DIR/<run>/)
SUMMARY_NAME = "rollouts.jsonl"  # one line per rollout, written by the in-job gate (polarstack.train.learning_signal)
MICRO_BATCH_SIZE = 1  # slime's default --micro-batch-size; the plan does not set it


def models_record() -> dict[str, Any]:
    return json.loads((repo_root() / MODELS_RECORD).read_text())


def slime_model_args(size: str) -> list[str]:
    """MODEL_ARGS of slime's scripts/models/qwen2.5-<size>.sh at SLIME_COMMIT, token by token."""
    record = models_record()
    if record["slime_commit"] != pins()["SLIME_COMMIT"]:
        raise StackError(
            f"{MODELS_RECORD} was recorded at slime {record['slime_commit'][:12]}, not SLIME_COMMIT; rerun "
            "scripts/tools/record_slime_models.py.",
            ExitCode.USAGE,
        )
    key = f"qwen2.5-{size}"
    if key not in record["models"]:
        sizes = ", ".join(k.removeprefix("qwen2.5-") for k in record["models"])
        raise StackError(f"model.size={size!r} has no slime model script; choose one of {sizes}.", ExitCode.USAGE)
    return list(record["models"][key]["args"])


# config.json keys (Hugging Face's Qwen2 config) for each Megatron fact; checked on the node before the jobs run.
HF_CONFIG_KEYS = {
    "vocab_size": "vocab_size",
    "tied_embeddings": "tie_word_embeddings",
    "num_query_groups": "num_key_value_heads",
    "hidden_size": "hidden_size",
    "num_layers": "num_hidden_layers",
    "num_attention_heads": "num_attention_heads",
    "ffn_hidden_size": "intermediate_size",
    "rotary_base": "rope_theta",
}


def config_mismatches(facts: dict[str, Any], hf_config: dict[str, Any]) -> list[str]:
    """Where slime's model script disagrees with the weights' config.json (a silent mistraining: Megatron would
    build another model than the checkpoint, or rotate positions differently)."""
    out = []
    for fact, key in HF_CONFIG_KEYS.items():
        if key not in hf_config:
            continue
        want, have = facts[fact], hf_config[key]
        same = float(want) == float(have) if fact == "rotary_base" else want == have
        if not same:
            out.append(f"{key}={have} in config.json, but slime's script gives {fact}={want}")
    return out


def preflight_config(path: Path | None = None) -> dict[str, Any]:
    path = path or configs_dir() / "train" / "preflight.yaml"
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise StackError(f"cannot read {path} ({exc}); restore it from git.", ExitCode.USAGE) from None


def _merge(base: dict[str, Any], over: dict[str, Any], where: str) -> None:
    for key, value in (over or {}).items():
        if key not in base:
            raise StackError(
                f"{PREFLIGHT_CONFIG}: {where}{key} is not a key of configs/train/defaults.yaml.", ExitCode.USAGE
            )
        if isinstance(value, dict) and isinstance(base[key], dict):
            _merge(base[key], value, f"{where}{key}.")
        else:
            base[key] = value


def train_config(rehearsal: dict[str, Any], sets: list[str] | None = None) -> dict[str, Any]:
    """configs/train/defaults.yaml with the rehearsal's model and `train:` overrides, then SET overrides."""
    config = load_defaults()
    _merge(config, rehearsal.get("train") or {}, "train.")
    size = str(rehearsal["model"]["size"])
    args = slime_model_args(size)
    name = f"Qwen2.5-{size}-Instruct"
    config["model"].update(
        {
            "name": name,
            "hf_checkpoint": f"/models/{name}",
            "ref_load": f"/models/{name}",
            "num_query_groups": model_facts(args)["num_query_groups"],
            "args": args,
        }
    )
    config["checkpoint"]["save_interval"] = int(rehearsal["phases"]["first"])
    for item in sets or []:  # the same dotted keys as make train's SET
        key, sep, raw = item.partition("=")
        node = config
        parts = key.split(".")
        for part in parts[:-1]:
            node = node.get(part) if isinstance(node.get(part), dict) else None
            if node is None:
                raise StackError(f"--set {key}: no section {part!r}.", ExitCode.USAGE)
        if not sep or parts[-1] not in node:
            raise StackError(f"--set {item!r} must name a key of configs/train/defaults.yaml.", ExitCode.USAGE)
        node[parts[-1]] = yaml.safe_load(raw)
    return config


def data_parallel_size(profile: Profile, tp: int, pp: int = 1, cp: int = 1, nodes: int = 1) -> int:
    """DP: every node's trainer GPUs (len(TRAINER_GPUS) per node at NODES>1) over TP x PP x CP."""
    return nodes * len(profile.trainer_gpus) // (tp * pp * cp)


def batch_problems(profile: Profile, config: dict[str, Any], tp: int, nodes: int = 1) -> list[str]:
    """Megatron's and slime's batch rules on this profile (one sentence each, naming the numbers and a fix).

    - Megatron's constant microbatch calculator, which slime initialises even with dynamic batching
      (slime/backends/megatron_utils/initialize.py at SLIME_COMMIT calls init_num_microbatches_calculator),
      asserts global_batch_size % (micro_batch_size x data_parallel_size) == 0;
    - slime (slime/utils/arguments.py l.1907-1913) asserts global_batch_size == rollout_batch_size x
      n_samples_per_prompt // num_steps_per_rollout when --num-steps-per-rollout is set;
    - the samples of one rollout (rollout_batch_size x n_samples_per_prompt) split into whole global batches."""
    grpo = config["grpo"]
    n, rollout, batch = grpo["n_samples_per_prompt"], grpo["rollout_batch_size"], grpo["global_batch_size"]
    dp = data_parallel_size(profile, tp, nodes=nodes)
    problems = []
    if batch % (MICRO_BATCH_SIZE * dp):
        fit = next(b for b in range(batch, batch * dp * n + 1) if b % (dp * n) == 0)
        problems.append(
            f"global_batch_size={batch} is not a multiple of micro_batch_size {MICRO_BATCH_SIZE} x data-parallel "
            f"size {dp} (profile {profile.name}: {nodes * len(profile.trainer_gpus)} trainer GPUs at TP {tp}); Megatron's "
            f"microbatch calculator refuses it: use grpo.global_batch_size={fit} with rollout_batch_size x "
            f"n_samples_per_prompt a multiple of it"
        )
    if (rollout * n) % batch:
        problems.append(
            f"rollout_batch_size x n_samples_per_prompt = {rollout * n} is not a multiple of global_batch_size="
            f"{batch}: a rollout would not split into whole training batches"
        )
    steps = grpo.get("num_steps_per_rollout")
    if steps and batch != rollout * n // int(steps):
        problems.append(
            f"num_steps_per_rollout={steps} needs global_batch_size == {rollout} x {n} // {steps} = "
            f"{rollout * n // int(steps)} (slime/utils/arguments.py l.1907-1913), not {batch}"
        )
    return problems


# --- the 7B's own parts (issue 32 point 8) ---------------------------------------------------------------------------
# After the small model's two jobs, the rehearsal brings the profile up again with the real run's model (the 7B, as
# `make up` would) and, in slime's own debug mode, runs one train-only step of the 7B on a synthetic rollout of full
# traces (polarstack.train.synthetic_rollout; --load-debug-rollout-data: no rollout servers, no weight update), with
# nvidia-smi sampling every trainer GPU, then reloads the 7B's weights into engine-0 through the same sglang call
# slime's disk weight sync makes (slime/ray/actor_group.py l.247 `update_weights_from_disk`; sglang's POST
# /update_weights_from_disk, UpdateWeightFromDiskReqInput model_path + weight_version).
SEVEN_B_PER_PROMPT = 2  # two samples per group: rewards 1 and 0, non-zero advantages
SEVEN_B_ROLLOUT = "synthetic-rollout-{rollout_id}.pt"
SEVEN_B_GPU_LOG = "7b-gpu-memory.csv"
SEVEN_B_RELOAD_VERSION = "rehearsal-7b-reload"
GPU_SAMPLE_MS = 500  # nvidia-smi -lms: a spike shorter than this may be missed
# Flags of the real run's launch that the train-only step drops: Polar's rollout, reward and config (nothing is
# generated), and --save-interval (without an interval slime never saves: slime/utils/misc.py
# should_run_periodic_action returns False for interval None, so no 7B checkpoint is written).
SEVEN_B_DROPPED = (
    "--save-interval",
    "--rollout-function-path",
    "--custom-rm-path",
    "--custom-reward-post-process-path",
    "--custom-config-path",
)
# The added time, estimated from sizes and stated rates (not measured): the 7B's bf16 weights read from the models
# volume by each engine at `up`, by the trainer's actor and reference (--hf-checkpoint, --ref-load) and once more by
# the reload, at a stated disk rate; engine start-up and the trainer's Megatron/Ray start-up as stated allowances; the
# step's compute from polarstack.train.step_cost's rule (6 x parameters x tokens / stated TFLOPS per GPU).
DISK_GB_PER_SECOND = 1.0  # stated: a local NVMe volume reads a few GB/s, a network volume less
ENGINE_START_SECONDS = 120  # stated: sglang's start beside the weights' read (CUDA graphs, KV pool)
TRAINER_START_SECONDS = 180  # stated: Ray job, Megatron initialisation, HF -> Megatron conversion of two models
PREFLIGHT_GOAL_SECONDS = 15 * 60


@dataclass
class SevenB:
    model: str
    hf_checkpoint: str
    stack_env: dict[str, str]
    prompts: int
    per_prompt: int
    seq_tokens: int
    prompt_tokens: int
    train_args: list[str]
    submit: list[str]
    script: str
    memory: Any  # polarstack.train.memory.MemoryPlan of the real run (the step's estimate per trainer GPU)
    engine_url: str
    added_seconds: dict[str, float]

    def as_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "stack_env": self.stack_env,
            "synthetic_rollout": {
                "samples": self.prompts * self.per_prompt,
                "groups": self.prompts,
                "per_group": self.per_prompt,
                "tokens_per_sample": self.seq_tokens,
                "prompt_tokens": self.prompt_tokens,
                "file": SEVEN_B_ROLLOUT,
            },
            "train_step": shlex.join(self.submit),
            "estimate_per_trainer_gpu_gb": round(self.memory.trainer_gb, 3),
            "host_estimate_gb": round(self.memory.host_gb, 3),
            "reload": {
                "engine": self.engine_url,
                "request": f"POST {self.engine_url}/update_weights_from_disk",
                "body": {"model_path": self.hf_checkpoint, "weight_version": SEVEN_B_RELOAD_VERSION},
            },
            "added_seconds_estimate": self.added_seconds,
        }


def _without(args: list[str], flags: tuple[str, ...]) -> list[str]:
    out, skip = [], False
    for arg in args:
        if skip:
            skip = False
            continue
        if arg in flags:
            skip = True
            continue
        out.append(arg)
    return out


def _set(args: list[str], flag: str, value: str) -> list[str]:
    out = list(args)
    out[out.index(flag) + 1] = value
    return out


CPU_ADAM_PARAMS_PER_SECOND = 0.5e9  # stated: slime's offloaded optimizer steps on the host (its rate, not measured)


def added_seconds(
    facts: dict[str, Any], traces: int, seq: int, gpus: int, tflops: float, offload: bool = False
) -> dict[str, float]:
    """The 7B parts' added time (an estimate from sizes and stated rates, never a measurement)."""
    params = facts["parameters"]
    weights_gb = 2 * params / 1e9
    reads = {  # GB read from the models volume
        "engines load the 7B at up": weights_gb,
        "the trainer loads actor and reference": 2 * weights_gb,
        "the reload": weights_gb,
    }
    out = {
        f"{name} ({gb:.1f} GB at {DISK_GB_PER_SECOND:g} GB/s, stated)": gb / DISK_GB_PER_SECOND
        for name, gb in reads.items()
    }
    out[f"engine start-up (stated {ENGINE_START_SECONDS} s)"] = float(ENGINE_START_SECONDS)
    out[f"trainer start-up (stated {TRAINER_START_SECONDS} s)"] = float(TRAINER_START_SECONDS)
    # the step: polarstack.train.step_cost's FLOPs per trace (its forwards per step, attention included) over the
    # trainer GPUs at the stated TFLOPS (cost.trainer_tflops_per_gpu)
    flops = traces * step_cost.trace_flops(facts, seq)
    out[
        f"the step: {traces} traces of {seq:,} tokens (step_cost's FLOPs) at {tflops:g} TFLOPS x {gpus} GPUs (stated)"
    ] = flops / (tflops * 1e12 * gpus)
    if offload:
        out[f"the CPU optimizer's step over {params:,} parameters at {CPU_ADAM_PARAMS_PER_SECOND:g}/s (stated)"] = (
            params / CPU_ADAM_PARAMS_PER_SECOND
        )
    out = {k: round(v, 1) for k, v in out.items()}
    out["total"] = round(sum(out.values()), 1)
    return out


def seven_b(profile: Profile, run_id: str, cluster: Cluster) -> SevenB:
    """The 7B's train-only step and reload: the real run's plan (configs/train/defaults.yaml, its model and memory
    decision) with one rollout of the synthetic file and the batch sized to one group of two per data-parallel rank."""
    config = load_defaults()  # the real run's (make train without SET), its memory.optimizer_offload decision included
    section = config["parallel"].get(profile.name) or config["parallel"]["default"]
    tp = int(section["tensor_model_parallel_size"])
    dp = data_parallel_size(profile, tp, nodes=cluster.nodes)
    per_prompt = SEVEN_B_PER_PROMPT
    config["grpo"].update(
        n_samples_per_prompt=per_prompt, rollout_batch_size=dp, global_batch_size=per_prompt * dp, num_rollout=1
    )
    config["checkpoint"]["run_name"] = f"{run_id}-7b"  # a directory nothing writes (no --save-interval)
    plan = build_plan("humaneval", profile, run_id=f"{run_id}-7b", config=config, cluster=cluster)
    run_dir = f"{TRAINER_RUN_DIR}/{run_id}"
    seq = int(config["context"]["seq_length"])
    prompt_tokens = int(config["grpo"]["rollout_max_prompt_len"])
    args = _without(plan.train_args, SEVEN_B_DROPPED)
    args = _set(args, "--prompt-data", f"{run_dir}/tasks/train.jsonl")  # the data source still reads it at start
    args += ["--load-debug-rollout-data", f"{run_dir}/{SEVEN_B_ROLLOUT}"]
    submit = list(plan.commands[-1])
    submit = submit[: submit.index("--") + 1] + submit[submit.index("--") + 1 : submit.index("--") + 3] + args
    submit = [a.replace(SUBMISSION_ID, f"{run_id}-7b-step") for a in submit]
    model = config["model"]
    stack_env = {
        "MODEL_NAME": _hub_name(model["name"]),
        "MODEL_PATH": model["hf_checkpoint"],
        "SERVED_MODEL_NAME": model["name"],
    }
    gen = [
        "python3",
        "-m",
        "polarstack.train.synthetic_rollout",
        "--out",
        f"{run_dir}/{SEVEN_B_ROLLOUT.format(rollout_id=0)}",
        "--prompts",
        str(dp),
        "--per-prompt",
        str(per_prompt),
        "--seq-tokens",
        str(seq),
        "--prompt-tokens",
        str(prompt_tokens),
    ]
    sampler = [
        "nvidia-smi",
        "--query-gpu=index,memory.used",
        "--format=csv,noheader,nounits",
        f"--loop-ms={GPU_SAMPLE_MS}",
    ]
    dashboard = submit[3].removeprefix("--address=")
    script = "\n".join(
        [
            "#!/usr/bin/env bash",
            f"# Rendered by `polarstack preflight --profile {profile.name}` (run {run_id}): the 7B's train-only step.",
            "set -euo pipefail",
            f"cd {shlex.quote(run_dir)}",
            *(f"export {key}={shlex.quote(value)}" for key, value in cluster_plan_launch_env(cluster).items()),
            shlex.join(gen),
            "# every trainer GPU's used memory (MiB) while the step runs; stopped by its pid",
            f"{shlex.join(sampler)} > {SEVEN_B_GPU_LOG} & sampler=$!",
            "cleanup() {",
            f"  ray job stop --address={shlex.quote(dashboard)} {shlex.quote(run_id + '-7b-step')} >> ray-job-stop.log "
            "2>&1 || true",
            '  kill "$sampler" 2>/dev/null || true',
            "}",
            "trap cleanup EXIT",
            shlex.join(submit),
            "",
        ]
    )
    facts = model_facts([str(a) for a in model["args"]])
    return SevenB(
        model=str(model["name"]),
        hf_checkpoint=str(model["hf_checkpoint"]),
        stack_env=stack_env,
        prompts=dp,
        per_prompt=per_prompt,
        seq_tokens=seq,
        prompt_tokens=prompt_tokens,
        train_args=args,
        submit=submit,
        script=script,
        memory=plan.memory,
        engine_url=f"http://127.0.0.1:{profile.engine_port(0)}",
        added_seconds=added_seconds(
            facts,
            dp * per_prompt,
            seq,
            len(profile.trainer_gpus) * cluster.nodes,
            float(config["cost"]["trainer_tflops_per_gpu"]),
            offload=plan.memory.offload,
        ),
    )


def seven_b_line(plan: LaunchPlan) -> str:
    """`make train DRY_RUN=1`: what the passing rehearsal `make train` requires proved of this plan's model."""
    if plan.cluster.multi:
        return "make preflight's 7B parts run on one node only; at NODES>1 the rehearsal proves the cluster"
    seq = int(plan.config["context"]["seq_length"])
    estimate = f" ({plan.memory.trainer_gb:.1f} GB)" if plan.memory else ""
    return (
        f"make preflight's 7B parts (its pass is required before this launch): one train-only step of "
        f"{plan.config['model']['name']} on a synthetic rollout of full {seq:,}-token traces under slime's "
        f"--load-debug-rollout-data, the peak GPU memory per trainer rank against the estimate below{estimate}, and "
        "a reload of its weights into engine-0 by POST /update_weights_from_disk (the call slime's disk weight sync "
        "makes)"
    )


def _hub_name(name: str) -> str:
    """The Hugging Face id of the real run's model (`make model`'s default MODEL_NAME, configs/stack.env)."""
    return stack_knobs().get("MODEL_NAME") or f"Qwen/{name}"


def cluster_plan_launch_env(cluster: Cluster) -> dict[str, str]:
    return cluster_plan.launch_env(cluster)


@dataclass
class PreflightPlan:
    profile: str
    run_id: str
    size: str
    hub_name: str
    model: dict[str, Any]
    task: str
    task_ids: list[str]
    phases: list[tuple[str, LaunchPlan]]
    stack_env: dict[str, str]
    report_path: str
    summary_path: str
    data_parallel: int
    cluster: Cluster = field(default=cluster_mod.SINGLE, repr=False)
    files: dict[str, str] = field(default_factory=dict)
    report_settings: dict[str, Any] = field(default_factory=dict)  # preflight.yaml `report:`
    sets: list[str] = field(default_factory=list)
    seven_b: SevenB | None = None  # the 7B's train-only step and reload (single node; None at NODES>1)

    def as_dict(self) -> dict[str, Any]:
        return {
            "profile": self.profile,
            "run_id": self.run_id,
            "model": {"size": self.size, "hub_name": self.hub_name, **self.model},
            "task": self.task,
            "task_ids": self.task_ids,
            "stack_env": self.stack_env,
            "data_parallel_size": self.data_parallel,
            "report": self.report_path,
            "rollout_summaries": self.summary_path,
            "phases": [{"name": name, **plan.as_dict()} for name, plan in self.phases],
            "steps": steps(self),
            **({"seven_b": self.seven_b.as_dict()} if self.seven_b else {}),
        }


def steps(plan: PreflightPlan) -> list[str]:
    """What `make preflight` does on the node, in order (docs/preflight.md; docs/multi-node.md at NODES>1)."""
    env = " ".join(f"{k}={v}" for k, v in plan.stack_env.items())
    cluster = plan.cluster
    up = (
        [f"make up PROFILE={plan.profile} with {env}"]
        if not cluster.multi
        else [
            f"make up PROFILE={plan.profile} with {env} here, on the head (rank 0); then the same on every other node "
            f"({', '.join(cluster.addrs[1:])}) with NODE_RANK set, which the rehearsal waits for",
            "the cluster check (polarstack.checks.nodes): every node's report, pins, Ray membership, ports, clock, "
            "GPUs and memory",
        ]
    )
    shared = (
        [
            f"SHARED_DIR ({cluster.shared_dir}) proven one directory: a Ray job writes a nonce on the head and one task "
            "pinned to each node reads it and writes its own file back (polarstack.checks.shared_probe)"
        ]
        if cluster.multi
        else []
    )
    return [
        "refuse unless no profile is up (`make down` first): the engines load the model when they start",
        "the task's verifier on HumanEval/0 in the namespace shape of Polar's sessions, in the trainer image "
        "(compose run; polarstack.checks.shape_probe): refuse in seconds (exit 8) before anything starts",
        *up,
        "the smoke gate against that path (as make train)",
        *shared,
        "the sandbox probe in the trainer; the weights' config.json against slime's model script (stop on a difference)",
        "the checkpoints volume's free space against the rehearsal's saves and weight-sync copy (as make train)",
        f"job 1 (launch-train.sh): rollouts 0-{_rollouts(plan.phases[0][1]) - 1}, saves a checkpoint",
        f"job 2 (launch-resume.sh): --load of the same checkpoint directory, rollouts "
        f"{_rollouts(plan.phases[0][1])}-{_rollouts(plan.phases[1][1]) - 1}, through the supervisor "
        "(polarstack.train.supervise), its first attempt made to crash after the job ended so that the supervisor "
        "resumes it once from its checkpoint",
        f"GET /model_info weight_version of every engine{' of every node' if cluster.multi else ''} before job 1 and "
        "after each job; the checkpoint tracker "
        f"after each job; the report in {plan.report_path}",
        f"remove the rehearsal's checkpoint directory {plan.phases[0][1].checkpoint_dir} (the report stays)",
        *(_seven_b_steps(plan.seven_b) if plan.seven_b else []),
        "make down: the real run starts with `make up` of the real model",
    ]


def _seven_b_steps(seven: SevenB) -> list[str]:
    env = " ".join(f"{k}={v}" for k, v in seven.stack_env.items())
    added = seven.added_seconds["total"]
    return [
        f"the 7B's parts: make down, then make up again with {env} (the real run's model; its weights from `make "
        "model`)",
        f"the 7B's train-only step (launch-7b-step.sh): a synthetic rollout of {seven.prompts * seven.per_prompt} "
        f"samples x {seven.seq_tokens:,} tokens ({seven.prompts} group{'s' if seven.prompts != 1 else ''} of "
        f"{seven.per_prompt}, rewards 1 and 0) in "
        f"slime's --load-debug-rollout-data format, one step of {seven.model} under slime's debug-train-only (no "
        f"rollout servers, no weight update, no save), nvidia-smi sampling each trainer GPU every {GPU_SAMPLE_MS} "
        f"ms: the peak per rank against the estimate {seven.memory.trainer_gb:.1f} GB per trainer GPU",
        f"the 7B's reload: POST {seven.engine_url}/update_weights_from_disk model_path={seven.hf_checkpoint} "
        f"weight_version={SEVEN_B_RELOAD_VERSION} (the call slime's disk weight sync makes), then GET /model_info "
        "shows that version",
        f"the 7B's parts add about {added / 60:.0f} min (an estimate from sizes and stated rates, not measured) to "
        f"the {PREFLIGHT_GOAL_SECONDS // 60}-minute goal",
    ]


def _rollouts(plan: LaunchPlan) -> int:
    return int(plan.train_args[plan.train_args.index("--num-rollout") + 1])


def build(
    profile: Profile, *, cluster: Cluster, run_id: str | None = None, sets: list[str] | None = None
) -> PreflightPlan:
    """`cluster`: the nodes, as the caller resolved them (the site's: configs/cluster.env and the environment); at
    NODES>1 both jobs are the multi-node launch (polarstack.train.cluster_plan) and the steps add the nodes' checks and
    SHARED_DIR's proof."""
    rehearsal = copy.deepcopy(preflight_config())
    config = train_config(rehearsal, sets)
    # The real run's optimizer offload is rehearsed too (polarstack.train.memory): slime's offload flags change how the
    # optimizer steps and saves, and the small model alone would fit without them.
    if config["memory"]["optimizer_offload"] == "auto" and memory.check_up(profile, nodes=cluster.nodes).offload:
        config["memory"]["optimizer_offload"] = "on"
    run_id = run_id or f"preflight-{profile.name}-{time.strftime('%Y%m%dT%H%M%S')}"
    config["checkpoint"]["run_name"] = run_id  # a fresh checkpoint directory per rehearsal
    first, more = int(rehearsal["phases"]["first"]), int(rehearsal["phases"]["after_resume"])
    if first < 1 or more < 1:
        raise StackError(f"{PREFLIGHT_CONFIG}: phases.first and phases.after_resume must be >= 1.", ExitCode.USAGE)
    task = rehearsal["tasks"]["task"]
    ids = [str(i) for i in rehearsal["tasks"]["ids"]]
    needed = (first + more) * int(config["grpo"]["rollout_batch_size"])
    if len(ids) < needed:
        raise StackError(
            f"{PREFLIGHT_CONFIG}: {first + more} rollouts of rollout_batch_size "
            f"{config['grpo']['rollout_batch_size']} need {needed} task ids, tasks.ids has {len(ids)}.",
            ExitCode.USAGE,
        )
    model_path = config["model"]["hf_checkpoint"]
    check_task(task)  # configs/train/preflight.yaml's tasks.task, before the plans of both jobs
    phases = []
    for name, rollouts, resume in (("train", first, False), ("resume", first + more, True)):
        phase_config = copy.deepcopy(config)
        phase_config["grpo"]["num_rollout"] = rollouts
        plan = build_plan(
            task,
            profile,
            run_id=run_id,
            config=phase_config,
            model_path=model_path,
            served_model_name=config["model"]["name"],
            resume=resume,
            cluster=cluster,
        )
        phases.append((name, plan))
    tp = phases[0][1].tensor_parallel
    problems = batch_problems(profile, config, tp, nodes=cluster.nodes)
    # The 7B's parts on one node (the NODES>1 rehearsal proves the cluster; its 7B parts are not rendered there).
    seven = None if cluster.multi else seven_b(profile, run_id, cluster)
    if problems:
        raise StackError(f"the rehearsal's settings break a batch rule: {problems[0]}.", ExitCode.USAGE)
    run_dir = f"{TRAINER_RUN_DIR}/{run_id}"
    size = str(rehearsal["model"]["size"])
    plan = PreflightPlan(
        profile=profile.name,
        run_id=run_id,
        size=size,
        hub_name=str(rehearsal["model"]["hub_name"]),
        model=model_facts(config["model"]["args"]),
        task=task,
        task_ids=ids[:needed],
        phases=phases,
        stack_env={
            "MODEL_NAME": str(rehearsal["model"]["hub_name"]),
            "MODEL_PATH": model_path,
            "SERVED_MODEL_NAME": config["model"]["name"],
        },
        report_path=f".run/train/{run_id}/{REPORT_NAME}",
        summary_path=f"{run_dir}/{SUMMARY_NAME}",
        data_parallel=data_parallel_size(profile, tp, nodes=cluster.nodes),
        cluster=cluster,
        report_settings=dict(rehearsal.get("report") or {}),
        sets=list(sets or []),
        seven_b=seven,
    )
    if seven is not None:
        plan.files["launch-7b-step.sh"] = seven.script
    for name, phase in phases:
        for file_name, text in phase.files.items():
            target = f"launch-{name}.sh" if file_name == "launch.sh" else file_name
            if target in plan.files and plan.files[target] != text:
                raise StackError(f"internal: the rehearsal's jobs disagree on {file_name}.", ExitCode.INTERNAL)
            plan.files[target] = text
    return plan


def checks(plan: PreflightPlan) -> list[str]:
    """What verify-offline asks of the rehearsal beyond the main plan's checks (one sentence each)."""
    problems = []
    record = models_record()
    args = plan.phases[0][1].train_args
    expected = record["models"][f"qwen2.5-{plan.size}"]["args"]
    start = args.index("--swiglu") if "--swiglu" in args else -1
    if start < 0 or args[start : start + len(expected)] != expected:
        problems.append(
            f"the rehearsal's Megatron arguments are not slime's scripts/models/qwen2.5-{plan.size}.sh "
            f"({MODELS_RECORD})"
        )
    first, second = (p for _, p in plan.phases)
    if first.checkpoint_dir != second.checkpoint_dir or "--load" not in second.train_args:
        problems.append("the rehearsal's second job does not --load the first job's checkpoint directory")
    if "--save-interval" not in first.train_args:  # slime saves the last rollout only with an interval set
        problems.append("job 1 passes no --save-interval: slime would not save the checkpoint job 2 resumes")
    # slime restarts its weight-version counter in every job (slime/backends/megatron_utils/actor.py l.176,
    # update_weight_start_version defaults to 0) and updates once at start and after each rollout: job 1 ends at
    # 1 + first, job 2's first attempt at 1 + after_resume, and the report's weight_sync verdict tells them apart only if
    # they differ. (Job 2's restart by the supervisor, rehearsal_run, updates once at its start and trains nothing, so
    # the version read after job 2 is 1, apart from job 1's 1 + first >= 2 either way.)
    if _rollouts(first) == _rollouts(second) - _rollouts(first):
        problems.append(
            "phases.first equals phases.after_resume: the engines' weight_version would end both jobs alike"
        )
    if not _rollouts(second) > _rollouts(first):
        problems.append("the resumed job runs no rollout after the resume")
    if plan.seven_b is not None:
        problems += seven_b_problems(plan.seven_b)
    return problems


@dataclass(frozen=True)
class PreflightRequest:
    """What `polarstack preflight` was asked for its plan (its command-line options)."""

    profile: str | None = None  # default: the one `make up` recorded, else engine-direct
    sets: tuple[str, ...] = ()


def checked_plan(request: PreflightRequest, site: Resolved) -> tuple[Profile, PreflightPlan]:
    """The profile and the rehearsal's plan for `request`, refused (USAGE) with MODEL_DIR set (refuse_model_dir), for a
    diagnostic profile, or when the plan is inconsistent (checks). The profile: the one asked for, else the one the
    site's record names (`make up`'s), else engine-direct."""
    recorded = site.docker_record if not request.profile else None
    profile = profiles.load(request.profile or (recorded["profile"] if recorded else docker_state.DEFAULT_PROFILE))
    refuse_model_dir()
    if profile.expect != "pass":
        raise StackError(
            f"profile {profile.name} is diagnostic (its smoke fails by design); rehearse a working profile.",
            ExitCode.USAGE,
        )
    plan = build(profile, sets=list(request.sets), cluster=site.cluster)
    problems = checks(plan)
    if problems:
        raise StackError(f"the rehearsal's plan is inconsistent: {problems[0]}.", ExitCode.USAGE)
    return profile, plan


def refuse_model_dir() -> None:
    """MODEL_DIR binds the host's weights at MODEL_PATH for `make up`, and `make model` downloads nothing while it is
    set: the rehearsal's engines would load them (the 7B) where the small model belongs (issue 26 point 6)."""
    host = assets.model_dir()
    if host is not None:
        raise StackError(
            f"make preflight rehearses with the small model from the models volume, but MODEL_DIR={host} would mount "
            "the host's weights in its place and make model would not download it: unset MODEL_DIR for make "
            "preflight and its make model, and set it again for make up and make train.",
            ExitCode.USAGE,
        )


KEYS_RECORD = "configs/upstream/rehearsal-keys.json"


def seven_b_problems(seven: SevenB, keys: dict[str, Any] | None = None) -> list[str]:
    """The 7B's train-only step means what slime's recorded lines say (rehearsal-keys.json slime facts): the path
    slime formats with the rollout id, the flag that turns on debug-train-only (no rollout servers, no weight update),
    no --save-interval (no save), no Polar rollout; the synthetic file in the format Sample.from_dict reads, with the
    sample count group normalisation needs; the step's batch on Megatron's rule."""
    keys = keys or json.loads((repo_root() / KEYS_RECORD).read_text())
    facts, problems = keys["slime"]["facts"], []
    args = seven.train_args
    flag = facts["debug_load_skips_sglang"]["key"]
    if "load_debug_rollout_data" not in facts["debug_load_skips_sglang"]["text"] or not re.search(
        r"debug_train_only = True", facts["debug_load_sets_train_only"]["text"]
    ):
        problems.append(f"slime's {flag} no longer turns on debug-train-only ({KEYS_RECORD})")
    if flag not in args:
        problems.append(f"the 7B's step does not pass {flag}: it would start rollout servers and generate")
    else:
        path = args[args.index(flag) + 1]
        placeholder = facts["debug_load_path_format"]["key"]
        if placeholder not in path or ".format(rollout_id=" not in facts["debug_load_path_format"]["text"]:
            problems.append(f"the 7B's step's {flag} {path} lacks slime's {placeholder} (rollout.py formats it)")
    for dropped in ("--save-interval", "--rollout-function-path", "--custom-reward-post-process-path"):
        if dropped in args:
            problems.append(f"the 7B's step passes {dropped}: it would save a 7B checkpoint or call Polar")
    if facts["no_interval_no_save"]["text"] != "if interval is None:":
        problems.append("slime saves without --save-interval now: the 7B's step would write a checkpoint")
    for fact, needed, meaning in (
        ("debug_train_only_no_rollout_gpus", "return actor_num_gpus, 0", "takes no rollout GPUs"),
        ("debug_train_only_no_weight_update", "self.args.debug_train_only", "skips the weight update"),
        ("debug_load_from_dict", "Sample.from_dict(sample)", "builds each sample with Sample.from_dict"),
        (
            "group_norm_needs_full_rollout",
            "n_samples_per_prompt * self.args.rollout_batch_size",
            "normalises per group",
        ),
        ("disk_reload_calls_engine", "update_weights_from_disk", "reloads the engines by update_weights_from_disk"),
    ):
        if needed not in facts[fact]["text"]:
            problems.append(f"slime no longer {meaning} ({facts[fact]['file']} l.{facts[fact]['line']}, {KEYS_RECORD})")
    value = lambda name: int(args[args.index(name) + 1])  # noqa: E731
    count = value("--n-samples-per-prompt") * value("--rollout-batch-size")
    data = {
        "rollout_id": 0,
        "samples": synthetic_rollout.samples(
            prompts=seven.prompts,
            per_prompt=seven.per_prompt,
            seq_tokens=seven.seq_tokens,
            prompt_tokens=seven.prompt_tokens,
        ),
    }
    if facts["debug_load_samples_key"]["key"] not in data:
        problems.append(
            f"slime reads the file's {facts['debug_load_samples_key']['key']!r}, the rehearsal writes others"
        )
    vocab = int(args[args.index("--vocab-size") + 1])
    problems += [
        f"the synthetic rollout: {p}"
        for p in synthetic_rollout.format_problems(
            data, keys["slime"]["sample"], count=count, seq_tokens=seven.seq_tokens, vocab=vocab
        )
    ]
    if seven.seq_tokens > value("--max-tokens-per-gpu"):
        problems.append("a synthetic trace is longer than --max-tokens-per-gpu: no micro-batch could hold it")
    if value("--global-batch-size") != count:
        problems.append("the 7B's step's global batch is not the synthetic rollout's sample count (one step)")
    return problems


__all__ = [
    "build",
    "checks",
    "checked_plan",
    "batch_problems",
    "PreflightPlan",
    "PreflightRequest",
    "refuse_model_dir",
    "slime_model_args",
]
