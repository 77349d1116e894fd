"""`make train TASK=humaneval|mbpp`: render, validate and (behind the smoke gate) launch GRPO with Polar on slime.

The launch follows ../shared/reference/slime.md ("A 4-GPU, one-node GRPO launch") and Polar's swegym example:
a Ray head on 127.0.0.1, Polar's rollout server and gateway (topology.yaml points the gateway at the profile's
base URL), and `ray job submit ... train_async.py` with external engines, the profile's router arguments,
Polar's rollout function behind this project's gate, Polar's reward hooks, and GRPO settings.
"""

from __future__ import annotations

import copy
import json
import math
import shlex
from dataclasses import dataclass, field, replace
from typing import Any

import yaml

from polarstack.checks import budget, tool_exchange
from polarstack.errors import ExitCode, StackError
from polarstack.paths import TRAINER_RUN_DIR, load_defaults
from polarstack.polar import harness_preset
from polarstack.reward.tasks import TASKS, polar_config
from polarstack.stack import cluster as cluster_mod
from polarstack.stack import ports, verifier_knobs
from polarstack.stack.assets import sandbox_mode_env
from polarstack.stack.cluster import Cluster
from polarstack.stack.exposure import SLIME_ROUTER_ARGS
from polarstack.stack.profiles import WEIGHT_SYNC_TRANSPORTS, Profile
from polarstack.stack.ray_head import head_command, object_store_bytes
from polarstack.train import batch_layout, cluster_plan, control_plane, memory, retention, rollout_cost, step_cost
from polarstack.train.ray_job import SUBMISSION_ID
from polarstack.train.tracker import tracker_for

SLIME_DIR = "/root/slime"


@dataclass
class LaunchPlan:
    task: str
    profile: str
    run_id: str
    tensor_parallel: int
    trainer_gpus: list[int]
    base_url: str
    commands: list[list[str]] = field(default_factory=list)
    files: dict[str, str] = field(default_factory=dict)
    train_args: list[str] = field(default_factory=list)
    checkpoint_dir: str = ""  # --save (and --load when resuming): stable across runs of one run name
    resume: bool = False
    cost: rollout_cost.Estimate | None = None  # traces and tokens per rollout, estimated from the plan
    memory: memory.MemoryPlan | None = None  # per GPU and per host, term by term (polarstack.train.memory)
    step: step_cost.StepCost | None = None  # memory and computed time per step (polarstack.train.step_cost)
    config: dict[str, Any] = field(default_factory=dict, repr=False)  # the merged configuration the plan rendered
    cluster: Cluster = field(default=cluster_mod.SINGLE, repr=False)  # the nodes it runs on (polarstack.stack.cluster)
    nodes: list[cluster_mod.NodeLayout] = field(default_factory=list, repr=False)  # what each node runs (NODES>1)

    @property
    def run_dir(self) -> str:
        """The run's directory as the trainer sees it (the host's .run/train/<run>)."""
        return f"{TRAINER_RUN_DIR}/{self.run_id}"

    def as_dict(self) -> dict[str, Any]:
        # The single-node plan's keys are as they always were; the cluster's block appears at NODES>1 only.
        multi = {"cluster": cluster_plan.as_dict(self.cluster, self.nodes)} if self.cluster.multi else {}
        return {
            "task": self.task,
            "profile": self.profile,
            "run_id": self.run_id,
            "tensor_model_parallel_size": self.tensor_parallel,
            "trainer_gpus": self.trainer_gpus,
            "base_url": self.base_url,
            "commands": [shlex.join(c) for c in self.commands],
            "files": self.files,
            "checkpoint_dir": self.checkpoint_dir,
            "resume": self.resume,
            "cost_per_rollout": self.cost.as_dict() if self.cost else None,
            "memory": self.memory.as_dict() if self.memory else None,
            "cost_per_step": self.step.as_dict() if self.step else None,
            "watch": watch_lines(self),
            **multi,
        }


# Values rendered into train_async.py's command line, checked before anything else reads them: a `--set` such as
# grpo.rollout_max_response_len=abc must end as USAGE with the key named, not as an internal error later.
POSITIVE_INTS = {
    "grpo": (
        "n_samples_per_prompt",
        "rollout_batch_size",
        "global_batch_size",
        "num_rollout",
        "rollout_max_response_len",
        "rollout_max_prompt_len",
        "max_tokens_per_gpu",
    ),
    "context": ("seq_length", "model_context_length"),
    "checkpoint": ("save_interval",),
    "polar": ("rollout_port", "gateway_port", "max_init_workers", "max_run_workers", "max_postrun_workers"),
}
NON_NEGATIVE_INTS = {
    "context": (
        "harness_margin_tokens",
        "agent_max_output_tokens",
        "agent_bash_output_chars",
        "tool_output_tokens_per_turn",
    ),
    "gate": ("zero_advantage_rollouts",),
    "supervise": ("max_restarts",),
    "checkpoint": ("keep_last",),
}
FINITE_NUMBERS = {"grpo": ("lr", "kl_loss_coef", "eps_clip", "eps_clip_high"), "gate": ("zero_advantage_warn_share",)}


def _check_types(config: dict[str, Any]) -> None:
    def bad(section: str, key: str, value: Any, what: str) -> StackError:
        return StackError(
            f"{section}.{key}={value!r} must be {what} (configs/train/defaults.yaml or --set).", ExitCode.USAGE
        )

    for table, what, ok in (
        (POSITIVE_INTS, "a positive integer", lambda v: v > 0),
        (NON_NEGATIVE_INTS, "a non-negative integer", lambda v: v >= 0),
    ):
        for section, keys in table.items():
            for key in keys:
                if key not in (config.get(section) or {}):
                    continue
                value = config[section][key]
                if not isinstance(value, int) or isinstance(value, bool) or not ok(value):
                    raise bad(section, key, value, what)
    for section, keys in FINITE_NUMBERS.items():
        for key in keys:
            value = (config.get(section) or {}).get(key)
            if key in (config.get(section) or {}) and (
                not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value)
            ):
                raise bad(section, key, value, "a finite number")
    for port_key in ("rollout_port", "gateway_port"):
        port = config["polar"][port_key]
        if port > 65535:
            raise bad("polar", port_key, port, "a TCP port (1-65535)")


