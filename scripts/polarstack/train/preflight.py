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
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from polarstack.errors import ExitCode, StackError
from polarstack.paths import configs_dir, repo_root
from polarstack.pins import pins
from polarstack.stack import cluster as cluster_mod
from polarstack.stack.cluster import Cluster
from polarstack.stack.profiles import Profile
from polarstack.train import memory
from polarstack.train.model_size import model_facts
from polarstack.train.plan import TRAINER_RUN_DIR, LaunchPlan, build_plan, load_defaults

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
        "make down: the real run starts with `make up` of the real model",
    ]


def _rollouts(plan: LaunchPlan) -> int:
    return int(plan.train_args[plan.train_args.index("--num-rollout") + 1])


def build(
    profile: Profile, *, run_id: str | None = None, sets: list[str] | None = None, cluster: Cluster | None = None
) -> PreflightPlan:
    """`cluster`: the nodes (default: configs/cluster.env and the environment); at NODES>1 both jobs are the
    multi-node launch (polarstack.train.cluster_plan) and the steps add the nodes' checks and SHARED_DIR's proof."""
    cluster = cluster if cluster is not None else cluster_mod.load()
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
    )
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
    return problems


__all__ = ["build", "checks", "batch_problems", "model_facts", "PreflightPlan", "slime_model_args"]