def _int(config: dict[str, Any], section: str, key: str) -> int:
    value = config[section][key]
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise StackError(
            f"{section}.{key}={value!r} must be a positive integer (configs/train/defaults.yaml).", ExitCode.USAGE
        )
    return value


def check_task(task: str) -> None:
    """The one check of a plan's task (make train's TASK, the rehearsal's tasks.task), made by whoever asks for the plan
    before anything else: `polarstack train` (train/launch.py) and `make preflight` (train/preflight.py)."""
    if task not in TASKS:
        raise StackError(f"unknown task {task!r}; choose one of {', '.join(TASKS)}.", ExitCode.USAGE)


def validate(task: str, profile: Profile, config: dict[str, Any], model_path: str | None, nodes: int = 1) -> int:
    """Refuse, with one sentence each, what would fail or silently mistrain on the GPU node. Returns TP.
    `nodes`: every node runs len(TRAINER_GPUS) trainer ranks, so data parallelism is nodes x GPUs / TP.
    `task` was checked by the plan's caller (check_task)."""
    model = model_path if model_path is not None else config["model"].get("hf_checkpoint")
    if not model:
        raise StackError(
            "no model path: set MODEL_PATH (configs/stack.env) or model.hf_checkpoint in configs/train/defaults.yaml.",
            ExitCode.USAGE,
        )
    if not str(model).startswith("/"):
        raise StackError(
            f"model path {model!r} must be an absolute path inside the trainer (the models volume is "
            "mounted at /models).",
            ExitCode.USAGE,
        )
    _check_types(config)
    collisions = ports.problems(profile, config["polar"])  # Polar's ports against the node's and Ray's (issue 34)
    if collisions:
        raise StackError(f"{collisions[0]} (configs/train/defaults.yaml or --set).", ExitCode.USAGE)
    gpus = profile.trainer_gpus
    section = config["parallel"].get(profile.name) or config["parallel"]["default"]
    tp = section["tensor_model_parallel_size"]
    groups = _int(config, "model", "num_query_groups")
    if not isinstance(tp, int) or tp <= 0:
        raise StackError(f"tensor_model_parallel_size={tp!r} must be a positive integer.", ExitCode.USAGE)
    if groups % tp:
        raise StackError(
            f"tensor-parallel size {tp} does not divide {config['model']['name']}'s {groups} query "
            f"groups; use one of {', '.join(str(d) for d in range(1, groups + 1) if groups % d == 0)}.",
            ExitCode.USAGE,
        )
    if len(gpus) % tp:
        raise StackError(
            f"tensor-parallel size {tp} does not divide the {len(gpus)} trainer GPU(s) of profile "
            f"{profile.name} (TRAINER_GPUS={','.join(map(str, gpus))}).",
            ExitCode.USAGE,
        )
    n = _int(config, "grpo", "n_samples_per_prompt")
    rollout = _int(config, "grpo", "rollout_batch_size")
    batch = _int(config, "grpo", "global_batch_size")
    if n < 2:
        raise StackError(
            f"n_samples_per_prompt={n}: GRPO needs at least 2 samples per prompt to compare them.", ExitCode.USAGE
        )
    if batch % n:
        raise StackError(
            f"global_batch_size={batch} is not a multiple of n_samples_per_prompt={n}: a training "
            "batch would split a GRPO group.",
            ExitCode.USAGE,
        )
    if (rollout * n) % batch:
        raise StackError(
            f"rollout_batch_size x n_samples_per_prompt = {rollout * n} is not a multiple of "
            f"global_batch_size={batch}; slime's GRPO normalization reshapes by group only when the "
            "sample count equals n x rollout_batch_size, and would treat the batch as one group.",
            ExitCode.USAGE,
        )
    # Megatron's micro-batch calculator and slime's step split (polarstack.train.batch_layout, configs/upstream/batch-rules.json)
    layout = batch_layout.Layout(
        n, rollout, batch, batch_layout.micro_batch_default(), batch_layout.data_parallel_size(nodes * len(gpus), tp)
    )
    broken = batch_layout.problems(layout)
    if broken:
        where = f"{len(gpus)} trainer GPUs" if nodes == 1 else f"{nodes} nodes x {len(gpus)} trainer GPUs"
        raise StackError(
            f"profile {profile.name} (TP {tp} on {where}): {broken[0]}; a valid choice: "
            f'SET="{batch_layout.valid_choice(layout)}".',
            ExitCode.USAGE,
        )
    return tp


def topology(
    profile: Profile, config: dict[str, Any], model_name: str, host: str = "127.0.0.1", router_host: str | None = None
) -> dict[str, Any]:
    """Polar's topology.yaml: its rollout server and gateway on `host` (127.0.0.1 on every node count:
    cluster_plan.polar_host), its inference base URL the router (or engine-0) on `router_host` (the head's cluster
    address at NODES>1; `host` when not given)."""
    polar = config["polar"]
    router_host = router_host or host
    return {
        "rollout": {
            "host": host,
            "port": polar["rollout_port"],
            "public_url": f"http://{host}:{polar['rollout_port']}",
            "save_dir": cluster_plan.POLAR_RESULTS_DIR,
        },
        "gateway": {
            "heartbeat_interval_seconds": 30,
            "nodes": [
                {
                    "id": polar["node_id"],
                    "host": host,
                    "port": polar["gateway_port"],
                    "public_url": f"http://{host}:{polar['gateway_port']}",
                    "max_init_workers": polar["max_init_workers"],
                    "max_run_workers": polar["max_run_workers"],
                    "max_postrun_workers": polar["max_postrun_workers"],
                    "model_served": model_name,
                    # Polar's inference base URL: the router, or engine-0 for engine-direct (SGLANG_ROUTER_BASE_URL).
                    "inference": {"engine": "sglang", "base_url": profile.base_url(router_host)},
                }
            ],
        },
    }


def checkpoint_dir(task: str, profile: Profile, config: dict[str, Any]) -> str:
    """Where this run saves (and a resume loads): model.save/<checkpoint.run_name or task-profile>."""
    name = str((config.get("checkpoint") or {}).get("run_name") or f"{task}-{profile.name}")
    if "/" in name or name in (".", ".."):
        raise StackError(f"checkpoint.run_name={name!r} must be a plain directory name.", ExitCode.USAGE)
    return f"{config['model']['save']}/{name}"


def hygiene_args(config: dict[str, Any], ckpt: str, resume: bool) -> list[str]:
    """--save-interval, dropout 0.0 and (RESUME=1) --load of the run's own checkpoint directory."""
    if "save_interval" not in (config.get("checkpoint") or {}):
        raise StackError(
            "checkpoint.save_interval is missing from configs/train/defaults.yaml; without it slime "
            "v0.3.1 never saves a checkpoint.",
            ExitCode.USAGE,
        )
    interval = _int(config, "checkpoint", "save_interval")
    training = config.get("training") or {}
    args = [
        "--save-interval",
        str(interval),
        "--attention-dropout",
        str(float(training.get("attention_dropout", 0.0))),
        "--hidden-dropout",
        str(float(training.get("hidden_dropout", 0.0))),
    ]
    if resume:
        # slime v0.3.1 (slime/utils/arguments.py ~l.1759-1779): a --load without latest_checkpointed_iteration.txt
        # silently falls back to --ref-load at rollout 0, so launch.sh refuses that case before submitting.
        args += ["--load", ckpt]
    return args


def weight_sync_args(profile: Profile, cluster: Cluster = cluster_mod.SINGLE) -> list[str]:
    """How slime sends weights to the external engines (WEIGHT_SYNC_TRANSPORT; docs/gpu-facts.md).

    disk: slime v0.3.1 UpdateWeightFromDisk writes an HF checkpoint to <dir>/weight_vNNNNNN and RayTrainGroup
    `_reload_rollout_weights_from_disk` asks each engine to `update_weights_from_disk` that same path, so the
    directory must be a volume mounted at the same path in trainer and engines (compose.yaml `weight-updates`).
    nccl: slime's default; trainer and engines join one NCCL group (UpdateWeightFromDistributed).
    At NODES>1 the disk directory is SHARED_DIR/weight-updates (polarstack.train.cluster_plan.weight_update_dir):
    refused without SHARED_DIR, since every node writes part of each copy and every engine reads all of it."""

    transport = profile.setting("WEIGHT_SYNC_TRANSPORT") or "disk"
    if transport not in WEIGHT_SYNC_TRANSPORTS:
        raise StackError(
            f"WEIGHT_SYNC_TRANSPORT={transport} must be one of {', '.join(WEIGHT_SYNC_TRANSPORTS)} "
            "(configs/stack.env or the profile).",
            ExitCode.USAGE,
        )
    if transport == "disk":
        return [
            "--update-weight-mode",
            "full",
            "--update-weight-transport",
            "disk",
            "--update-weight-disk-dir",
            cluster_plan.weight_update_dir(cluster, profile.setting("WEIGHT_UPDATE_DIR") or "/shared/weight-updates"),
        ]
    return ["--update-weight-mode", "full", "--update-weight-transport", "nccl"]


def weight_sync_on_disk(train_args: list[str]) -> bool:
    """Whether slime's weight sync writes its HF copy to disk (weight_sync_args: --update-weight-transport disk)."""
    flag = "--update-weight-transport"
    return flag in train_args and train_args[train_args.index(flag) + 1] == "disk"


def watch_lines(plan: LaunchPlan) -> list[str]:
    """What only the GPU node can confirm, and where to look (printed by `make train`)."""
    args = plan.train_args
    transport = args[args.index("--update-weight-transport") + 1] if "--update-weight-transport" in args else "nccl"
    return [
        "tool calls: the smoke's tool request passed; in Polar's rollouts look for tool_use blocks and nonzero "
        "polar/reward_mean (all-zero rewards mean the agent never acted).",
        f"weight sync ({transport}): "
        + (
            "after each update the engines log 'Start update_weights. Load format=...' (sglang tokenizer_manager "
            "update_weights_from_disk) for weight_vNNNNNN under --update-weight-disk-dir, and GET /model_info shows "
            "weight_version N (slime passes the version)."
            if transport == "disk"
            else "the trainer and engines form an NCCL group (init_weights_update_group); not confirmed across "
            "containers here: look for NCCL errors in the engine and trainer logs at the first update."
        ),
        f"checkpoints: {plan.checkpoint_dir}/latest_checkpointed_iteration.txt appears after the first save "
        f"(every --save-interval rollouts); `make train RESUME=1` continues from it.",
        *([retention.sentence(plan.config)] if plan.config else []),
        "bridge data source: slime's RolloutDataSourceWithBuffer; Polar's polar/reservations/* metrics stay absent "
        "(no at-least-once replay of in-flight groups on resume).",
        *([plan.cost.sentence()] if plan.cost else []),
        *([plan.step.sentence()] if plan.step else []),
        *_turn_cap_line(plan),
        *_cluster_lines(plan),
    ]


def _cluster_lines(plan: LaunchPlan) -> list[str]:
    """At NODES>1: what only the nodes confirm (argued from source here; docs/multi-node.md)."""
    cluster = plan.cluster
    if not cluster.multi:
        return []
    return [
        f"nodes: `ray status` on the head lists {cluster.nodes} nodes and {cluster.nodes * len(plan.trainer_gpus)} "
        f"trainer GPUs; slime logs one placement-group bundle per trainer GPU with its node address; Megatron's rank 0 "
        "(MASTER_ADDR, its TCPStore on every interface) is on the node whose address sorts first.",
        f"NCCL over {cluster.iface}: the trainer's log shows NCCL INFO lines naming {cluster.iface} (NCCL_DEBUG=INFO); "
        "a hang at the first all-reduce across nodes means a firewall between the nodes on the ports NCCL picks.",
    ]


def _turn_cap_line(plan: LaunchPlan) -> list[str]:
    """The per-session turn cap the task template carries (issue 26 point 4), and where the node shows its effect."""
    agent = (yaml.safe_load(plan.files.get("polar_config.yaml") or "{}") or {}).get("polar_task_template") or {}
    cap = ((agent.get("agent") or {}).get("settings") or {}).get("max_turns")
    if not cap:
        return []
    return [
        f"sessions: at most {cap} turns each (agent.settings.max_turns, the agent CLI's --max-turns: one request per "
        "turn, measured), chosen so the last request still fits the engine context when every turn writes the "
        "per-request max_tokens and one tool result of context.tool_output_tokens_per_turn (Bash output cut by "
        "BASH_MAX_OUTPUT_LENGTH; polarstack.checks.budget.turn_cap; a Read result is not bounded); the share of "
        "sessions that still ended at the context is polarstack/sessions_at_context_limit_share, and the gate warns "
        "above 10%."
    ]


def ray_dashboard_port(profile: Profile, config: dict[str, Any]) -> int:
    """The port of the trainer's Ray dashboard (its jobs API): the RAY_DASHBOARD_PORT knob compose.yaml gives `ray start
    --dashboard-port` (the profile's stack setting, resolved when it loaded: Profile.setting), else
    configs/train/defaults.yaml's ray.dashboard_port. One number for the head, the submit, the active-job check and the
    stop, so moving the knob (make up's port check names it) moves them all."""
    value = profile.setting("RAY_DASHBOARD_PORT").strip()
    return int(value) if value.isdigit() else int(config["ray"]["dashboard_port"])


def build_plan(
    task: str,
    profile: Profile,
    *,
    run_id: str,
    config: dict[str, Any] | None = None,
    model_path: str | None = None,
    served_model_name: str | None = None,
    resume: bool = False,
    capacity: memory.Capacity | None = None,
    cluster: Cluster,
) -> LaunchPlan:
    """The launch of `task` (one of TASKS: check_task) on `profile`, decided in the stages below, in this order: the
    cluster's layout, the merged configuration (validated), Polar's two files, slime's arguments, the trace budget and
    the memory plan, the four commands, and launch.sh. resume_variant derives the same run resumed from the plan.
    `capacity`: the node's memory (default: nvidia-smi and /proc/meminfo, else GPU_MEMORY_GB; polarstack.train.memory).
    `cluster`: the nodes, as the caller resolved them (the site's: configs/cluster.env and the environment,
    polarstack.stack.cluster.load); at NODES>1 polarstack.train.cluster_plan says what changes. engine-direct is refused
    there before anything renders."""
    nodes = cluster_layout(profile, cluster)
    config, tp = run_config(task, profile, config, model_path, cluster)
    ckpt = checkpoint_dir(task, profile, config)
    base_url = profile.base_url(cluster.head_addr)  # the router (or engine-0) on the head's address
    plan = LaunchPlan(
        task, profile.name, run_id, tp, profile.trainer_gpus, base_url, checkpoint_dir=ckpt, resume=resume
    )
    plan.config = config
    plan.cluster = cluster
    plan.nodes = nodes
    served = served_model_name or config["model"]["name"]
    host = cluster_plan.polar_host(cluster)  # Polar's servers: on the head, where every client of theirs runs
    plan.files["polar_config.yaml"] = polar_config_yaml(plan, profile, served)
    plan.files["topology.yaml"] = yaml.safe_dump(
        topology(profile, config, served, host, cluster.head_addr), sort_keys=False
    )
    plan.train_args, tracker_env = slime_args(plan, profile, model_path or config["model"]["hf_checkpoint"])
    fit_budget_and_memory(plan, profile, capacity)
    plan.commands = job_commands(plan, profile, tracker_env)
    plan.files["launch.sh"] = launch_script(plan, plan.run_dir, config)
    return plan


def resume_variant(plan: LaunchPlan) -> LaunchPlan:
    """The same plan resumed: what build_plan renders with resume=True from the same inputs, derived from `plan`
    without deciding anything again. launch-resume.sh, which a restart from the last checkpoint runs
    (polarstack.train.supervise), is its launch.sh. Only the save hygiene (hygiene_args: RESUME adds slime's --load of
    the run's checkpoint directory) and launch.sh's checkpoint guard depend on resume; a resumed plan is its own."""
    if plan.resume:
        return plan
    fresh = hygiene_args(plan.config, plan.checkpoint_dir, False)
    at = plan.train_args.index("--save") + 2  # checkpoint_args: --save <dir>, then the hygiene arguments
    submit = plan.commands[-1]
    if (
        plan.train_args[at : at + len(fresh)] != fresh
        or submit[len(submit) - len(plan.train_args) :] != plan.train_args
    ):
        raise StackError(f"internal: the plan of run {plan.run_id} cannot be resumed as rendered.", ExitCode.INTERNAL)
    train_args = [
        *plan.train_args[:at],
        *hygiene_args(plan.config, plan.checkpoint_dir, True),
        *plan.train_args[at + len(fresh) :],
    ]
    resumed = replace(
        plan,
        resume=True,
        train_args=train_args,
        commands=[*plan.commands[:-1], [*submit[: len(submit) - len(plan.train_args)], *train_args]],
        files=dict(plan.files),
    )
    resumed.files["launch.sh"] = launch_script(resumed, resumed.run_dir, resumed.config)
    return resumed


def cluster_layout(profile: Profile, cluster: Cluster) -> list[cluster_mod.NodeLayout]:
    """What each node runs (NODES>1; none on one node), after refusing what the cluster cannot run: the profile
    (engine-direct at NODES>1) and, at NODES>1, the storage without SHARED_DIR (cluster_plan.check_storage)."""
    refused = cluster_mod.refusal(profile, cluster)
    if refused:
        raise StackError(refused, ExitCode.USAGE)
    nodes = cluster_mod.layout(profile, cluster) if cluster.multi else []
    cluster_plan.check_storage(cluster, profile.setting("WEIGHT_SYNC_TRANSPORT") or "disk")
    return nodes


def run_config(
    task: str, profile: Profile, config: dict[str, Any] | None, model_path: str | None, cluster: Cluster
) -> tuple[dict[str, Any], int]:
    """The merged configuration the plan renders (a copy: configs/train/defaults.yaml when none is given), with the
    Ray dashboard's port and the checkpoints' root decided, validated (validate); and the tensor-parallel size."""
    config = copy.deepcopy(config or load_defaults())
    config["ray"]["dashboard_port"] = ray_dashboard_port(profile, config)
    tp = validate(task, profile, config, model_path, nodes=cluster.nodes)
    # At NODES>1 the checkpoints (and the TensorBoard files beside them) are on SHARED_DIR (cluster_plan).
    config["model"]["save"] = cluster_plan.checkpoint_root(cluster, str(config["model"]["save"]))
    return config, tp


def polar_config_yaml(plan: LaunchPlan, profile: Profile, served: str) -> str:
    """polar_config.yaml: the task's Polar config (polarstack.reward.tasks.polar_config) with Polar's addresses, the
    in-job gate's settings (polar_gate_*), the verifier's knobs, and the agent's output-token and turn caps."""
    config, run_dir = plan.config, plan.run_dir
    host = cluster_plan.polar_host(plan.cluster)
    gate = config["gate"]
    polar_values = {
        "polar_rollout_url": f"http://{host}:{config['polar']['rollout_port']}",
        "polar_gateway_url": f"http://{host}:{config['polar']['gateway_port']}",
        "polar_served_model_name": served,
        # Read by polarstack.train.gate (the rollout-function wrapper) inside the job.
        "polar_gate_base_url": plan.base_url,
        "polar_gate_route": profile.route,
        "polar_gate_max_zero_token_groups": gate["max_zero_token_groups"],
        "polar_gate_delegate": gate["delegate"],
        "polar_gate_watchdog_seconds": gate["watchdog_seconds"],
        "polar_gate_zero_reward_rollouts": gate["zero_reward_rollouts"],
        "polar_gate_allow_retokenized": gate["allow_retokenized"],
        "polar_gate_abort_file": f"{run_dir}/gate-abort.txt",  # `polarstack train` reports the watchdog's sentence
        # The learning signal per rollout (polarstack.train.learning_signal): rollouts.jsonl, the zero-advantage watch.
        "polar_gate_summary_file": f"{run_dir}/rollouts.jsonl",
        "polar_gate_zero_advantage_rollouts": gate["zero_advantage_rollouts"],
        "polar_gate_zero_advantage_warn_share": gate["zero_advantage_warn_share"],
    }
    polar = polar_config(plan.task, f"{run_dir}/tasks", polar_values)
    # The verifier's knobs reach Polar's test_command: Polar passes runtime.env as `env K=V` into every command of the
    # sandbox (polarstack.stack.verifier_knobs; the same values in launch.sh and the Ray job's env below).
    polar["polar_task_template"]["runtime"].setdefault("env", {}).update(verifier_knobs.verifier_env())
    # The agent's output-token cap (polarstack.checks.budget): Polar's claude_code preset hands agent.env to the CLI.
    polar["polar_task_template"]["agent"].setdefault("env", {}).update(budget.agent_env(config))
    # A preset that checks the CLI version must be told AGENT_CLI_VERSION (polarstack.polar.harness_preset; claude_code: none).
    agent_settings = dict(harness_preset.settings_for(polar["polar_task_template"]["agent"]["harness"]))
    turn_cap = budget.turn_cap(config)
    # The per-session turn cap chosen from the budget (issue 26 point 4): the preset's max_turns, the CLI's --max-turns.
    agent_settings.update(harness_preset.turn_cap_settings(polar["polar_task_template"]["agent"]["harness"], turn_cap))
    if agent_settings:
        polar["polar_task_template"]["agent"].setdefault("settings", {}).update(agent_settings)
    return yaml.safe_dump(polar, sort_keys=False)


def slime_args(plan: LaunchPlan, profile: Profile, hf: str) -> tuple[list[str], dict[str, str]]:
    """train_async.py's arguments before the memory plan's (fit_budget_and_memory adds those), and the tracker's
    environment for the Ray job (W&B or TensorBoard, polarstack.train.tracker). `hf`: the model's weights."""
    args = [
        *placement_args(profile, plan.cluster),
        *checkpoint_args(plan, profile, hf),
        *data_args(plan.run_dir),
        *grpo_args(plan.config, plan.tensor_parallel),
    ]
    # slime starts its own router (polarstack/stack/exposure.py): its metrics stay on loopback
    if profile.registration != "register":
        args += SLIME_ROUTER_ARGS
    _, tracker_args, tracker_env = tracker_for(plan.checkpoint_dir.rsplit("/", 1)[-1], plan.config["model"]["save"])
    return args + tracker_args, tracker_env


def placement_args(profile: Profile, cluster: Cluster) -> list[str]:
    """Where the trainer's ranks go and which engines (and router) slime talks to."""
    # Every engine of every node by the address the others reach it by (127.0.0.1 on one node): slime registers each
    # with the router under exactly this address (sglang_engine.py _register_to_router).
    engines = [url.removeprefix("http://") for url in cluster_mod.engine_urls(profile, cluster)]
    args = [
        # slime's placement group spreads NODES x len(TRAINER_GPUS) bundles over the nodes (PACK: each node's Ray
        # offers its trainer GPUs only), ranks sorted by node address then GPU (slime/ray/placement_group.py).
        "--actor-num-nodes",
        str(cluster.nodes),
        "--actor-num-gpus-per-node",
        str(len(profile.trainer_gpus)),
        "--num-gpus-per-node",
        "4",
        "--rollout-external-engine-addrs",
        *engines,
    ]
    if profile.registration == "register":  # slime registers the engines with this router (POST /workers)
        args += ["--sglang-router-ip", cluster.head_addr, "--sglang-router-port", str(profile.router_port)]
    return args


def checkpoint_args(plan: LaunchPlan, profile: Profile, hf: str) -> list[str]:
    """The weights slime loads and saves (RESUME: --load of the run's own checkpoint directory), how it sends them to
    the engines, and the model's Megatron arguments."""
    model = plan.config["model"]
    return [
        "--hf-checkpoint",
        hf,
        "--ref-load",
        model.get("ref_load") or hf,
        "--save",
        plan.checkpoint_dir,
        *hygiene_args(plan.config, plan.checkpoint_dir, plan.resume),
        *weight_sync_args(profile, plan.cluster),
        *[str(a) for a in model["args"]],
    ]


def data_args(run_dir: str) -> list[str]:
    """The prompts slime reads and the hooks it calls: Polar's rollout function behind the gate, the reward hooks."""
    return [
        "--prompt-data",
        f"{run_dir}/tasks/train.jsonl",
        "--input-key",
        "prompt",
        "--label-key",
        "label",
        "--metadata-key",
        "metadata",
        "--reward-key",
        "score",
        "--rollout-function-path",
        "polarstack.train.gate.generate_rollout_gated",
        "--custom-rm-path",
        "slime_bridge.reward.reward_func",
        "--custom-reward-post-process-path",
        "slime_bridge.reward_post_process.post_process_rewards",
        # No --data-source-path: Polar's CeilEpochRolloutDataSourceWithBuffer needs slime API that slime v0.3.1 lacks
        # (_state_lock, ...; configs/upstream/polar-bridge.json, slime-api.json). slime's default
        # RolloutDataSourceWithBuffer has no get_samples_with_reservation, so Polar's worker
        # (rollout.py AsyncPolarRolloutWorker._next_group_for_submission) falls back to get_samples(1).
        "--custom-config-path",
        f"{run_dir}/polar_config.yaml",
    ]


def grpo_args(config: dict[str, Any], tp: int) -> list[str]:
    """GRPO's settings, the optimizer, the parallel sizes and the sequence length with its recompute."""
    grpo = config["grpo"]
    args = [
        "--advantage-estimator",
        grpo["advantage_estimator"],
        "--n-samples-per-prompt",
        str(grpo["n_samples_per_prompt"]),
        "--rollout-batch-size",
        str(grpo["rollout_batch_size"]),
        "--global-batch-size",
        str(grpo["global_batch_size"]),
        "--num-rollout",
        str(grpo["num_rollout"]),
        "--rollout-max-response-len",
        str(grpo["rollout_max_response_len"]),
        "--rollout-max-prompt-len",
        str(grpo["rollout_max_prompt_len"]),
        "--use-kl-loss",
        "--kl-loss-coef",
        str(grpo["kl_loss_coef"]),
        "--kl-loss-type",
        grpo["kl_loss_type"],
        "--eps-clip",
        str(grpo["eps_clip"]),
        "--eps-clip-high",
        str(grpo["eps_clip_high"]),
        "--optimizer",
        "adam",
        "--lr",
        str(grpo["lr"]),
        "--lr-decay-style",
        "constant",
        "--tensor-model-parallel-size",
        str(tp),
        "--pipeline-model-parallel-size",
        "1",
        "--context-parallel-size",
        "1",
        "--use-dynamic-batch-size",
        "--max-tokens-per-gpu",
        str(grpo["max_tokens_per_gpu"]),
    ]
    context = config["context"]
    args += ["--seq-length", str(context["seq_length"]), *[str(a) for a in context.get("recompute") or []]]
    if grpo.get("use_tis"):
        args.append("--use-tis")
    if tp > 1:
        args.append("--sequence-parallel")
    return args


def fit_budget_and_memory(plan: LaunchPlan, profile: Profile, capacity: memory.Capacity | None) -> None:
    """The trace budget refuses what cannot fit (polarstack.checks.budget); the memory plan per GPU and per host adds
    slime's offload flags where they are needed (polarstack.train.memory); the cost per rollout and per step."""
    config, cluster = plan.config, plan.cluster
    # harness + task + response must fit the trace budget, and each request the engine context (polarstack.checks.budget)
    problems = budget.check(plan.train_args, config)
    if problems:
        raise StackError(problems[0] + ".", ExitCode.USAGE)
    # Does it fit the node? slime's offload flags only where the offloaded estimate alone fits (polarstack.train.memory).
    # Per node at NODES>1: every node holds len(TRAINER_GPUS) ranks of a DP that grows with the nodes.
    plan.memory = memory.decide(config, profile, plan.tensor_parallel, capacity, nodes=cluster.nodes)
    plan.train_args += memory.train_args(plan.memory, config)
    plan.cost = rollout_cost.estimate(config, int(budget.harness_record()["agent_turn"]["harness_prompt_tokens"]))
    plan.step = step_cost.estimate(config, plan.cost, plan.memory, profile.engine_count * cluster.nodes)


def job_commands(plan: LaunchPlan, profile: Profile, tracker_env: dict[str, str]) -> list[list[str]]:
    """The four commands launch.sh runs: the Ray head, Polar's rollout server and gateway, and the `ray job submit` of
    train_async.py with the job's runtime env."""
    config, cluster, run_dir = plan.config, plan.cluster, plan.run_dir
    runtime_env = {
        "env_vars": {
            # One node: the loopback switches. NODES>1: the interfaces and Ray's token by path (cluster_plan.job_env).
            **cluster_plan.job_env(cluster),
            "PYTHONPATH": "/root/Megatron-LM",
            "CUDA_DEVICE_MAX_CONNECTIONS": "1",
            "SGLANG_ROUTER_BASE_URL": plan.base_url,
            "POLAR_WORKER_DISCOVERY": profile.values["POLAR_WORKER_DISCOVERY"],
            **sandbox_mode_env(),
            **verifier_knobs.verifier_env(),  # the in-job gate names an active opt-out (polarstack.train.gate)
            **tracker_env,
            # The documented smoke knobs (docs/tool-calls.md), for the in-job first-rollout check (issue 26 point 7):
            # the environment's, as the profile was loaded (stack.profiles.ENVIRONMENT_KNOBS).
            **tool_exchange.smoke_knobs(profile.settings),
        }
    }  # Polar's direct-exec apptainer mode (polarstack.stack.assets)
    dashboard = cluster_plan.dashboard_url(cluster, config["ray"]["dashboard_port"])
    return [
        head_command(
            gcs_port=config["ray"].get("gcs_port", 6379),
            dashboard_port=config["ray"]["dashboard_port"],
            num_gpus=len(profile.trainer_gpus),
            node_ip=cluster.head_addr,
            object_store_bytes=object_store_bytes(),
        ),
        ["polar", "serve_rollout", "-c", f"{run_dir}/topology.yaml"],
        ["polar", "serve_gateway", "-c", f"{run_dir}/topology.yaml", "--node-id", config["polar"]["node_id"]],
        [
            "ray",
            "job",
            "submit",
            f"--address={dashboard}",
            # <run>-<attempt>, set by launch.sh: its EXIT trap stops this attempt's job by it (ray_job.py)
            f"--submission-id={SUBMISSION_ID}",
            f"--runtime-env-json={json.dumps(runtime_env)}",
            # No --working-dir: Ray would zip and upload slime's whole clone for every job (configs/upstream/
            # ray-job.json), and slime is installed in the image. Ray runs the entrypoint without a cwd of its own,
            # so the script path is absolute and every path argument too (test_train pins it).
            "--",
            "python3",
            f"{SLIME_DIR}/train_async.py",
            *plan.train_args,
        ],
    ]


RESUME_REFUSED = int(
    ExitCode.STATE
)  # launch.sh's exit code when RESUME=1 finds no checkpoint or a fresh run would overwrite one
# launch.sh's exit codes for its two Polar failures, so that `make train` names each (polarstack.train.launch), never
# taken for a job crash and restarted: a server of this attempt exited, or did not answer /health in time (its log
# says why), and a server of another launch still answers on Polar's ports (state, like RESUME_REFUSED, which holds 9).
# Neither is a code bash (1, 2, 126-165), `ray job submit` (1) or the traps (129, 130, 143) end the script with.
POLAR_START_FAILED = int(ExitCode.POLAR_START)
POLAR_PORT_HELD = 19


def checkpoint_guard(plan: LaunchPlan) -> list[str]:
    """Lines of launch.sh that check, inside the trainer (the checkpoints volume lives there), that RESUME=1 has a
    checkpoint to continue and that a fresh run does not write over another run's checkpoints."""
    tracker = shlex.quote(f"{plan.checkpoint_dir}/latest_checkpointed_iteration.txt")
    if plan.resume:
        return [
            f"if [ ! -s {tracker} ]; then",
            f"  echo {shlex.quote(f'RESUME=1 found no checkpoint to continue in {plan.checkpoint_dir} (no latest_checkpointed_iteration.txt); run make train without RESUME to start this run.')} >&2",
            f"  exit {RESUME_REFUSED}",
            "fi",
        ]
    return [
        f"if [ -s {tracker} ]; then",
        f"  echo {shlex.quote(f'{plan.checkpoint_dir} already holds a checkpoint of this run; make train RESUME=1 continues it, or make train SET=checkpoint.run_name=NEW starts another run.')} >&2",
        f"  exit {RESUME_REFUSED}",
        "fi",
    ]


def retention_lines(plan: LaunchPlan) -> list[str]:
    """Lines of launch.sh that keep the newest checkpoint.keep_last saves beside the job (polarstack.train.retention),
    never the iteration a resumed job started from; none with keep_last 0."""
    keep = retention.keep_last(plan.config)
    if keep == 0:
        return []
    tracker = shlex.quote(f"{plan.checkpoint_dir}/latest_checkpointed_iteration.txt")
    prune = ["python3", "-m", "polarstack.train.retention", "--dir", plan.checkpoint_dir, "--keep-last", str(keep)]
    return [
        "# Checkpoint retention: the iteration this job resumes from is never removed.",
        f"protect=$(cat {tracker} 2>/dev/null || echo -1)",
        f'{shlex.join(prune)} --protect "$protect" --watch > retention.log 2>&1 & pids+=($!)',
    ]


def retention_after_job(plan: LaunchPlan) -> list[str]:
    """The last save (after the last rollout) is pruned once the job has ended well."""
    keep = retention.keep_last(plan.config)
    if keep == 0:
        return []
    prune = ["python3", "-m", "polarstack.train.retention", "--dir", plan.checkpoint_dir, "--keep-last", str(keep)]
    # A prune that fails must not turn a finished job into a failure: it is reported, and the saves stay.
    return [
        f'{shlex.join(prune)} --protect "$protect" >> retention.log 2>&1 '
        "|| echo 'polarstack retention: the last prune failed (retention.log); older saves remain' >&2"
    ]


def job_control_lines(plan: LaunchPlan, config: dict[str, Any]) -> list[str]:
    """One job per attempt, stopped with the attempt (the third review's finding A): the attempt's submission id
    <run>-<N> (N counted in attempts.txt), and an EXIT trap that `ray job stop`s it (without --no-wait it waits until
    the job is terminal: ray-job.json job_stop) and then stops this script's own processes by pid. INT, TERM and HUP
    exit through that trap; the submit runs in the background so that a signal is not held until it returns."""
    dashboard = cluster_plan.dashboard_url(plan.cluster, config["ray"]["dashboard_port"])
    return [
        "pids=()",
        "submission_id=''",
        f"attempt_id={shlex.quote(plan.run_id)}-$(( $(cat attempts.txt 2>/dev/null || echo 0) + 1 ))",
        'echo "${attempt_id##*-}" > attempts.txt',
        "cleanup() {",
        '  if [ -n "$submission_id" ]; then',
        f'    ray job stop --address={shlex.quote(dashboard)} "$submission_id" >> ray-job-stop.log 2>&1 || true',
        "  fi",
        '  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done',
        "}",
        "trap cleanup EXIT",
        "trap 'exit 130' INT",
        "trap 'exit 143' TERM",
        "trap 'exit 129' HUP",
    ]


def polar_lines(serve_rollout: list[str], serve_gateway: list[str], urls: list[str], env_prefix: str = "") -> list[str]:
    """Polar's two servers, this attempt's own: those an earlier attempt of this run left (a launch.sh killed before its
    trap ran) are stopped by their recorded pids, a server still answering on the ports refuses the attempt, and the
    health loop passes only while this attempt's servers are alive. `env_prefix` is put before both servers' commands
    (polarstack.train.control_plane: their control-plane token)."""
    return [
        "for f in polar-rollout.pid polar-gateway.pid; do",
        '  old=$(cat "$f" 2>/dev/null || true)',
        '  if [ -n "$old" ] && grep -qa polar "/proc/$old/cmdline" 2>/dev/null; then kill "$old" 2>/dev/null || true; fi',
        '  rm -f "$f"',
        "done",
        f"for url in {' '.join(urls)}; do  # a server stopped just now may take a few seconds to let go of its port",
        '  for _ in $(seq 1 10); do python3 /usr/local/bin/polarstack-healthcheck "$url" >/dev/null 2>&1 || break; sleep 1; done',
        '  if python3 /usr/local/bin/polarstack-healthcheck "$url" >/dev/null 2>&1; then',
        '    echo "polarstack: a Polar server of another launch still answers at $url; stop that launch (make down'
        ' stops the trainer) and rerun" >&2',
        f"    exit {POLAR_PORT_HELD}",
        "  fi",
        "done",
        f"{env_prefix}{shlex.join(serve_rollout)} > polar-rollout.log 2>&1 & rollout_pid=$! pids+=($!);"
        " echo $! > polar-rollout.pid",
        f"{env_prefix}{shlex.join(serve_gateway)} > polar-gateway.log 2>&1 & gateway_pid=$! pids+=($!);"
        " echo $! > polar-gateway.pid",
        f"for url in {' '.join(urls)}; do",
        "  for _ in $(seq 1 60); do",
        '    kill -0 "$rollout_pid" 2>/dev/null && kill -0 "$gateway_pid" 2>/dev/null'
        ' || { echo "polarstack: a Polar server exited (polar-rollout.log, polar-gateway.log)" >&2;'
        f" exit {POLAR_START_FAILED}; }}",
        '    python3 /usr/local/bin/polarstack-healthcheck "$url" >/dev/null && break; sleep 2',
        "  done",
        '  python3 /usr/local/bin/polarstack-healthcheck "$url" || { echo "polarstack: no answer from $url in 120 s'
        f' (polar-rollout.log, polar-gateway.log)" >&2; exit {POLAR_START_FAILED}; }}',
        "done",
    ]


def launch_script(plan: LaunchPlan, run_dir: str, config: dict[str, Any]) -> str:
    """The script `make train` runs inside the trainer container (the Ray head is already up there)."""
    host = cluster_plan.polar_host(plan.cluster)
    rollout = f"http://{host}:{config['polar']['rollout_port']}/health"
    gateway = f"http://{host}:{config['polar']['gateway_port']}/health"
    ray_start, serve_rollout, serve_gateway, submit = plan.commands
    token_lines, token_prefix = control_plane.launch_lines(sandbox_mode_env())  # the environment exported below
    return "\n".join(
        [
            "#!/usr/bin/env bash",
            f"# Rendered by `polarstack train --task {plan.task} --profile {plan.profile}` (run {plan.run_id}).",
            "set -euo pipefail",
            f"cd {shlex.quote(run_dir)}",
            "# What this script and the job print goes to make train's terminal and to launch.log here, in the host's",
            "# .run/train/<run>/ (the Ray driver's own log lives in the container's /tmp/ray, which make down removes).",
            "exec > >(tee -a launch.log) 2>&1",
            f"export SGLANG_ROUTER_BASE_URL={shlex.quote(plan.base_url)}",
            (
                "# Keeps Ray's, slime's, NCCL's and Gloo's listeners on 127.0.0.1 and points every Ray call at the token's"
                " mounted file (polarstack/stack/exposure.py, docs/exposure.md)."
                if not plan.cluster.multi
                else f"# NODES={plan.cluster.nodes}: this node's address, the cluster interface {plan.cluster.iface}, "
                "Ray's token by path (polarstack/train/cluster_plan.py, docs/multi-node.md)."
            ),
            *(f"export {key}={shlex.quote(value)}" for key, value in cluster_plan.launch_env(plan.cluster).items()),
            "# Polar's apptainer runtime in direct-exec mode: instance mode cannot nest here (polarstack/stack/assets.py).",
            *(f"export {key}={shlex.quote(value)}" for key, value in sandbox_mode_env().items()),
            "# The code verifier's knobs (configs/stack.env), as runtime.env gives them to Polar's test_command.",
            *(f"export {key}={shlex.quote(value)}" for key, value in verifier_knobs.verifier_env().items()),
            *job_control_lines(plan, config),
            "# The Ray head runs as the container's main process (compose.yaml); start one only if it is missing.",
            f"ray status >/dev/null 2>&1 || {shlex.join(ray_start)}",
            *checkpoint_guard(plan),
            *retention_lines(plan),
            *token_lines,
            *polar_lines(serve_rollout, serve_gateway, [rollout, gateway], token_prefix),
            'submission_id="$attempt_id"; echo "$submission_id" > job-id.txt',
            shlex.join(submit).replace(SUBMISSION_ID, '"$submission_id"') + " & submit_pid=$! pids+=($!)",
            'wait "$submit_pid"',
            *retention_after_job(plan),
            "",
        ]
    )
