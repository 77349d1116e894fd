"""`make verify-offline`: prove the GPU-side command lines and pins without a GPU.

1. Every command line the stack renders, per profile (and per task for the training launch), is checked
   against the parser of the exact pinned release (polarstack.offline.flags): the engines' `sglang.launch_server`
   (from the Compose model the real Compose v2 binary renders, plus ENGINE_EXTRA_ARGS), the router launch
   (Compose and local runtime) with the release's own parser, the trainer's `ray start`, and the training
   launch (`ray start`, `ray job submit`, `train_async.py`).
2. Every Python package the images pin resolves on the package index at that version for the image's
   Python and platform (`pip download --no-deps --only-binary=:all:`, cached).
3. One source: images/README.md names every pin, the recorded upstream option tables match the pins.
4. Meaning for the GPU node (docs/gpu-node.md): the trace budget (measured harness prompt + task prompt +
   response <= seq_length <= max_tokens_per_gpu x CP <= model context), and the weights source, the agent
   sandbox, the agent-CLI mount and apptainer's grant present in the rendered plan; what the trainer must not have:
   systempaths=unconfined (the sessions are the node's root with its /proc); HF_TOKEN anywhere but model-download;
   Polar's mode env and POLAR_APPTAINER_NO_MOUNT_TMP wherever Polar runs.
5. Meaning (polarstack.offline.meaning): the Polar bridge's slime API exists at the pinned slime, the engines parse tool
   calls, checkpoints/dropout/resume, and the weight-sync transport reaches the engines across containers.
6. The routing flags each profile ships (ROUTER_ARGS) are the ones docs/routing.json measured.
7. The rehearsal (`make preflight`, issue 19) per working profile, like the main plan (check_preflight), and its
   report's readers against what slime, Polar and sglang write (polarstack.offline.rehearsal_keys).
8. Ray's token authentication (issue 28, polarstack.offline.ray_auth_facts): every rendered Ray process sends the
   stack's token by the trainer's read-only mount, the healthchecks poll a public path, no rendered text holds it.
9. Two nodes (issue 28, polarstack.offline.multinode): a 2-node plan, rehearsal and Compose override of every working
   router profile against configs/upstream/multinode-facts.json.
10. The user namespace of Polar's sessions (issue 32, polarstack.offline.apptainer_userns): the recorded apptainer
   map is the verifier's one-uid shape, nothing the stack ships turns on fakeroot or a PID namespace (which cannot
   start under Docker's masked /proc: the recorded limit), and the trainer image gives the sessions a staged /dev.
11. The Docker Compose floor (polarstack.offline.compose_features): the recorded minimum Compose covers every Compose
   feature the stack's files and rendered overrides use (configs/upstream/compose-features.json).
12. The node's ports (issue 34, polarstack.stack.ports): every listener of the recorded Ray head is of a kind the
   accounting knows, and each profile's fixed ports meet no other, and none bound while Ray runs lies in Ray's ranges.
13. NCCL and Gloo on loopback at NODES=1 (issue 34, polarstack.offline.socket_ifname): what the record says they pick
   unset, and NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME = lo in every rendered trainer, engine and Ray job environment.
14. The grading sandbox's directory (polarstack.offline.eval_dir): the patch that keeps it out of the agent's session
   acts on the names configs/upstream/polar-eval-runtime.json records at POLAR_COMMIT, and does what it promises.
15. The task prompt budget (issue 34, polarstack.offline.prompt_budget): slime's --rollout-max-prompt-len filters no
   message-list prompt, so the stack checks each instruction's token bound (NFC bytes of a byte-level BPE) itself.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

from polarstack import paths
from polarstack.checks import budget, retokenize
from polarstack.checks.tool_exchange import RECORD, recorded_fact_problems
from polarstack.engine import tool_parser
from polarstack.engine.emulator import tokenizer_manager as context_check
from polarstack.engine.protocol import source_dir
from polarstack.errors import ExitCode, StackError
from polarstack.offline import (
    apptainer_userns,
    compose_features,
    control_plane,
    eval_dir,
    flags,
    host_memory,
    image_facts,
    meaning,
    memory_facts,
    multinode,
    prompt_budget,
    ray_auth_facts,
    real_sglang_facts,
    rehearsal_keys,
    socket_ifname,
    verifier_env,
    verifier_output,
)
from polarstack.offline.check import Check
from polarstack.paths import cache_dir, load_defaults, load_yaml
from polarstack.pins import pins, repo_root
from polarstack.polar import harness_preset
from polarstack.polar import model as polar_model
from polarstack.processes import child_env, file_lock
from polarstack.reward.sandbox import AGENT_CLI_DIR, AGENT_CLI_MOUNT, SANDBOX_DIR, SIF_NAME
from polarstack.reward.tasks import TASKS
from polarstack.stack import assets, compose, exposure, host_check, ports, profiles
from polarstack.stack.cluster import Cluster
from polarstack.train import batch_layout, gate, preflight, ray_job
from polarstack.train.memory import DEFAULT_GPU_MEMORY_GB, Capacity
from polarstack.train.plan import LaunchPlan, build_plan


def _compose_model(profile: profiles.Profile, tmp: Path, where: compose.Where) -> dict[str, Any]:
    import json

    binary = compose.bundled_compose()
    command = [str(binary)] if binary else compose.compose_command()
    args = compose.compose_args(profile, tmp, cluster=where.cluster, cpu=where.cpu)
    proc = subprocess.run([*command, *args, "config", "--format", "json"], capture_output=True, text=True)
    if proc.returncode != 0:
        raise StackError(
            f"Compose rejected profile {profile.name}: {proc.stderr.strip().splitlines()[-1:]}", ExitCode.USAGE
        )
    return json.loads(proc.stdout)


def _after(tokens: list[str], marker: list[str]) -> list[str] | None:
    for i in range(len(tokens) - len(marker) + 1):
        if tokens[i : i + len(marker)] == marker:
            return tokens[i + len(marker) :]
    return None


def check_profile(profile: profiles.Profile, tmp: Path, where: compose.Where) -> list[Check]:
    """Every check of one profile's rendering (`where`: the device and cluster it is rendered for, the site's)."""
    checks: list[Check] = []
    model = _compose_model(profile, tmp, where)
    sglang = flags.sglang_table()
    for name, svc in sorted(model["services"].items()):
        checks += _service_checks(profile, name, svc, sglang)
    if profile.router is not None:  # the local runtime's launch of the same release
        checks.append(_local_router_check(profile))
    slime, slime_program = flags.slime_table()
    plans = {}
    for task in TASKS:
        plan = build_plan(task, profile, run_id="verify", config=load_defaults(), cluster=where.cluster)
        plans[f"make train TASK={task}"] = plan
        checks += _train_plan_checks(profile, task, plan, model, slime, slime_program)

    collisions = ports.problems(profile, load_defaults()["polar"])  # issue 34 point 5: every fixed port, no collision
    checks.append(
        Check(
            f"profile {profile.name}: the node's fixed ports meet no other and no Ray range",
            not collisions,
            "",
            collisions,
        )
    )
    checks += ray_auth_facts.check_profile(profile, model, tmp, plans)  # the Ray token, by the mounted file
    checks += meaning.check_profile(profile, model, where.cluster)
    return checks


def _service_checks(profile: profiles.Profile, name: str, svc: dict[str, Any], sglang: dict[str, str]) -> list[Check]:
    """One service of the rendered Compose model: an engine's sglang.launch_server and its NCCL/Gloo interfaces, the
    trainer's `ray start` and loopback-only listeners, or the router's launch against its release's parser."""
    checks: list[Check] = []
    command = svc.get("command") or []
    label = f"profile {profile.name}, service {name}"
    if name.startswith("engine-"):
        extra = (svc.get("environment") or {}).get("ENGINE_EXTRA_ARGS") or ""
        tokens = (_after(command, ["-m", "sglang.launch_server"]) or []) + shlex.split(extra)
        problems = flags.check_tokens(tokens, sglang, command=label, program=flags.sglang_program())
        checks.append(
            Check(
                f"{label}: sglang.launch_server",
                not problems,
                f"{len(tokens)} tokens",
                [p.sentence() for p in problems],
            )
        )
        interfaces = exposure.interface_problems(svc.get("environment") or {}, label)
        checks.append(Check(f"{label}: NCCL and Gloo on loopback", not interfaces, "", interfaces))
    elif name == "trainer":
        table, program = flags.ray_table("ray start")
        problems = flags.check_tokens(_after(command, ["ray", "start"]) or [], table, command=label, program=program)
        checks.append(Check(f"{label}: ray start", not problems, "", [p.sentence() for p in problems]))
        problems = exposure.trainer_problems(svc.get("environment") or {}, label)
        checks.append(Check(f"{label}: Ray and slime listen on loopback only", not problems, "", problems))
    elif name == "router":
        env = svc.get("environment") or {}
        release = profile.router
        args = ["--host", "127.0.0.1", "--port", str(env.get("ROUTER_PORT"))]
        if env.get("ROUTER_WORKER_URLS"):
            args += ["--worker-urls", *env["ROUTER_WORKER_URLS"].split()]
        args += shlex.split(env.get("ROUTER_EXTRA_ARGS") or "")
        problems = flags.router_check(release, args, command=label)
        checks.append(
            Check(f"{label}: {release.module} ({release.spec})", not problems, "", [p.sentence() for p in problems])
        )
    return checks


def _local_router_check(profile: profiles.Profile) -> Check:
    """The local runtime's launch of the profile's router release, against that release's parser."""
    release = profile.router
    urls = ["http://127.0.0.1:30000", "http://127.0.0.1:30010"] if profile.registration == "static" else []
    args = release.launch_args(30080, urls, 30081, profile.router_args)[2:]  # drop "-m MODULE"; + ROUTER_ARGS
    problems = flags.router_check(release, args, command=f"profile {profile.name}, local runtime router")
    return Check(
        f"profile {profile.name}, local runtime: {release.spec}",
        not problems,
        "",
        [p.sentence() for p in problems],
    )


def _train_plan_checks(
    profile: profiles.Profile,
    task: str,
    plan: LaunchPlan,
    model: dict[str, Any],
    slime: dict[str, str],
    slime_program: str,
) -> list[Check]:
    """`make train TASK=task`'s plan: its launch against the recorded option tables, one Ray job per attempt, the
    listeners, Polar's control-plane token and the task prompt budget."""
    checks: list[Check] = []
    label = f"profile {profile.name}, make train TASK={task}"
    problems = flags.check_tokens(plan.train_args, slime, command=label, program=slime_program)
    ray_start, _, _, submit = plan.commands
    table, program = flags.ray_table("ray start")
    problems += flags.check_tokens(ray_start[2:], table, command=label, program=program)
    table, program = flags.ray_table("ray job submit")
    options = submit[3 : submit.index("--")]
    problems += flags.check_tokens(options, table, command=label, program=program)
    checks.append(
        Check(
            f"{label}: train_async.py, ray start, ray job submit",
            not problems,
            f"{len(plan.train_args)} train_async tokens",
            [p.sentence() for p in problems],
        )
    )
    cwd_problems = ray_job.problems(submit)
    job_problems = ray_job.job_control_problems(submit, plan.files["launch.sh"])
    checks.append(
        Check(
            f"{label}: one Ray job per attempt, stopped with it (ray-job.json job_status, job_stop)",
            not job_problems,
            "",
            job_problems,
        )
    )
    checks.append(
        Check(f"{label}: the Ray job needs no working directory (ray-job.json)", not cwd_problems, "", cwd_problems)
    )
    job_env = json.loads(next(a for a in submit if a.startswith("--runtime-env-json=")).split("=", 1)[1])
    exposed = exposure.trainer_problems(job_env.get("env_vars") or {}, f"{label} (Ray job)", plan.train_args)
    checks.append(Check(f"{label}: Ray and slime listen on loopback only", not exposed, "", exposed))
    trainer_env = (model["services"].get("trainer") or {}).get("environment") or {}
    token_problems = control_plane.check_plan(plan, trainer_env, label)
    checks.append(
        Check(
            f"{label}: Polar's control-plane token reaches its two servers alone, never a session "
            "(polar-facts.json control_plane)",
            not token_problems,
            control_plane.detail(plan),
            token_problems,
        )
    )
    prompt_problems = prompt_budget.plan_problems(plan.train_args, label)  # issue 34 point 8
    checks.append(
        Check(f"{label}: the task prompt budget is checked on the data", not prompt_problems, "", prompt_problems)
    )
    return checks


def check_assets(profile: profiles.Profile, tmp: Path, where: compose.Where) -> Check:
    """Weights source, sandbox image, agent CLI and their mounts are all in the rendered plan (docs/gpu-node.md), as
    rendered for `where` (the site's device and cluster)."""
    label = f"profile {profile.name}: weights source, agent sandbox, agent CLI and Polar's apptainer mode in the plan"
    binary = compose.bundled_compose()
    command = [str(binary)] if binary else compose.compose_command()
    proc = subprocess.run(
        [
            *command,
            *compose.compose_args(profile, tmp, cluster=where.cluster, cpu=where.cpu),
            "--profile",
            assets.SANDBOX_PROFILE,
            "config",
            "--format",
            "json",
        ],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        return Check(
            label,
            False,
            "",
            [
                f"Compose rejected profile {profile.name} with the sandbox profile: "
                f"{proc.stderr.strip().splitlines()[-1:]}"
            ],
        )
    services = json.loads(proc.stdout)["services"]
    trainer = services.get("trainer", {})
    problems = _service_asset_problems(services, trainer)
    problems += _plan_asset_problems(profile, trainer, where.cluster)
    return Check(
        label,
        not problems,
        "model-download -> engines; sandbox-build; /dev/fuse; agent CLI mount; Polar's direct-exec apptainer mode; "
        "the verifier's knobs in the test_command's runtime.env",
        problems,
    )


def _service_asset_problems(services: dict[str, Any], trainer: dict[str, Any]) -> list[str]:
    """The Compose model with the sandbox profile: model-download before the engines, sandbox-build, what apptainer
    needs in the trainer and nothing more, HF_TOKEN only where the weights are fetched."""
    problems = []
    download = services.get("model-download")
    if download is None:
        problems.append("no model-download service: nothing puts the weights into the models volume")
    for name in (s for s in services if s.startswith("engine-")):
        if (services[name].get("depends_on") or {}).get("model-download", {}).get(
            "condition"
        ) != "service_completed_successfully":
            problems.append(f"{name} does not wait for model-download to complete")
    if "sandbox-build" not in services:
        problems.append("no sandbox-build service: nothing builds polarstack-code.sif and the agent CLI dir")
    if [d.get("source") for d in trainer.get("devices") or []] != ["/dev/fuse"] or not {
        "seccomp=unconfined",
        "apparmor=unconfined",
    } <= set(trainer.get("security_opt") or []):
        problems.append("the trainer lacks /dev/fuse or the seccomp/AppArmor options apptainer needs inside Docker")
    problems += host_check.docker_problems(  # configs/upstream/apptainer-host.json (issue 18 point 5)
        trainer.get("security_opt") or [], [d.get("source") for d in trainer.get("devices") or []]
    )
    # Docker's read-only /proc/sys kept: the sessions are the node's root with the trainer's /proc bound in
    # (configs/upstream/apptainer-userns.json proc_bound_without_pid_namespace).
    problems += apptainer_userns.procfs_problems(trainer.get("security_opt") or [], trainer.get("environment") or {})
    # HF_TOKEN only where the weights are fetched: the engines and the trainer read them from the models volume
    # (--model-path, MODEL_PATH, is a directory there) and never ask the Hub.
    for name in sorted(n for n, svc in services.items() if "HF_TOKEN" in (svc.get("environment") or {})):
        if name != "model-download":
            problems.append(
                f"{name}'s environment has HF_TOKEN, which only model-download needs (it fetches the weights; {name} "
                "reads them from the models volume): remove it from that service in compose.yaml"
            )
    if trainer.get("privileged") or trainer.get("cap_add"):
        problems.append("the trainer is privileged or has added capabilities: apptainer needs neither")
    return problems


def _plan_asset_problems(profile: profiles.Profile, trainer: dict[str, Any], cluster: Cluster) -> list[str]:
    """The rendered HumanEval plan (on `cluster`): the task template's sandbox image and agent CLI mount, Polar's
    apptainer mode wherever Polar runs, no secret of the trainer's in a session, and the verifier's knobs in its
    test_command."""
    problems = []
    plan = build_plan("humaneval", profile, run_id="verify", config=load_defaults(), cluster=cluster)
    config = load_yaml(plan.files["polar_config.yaml"])
    runtime = config["polar_task_template"]["runtime"]
    if runtime.get("backend") != "apptainer" or not runtime.get("image", "").endswith(SIF_NAME):
        problems.append(f"the task template does not run {SIF_NAME} with the apptainer backend")
    mount = f"{{args.polar_agent_cli_dir}}:{AGENT_CLI_MOUNT}:ro"
    if mount not in (runtime.get("kwargs") or {}).get("volumes", []):
        problems.append(f"the task template does not mount the agent CLI dir ({mount}) into the sandbox")
    if config.get("polar_agent_cli_dir") != AGENT_CLI_DIR or config.get("polar_apptainer_image_dir") != SANDBOX_DIR:
        problems.append("polar_agent_cli_dir / polar_apptainer_image_dir are not where `make sif` installs them")
    # Polar's apptainer mode wherever Polar runs: the trainer container, launch.sh (serve_rollout/serve_gateway), the
    # Ray job (configs/upstream/polar-apptainer.json).
    problems += assets.mode_problems(trainer.get("environment") or {}, "the trainer's environment (compose.yaml)")
    launch_env = dict(
        line.removeprefix("export ").split("=", 1)
        for line in plan.files["launch.sh"].splitlines()
        if line.startswith("export ") and "=" in line
    )
    problems += assets.mode_problems({k: v.strip("'\"") for k, v in launch_env.items()}, "launch.sh")
    submit = plan.commands[-1]
    job_env = json.loads(next(a for a in submit if a.startswith("--runtime-env-json=")).split("=", 1)[1])
    problems += assets.mode_problems(job_env.get("env_vars") or {}, "the Ray job's runtime env")
    # No secret the trainer is handed (compose.yaml's pass-through variables, WANDB_API_KEY for slime's W&B logging)
    # reaches a session: launch.sh starts Polar's servers with the trainer's environment plus its exports, and
    # apptainer passes that on unless --cleanenv (configs/upstream/apptainer-userns.json environment_*).
    polar_env = {**(trainer.get("environment") or {}), **{k: v.strip("'\"") for k, v in launch_env.items()}}
    problems += apptainer_userns.secret_problems(
        assets.pass_through_secrets(paths.compose_file()), polar_env, runtime.get("env") or {}, "launch.sh"
    )
    # The code verifier's knobs reach Polar's test_command (the task's runtime.env) and every other source of its
    # environment with the values the stack chose (issue 32 point 4, polarstack.offline.verifier_env).
    problems += verifier_env.problems(
        config["polar_task_template"],
        trainer.get("environment") or {},
        {k: v.strip("'\"") for k, v in launch_env.items()},
        job_env.get("env_vars") or {},
    )
    return problems


def check_sequence_budget(profile: profiles.Profile, cluster: Cluster) -> Check:
    """harness prompt (measured) + task prompt + response <= seq_length <= max_tokens_per_gpu x CP <= model context,
    for the plan on `cluster` (the site's)."""

    config = load_defaults()
    label = f"profile {profile.name}: sequence budget of one agent trace"
    try:
        plan = build_plan("humaneval", profile, run_id="verify", config=config, cluster=cluster)
    except StackError as exc:  # build_plan refuses a broken budget itself
        return Check(label, False, "", [exc.message])
    problems = budget.check(plan.train_args, config)
    return Check(label, not problems, budget.summary(plan.train_args, config), problems)


def check_request_budget(profile: profiles.Profile, cluster: Cluster) -> Check:
    """Every agent request fits the engine context (issue 18 point 2): the pinned sglang's total-token check as
    recorded in polarstack.engine.emulator.tokenizer_manager, the CLI's output cap (harness-prompt.json) in the agent's env,
    and harness + margin + task prompt + response + per-request max_tokens <= the engine context (the plan on
    `cluster`, the site's)."""
    config = load_defaults()
    label = f"profile {profile.name}: every agent request fits the engine context (sglang's total-token check)"
    try:
        plan = build_plan("humaneval", profile, run_id="verify", config=config, cluster=cluster)
    except StackError as exc:
        return Check(label, False, "", [exc.message])
    problems = context_check.upstream_problems(tool_parser.wheel_text(context_check.TOKENIZER_MANAGER))
    agent = load_yaml(plan.files["polar_config.yaml"])["polar_task_template"]["agent"]
    if (agent.get("env") or {}) != {**(agent.get("env") or {}), **budget.agent_env(config)}:
        problems.append(f"the task template's agent.env does not carry {budget.agent_env(config)}")
    problems += budget.request_problems(plan.train_args, config)
    detail = f"per-request max_tokens {budget.request_max_tokens(config)} ({budget.AGENT_OUTPUT_ENV} in agent.env)"
    return Check(label, not problems, detail, problems)


def check_harness_preset(cluster: Cluster) -> Check:
    """The task template's agent spec agrees with Polar's preset on the CLI version (issue 18 point 3,
    configs/upstream/polar-harness-presets.json), and the sandbox probe refuses a CLI of another version; the task
    template caps each session at the turns the budget allows, through the preset's max_turns (issue 26 point 4). The
    plans are rendered on `cluster` (the site's)."""
    problems = []
    for task in TASKS:
        engine_direct = profiles.load("engine-direct")
        plan = build_plan(task, engine_direct, run_id="verify", config=load_defaults(), cluster=cluster)
        agent = load_yaml(plan.files["polar_config.yaml"])["polar_task_template"]["agent"]
        problems += [f"make train TASK={task}: {p}" for p in harness_preset.problems(agent)]
        cap = budget.turn_cap(load_defaults())  # issue 26 point 4: the per-session turn cap from the budget
        problems += [f"make train TASK={task}: {p}" for p in harness_preset.turn_cap_problems(agent, cap)]
    pinned = harness_preset.pinned_version()
    if harness_preset.version_problem(f"{pinned} (Claude Code)") is not None or not harness_preset.version_problem(
        "0.0.0 (Claude Code)"
    ):
        problems.append("the sandbox probe does not compare the CLI's --version with AGENT_CLI_VERSION")
    facts = harness_preset.record()["presets"]
    detail = ", ".join(f"{name}: {'a' if f['checks_cli_version'] else 'no'} version check" for name, f in facts.items())
    return Check(
        "Polar's harness preset: the agent CLI version and the turn cap (polar-harness-presets.json)",
        not problems,
        detail,
        problems,
    )


def check_batch_layout(profile: profiles.Profile, facts: dict[str, Any] | None = None, *, cluster: Cluster) -> Check:
    """The rendered launch's batch layout (on `cluster`, the site's) against the rules recorded from Megatron and slime
    (batch-rules.json)."""
    facts = facts or batch_layout.record()
    label = f"profile {profile.name}: batch layout (Megatron micro-batches, slime steps per rollout)"
    problems = []
    if facts.get("slime_commit") != pins().get("SLIME_COMMIT"):
        problems.append(
            f"{batch_layout.RECORD} was recorded at another slime commit; rerun scripts/tools/record_batch_rules.py"
        )
    try:
        plan = build_plan("humaneval", profile, run_id="verify", config=load_defaults(), cluster=cluster)
    except StackError as exc:  # build_plan refuses a broken layout itself
        return Check(label, False, "", problems + [exc.message])
    layout = batch_layout.from_train_args(plan.train_args, facts)
    problems += batch_layout.problems(layout)
    detail = (
        f"{layout.samples_per_rollout} trajectories/rollout, global batch {layout.global_batch_size}, "
        f"micro-batch {layout.micro_batch_size} x DP {layout.data_parallel_size}"
    )
    return Check(label, not problems, detail, problems)


def check_routing_measurement(profile: profiles.Profile, data: dict[str, Any] | None = None) -> Check:
    """The routing flags a profile ships are the ones docs/routing.json measured (`polarstack bench --routing`):
    a changed ROUTER_ARGS without a new measurement would ship settings nobody measured."""
    name = f"profile {profile.name}: ROUTER_ARGS are the measured settings (docs/routing.json)"
    if data is None:
        import json

        path = repo_root() / "docs" / "routing.json"
        data = json.loads(path.read_text()) if path.exists() else {"profiles": {}}
    row = data.get("profiles", {}).get(profile.name)
    if row is None:
        return Check(
            name,
            False,
            "",
            [f"docs/routing.json has no measurement for profile {profile.name}; run `polarstack bench --routing`"],
        )
    if row.get("shipped_args") != profile.router_args:
        return Check(
            name,
            False,
            "",
            [
                f"profile {profile.name} ships ROUTER_ARGS={shlex.join(profile.router_args)!r} "
                f"but docs/routing.json measured {shlex.join(row.get('shipped_args') or [])!r}; "
                "rerun `polarstack bench --routing`"
            ],
        )
    shipped = [m for m in row.get("modes", []) if m.get("shipped")]
    goals = shipped[0]["metrics"]["goals"] if shipped else {}
    missed = [k for k, v in goals.items() if not v]
    return Check(
        name,
        True,
        "goals met"
        if goals and not missed
        else f"measured; misses {', '.join(missed) or '?'} (docs/routing.md says why)",
    )


def _python_of(tag: str) -> str:
    match = re.match(r"(\d+\.\d+)", tag)
    if not match:
        raise StackError(f"cannot tell the Python version of the image tag {tag!r} (PYTHON_IMAGE_TAG).", ExitCode.USAGE)
    return match.group(1)


def pin_requirements() -> list[tuple[str, str, str]]:
    """(requirement, python version, why) for every Python package an image pins."""
    table = pins()
    router_python = _python_of(table["PYTHON_IMAGE_TAG"])
    out = []
    for prefix in ("ROUTER_PASSTHROUGH", "ROUTER_PATCHED", "ROUTER_STOCK"):
        out.append(
            (f"{table[prefix + '_PACKAGE']}=={table[prefix + '_VERSION']}", router_python, f"router image ({prefix})")
        )
    out.append((f"ray=={table['RAY_VERSION']}", router_python, "trainer image (RAY_VERSION)"))
    out.append((table["HF_HUB_REQUIREMENT"], router_python, "model-download image (HF_HUB_REQUIREMENT)"))
    pyproject = (repo_root() / "pyproject.toml").read_text()
    rich = re.search(r'"(rich==[^"]+)"', pyproject)
    if rich:
        out.append((rich.group(1), router_python, "trainer image (rich, pyproject.toml)"))
    return out


def check_pin(requirement: str, python: str) -> tuple[bool, str]:
    """`pip download` of `requirement` into the one pin-check folder, under a lock per requirement: two processes
    (two tests of test_verify_offline.py on two workers, a CLI beside them) once downloaded the same wheel at once,
    and one read the smg wheel the other was still writing (FileNotFoundError; issue 34). Different requirements never
    share a file, so they still download side by side (check_pins runs them all at once)."""
    target = cache_dir() / "pin-check"
    target.mkdir(parents=True, exist_ok=True)
    lock = target / ".locks" / (re.sub(r"[^A-Za-z0-9.=_-]", "_", requirement) + ".lock")
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--disable-pip-version-check",
        "--quiet",
        "--python-version",
        python,
        "--implementation",
        "cp",
        "--platform",
        "manylinux_2_34_x86_64",
        "--platform",
        "manylinux2014_x86_64",
        "--platform",
        "any",
        "-d",
        str(target),
        requirement,
    ]
    with file_lock(lock):
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=child_env())
    if proc.returncode == 0:
        return True, ""
    lines = [ln for ln in (proc.stderr or proc.stdout).strip().splitlines() if "WARNING" not in ln]
    return False, (lines[-1] if lines else f"pip exit {proc.returncode}")


def check_npm_pin(package: str, version: str) -> Check:
    """The sandbox image's agent CLI (`make sif`) exists on the npm registry at the pinned version."""
    import shutil

    name = f"{package}@{version} on the npm registry (sandbox image, AGENT_CLI_VERSION)"
    if shutil.which("npm") is None:
        return Check(
            name,
            False,
            "",
            [f"npm is not installed, so {package}@{version} cannot be resolved; install npm or pass --skip-downloads"],
        )
    try:
        proc = subprocess.run(
            ["npm", "view", f"{package}@{version}", "version"],
            capture_output=True,
            text=True,
            timeout=120,
            env=child_env(),  # npm's cache and logs under the project's cache, not ~/.npm
        )
    except subprocess.TimeoutExpired:
        return Check(name, False, "", [f"npm view {package}@{version} did not answer within 120 s"])
    found = proc.stdout.strip()
    if proc.returncode == 0 and found == version:
        return Check(name, True, "resolved")
    lines = (proc.stderr or "").strip().splitlines()
    reason = next(
        (ln for ln in lines if "404" in ln or "notarget" in ln.lower()), lines[0] if lines else "no such version"
    )
    return Check(
        name,
        False,
        "",
        [f"{package}@{version} (AGENT_CLI_VERSION) does not resolve on the npm registry: {reason[:160]}"],
    )


def check_pins(skip_downloads: bool = False) -> list[Check]:
    checks = []
    table = pins()
    try:
        source_dir()
        checks.append(Check(f"sglang=={table['SGLANG_VERSION']} (engine image, emulator)", True, "wheel resolved"))
    except StackError as exc:
        checks.append(
            Check(
                f"sglang=={table['SGLANG_VERSION']} (engine image, emulator)",
                False,
                "",
                [f"sglang=={table['SGLANG_VERSION']} does not resolve on the package index: {exc.message}"],
            )
        )
    wanted = [] if skip_downloads else pin_requirements()
    # each check is one `pip download` (an index round trip, seconds each): all at once, reported in order
    with ThreadPoolExecutor(max(len(wanted), 1) + 1) as pool:
        npm = (
            None
            if skip_downloads
            else pool.submit(check_npm_pin, table["AGENT_CLI_PACKAGE"], table["AGENT_CLI_VERSION"])
        )
        found = list(pool.map(lambda item: check_pin(item[0], item[1]), wanted))
    for (requirement, python, why), (ok, detail) in zip(wanted, found, strict=True):
        checks.append(
            Check(
                f"{requirement} for CPython {python} x86_64 ({why})",
                ok,
                detail,
                []
                if ok
                else [
                    f"{requirement} ({why}) does not resolve on the package index for CPython {python} x86_64: {detail}"
                ],
            )
        )
    if npm is not None:
        checks.append(npm.result())
    readme = (repo_root() / "images" / "README.md").read_text()
    missing = [f"{k}={v}" for k, v in table.items() if v and v not in readme]
    checks.append(
        Check(
            "images/README.md names every pin",
            not missing,
            "",
            [f"images/README.md does not name {m}" for m in missing],
        )
    )
    recorded = flags.recorded_versions()
    mismatch = []
    if recorded["slime_commit"] != table["SLIME_COMMIT"]:
        mismatch.append(
            f"configs/upstream/slime-flags.json was recorded at slime {recorded['slime_commit']}, "
            f"not SLIME_COMMIT={table['SLIME_COMMIT']}; rerecord it"
        )
    if recorded["ray_version"] != table["RAY_VERSION"]:
        mismatch.append(
            f"configs/upstream/ray-flags.json was recorded for ray {recorded['ray_version']}, not "
            f"RAY_VERSION={table['RAY_VERSION']}; rerecord it"
        )
    checks.append(Check("recorded upstream options match the pins", not mismatch, "", mismatch))
    return checks


def _host_memory_check(cluster: Cluster) -> Check:
    """The host estimate of engine-direct's plan on `cluster` (the site's) against MemAvailable."""
    profile = profiles.load("engine-direct")
    capacity = Capacity(DEFAULT_GPU_MEMORY_GB, None, "GPU_MEMORY_GB default")
    config = load_defaults()
    plan = build_plan("humaneval", profile, run_id="verify", config=config, capacity=capacity, cluster=cluster)
    return host_memory.check(plan.commands[0], plan.memory, profiles.stack_knobs())


def check_preflight(profile: profiles.Profile, cluster: Cluster) -> Check:
    """The rehearsal's plan (`make preflight`), checked like the main plan: both jobs' train_async.py, ray start and
    ray job submit against the recorded option tables, loopback-only, the trace budget, the batch rules, slime's
    model script for the small model (and for the 7B of configs/train/defaults.yaml), save and resume. `cluster`: the
    site's."""
    label = f"profile {profile.name}, make preflight: both jobs' launches, model args, batch rules, save and resume"
    try:
        plan = preflight.build(profile, run_id="verify", cluster=cluster)
    except StackError as exc:
        return Check(label, False, "", [exc.message])
    problems = preflight.checks(plan)
    slime, slime_program = flags.slime_table()
    config = preflight.train_config(preflight.preflight_config())
    for name, phase in plan.phases:
        where = f"{label} ({name})"
        problems += [
            p.sentence() for p in flags.check_tokens(phase.train_args, slime, command=where, program=slime_program)
        ]
        ray_start, _, _, submit = phase.commands
        table, program = flags.ray_table("ray start")
        problems += [p.sentence() for p in flags.check_tokens(ray_start[2:], table, command=where, program=program)]
        table, program = flags.ray_table("ray job submit")
        options = submit[3 : submit.index("--")]
        problems += [p.sentence() for p in flags.check_tokens(options, table, command=where, program=program)]
        job_env = json.loads(next(a for a in submit if a.startswith("--runtime-env-json=")).split("=", 1)[1])
        problems += exposure.trainer_problems(job_env.get("env_vars") or {}, f"{where} (Ray job)", phase.train_args)
        problems += ray_auth_facts.plan_problems(phase, where)  # its driver and launch script send the token
        problems += budget.check(phase.train_args, config)
    problems += preflight.batch_problems(profile, config, plan.phases[0][1].tensor_parallel)
    real = load_defaults()["model"]["args"]
    if [str(a) for a in real] != preflight.slime_model_args("7B"):
        problems.append("configs/train/defaults.yaml's model.args are not slime's scripts/models/qwen2.5-7B.sh")
    return Check(label, not problems, f"{plan.model['parameters']:,} parameters, DP {plan.data_parallel}", problems)


def check_polar_facts() -> Check:
    """configs/upstream/polar-facts.json: recorded at POLAR_COMMIT, and the verdict model and gate act on each fact."""
    import json
    import threading
    from types import ModuleType

    record = json.loads((repo_root() / "configs" / "upstream" / "polar-facts.json").read_text())
    facts, problems = record["facts"], []
    if record["polar_commit"] != pins()["POLAR_COMMIT"]:
        problems.append(
            f"configs/upstream/polar-facts.json was read at Polar {record['polar_commit']}, not "
            f"POLAR_COMMIT={pins()['POLAR_COMMIT']}; reread the facts"
        )
    if polar_model.parse(b'{"a": NaN}')[1] is None or polar_model.parse(b'{"a": 1}')[1] is not None:
        problems.append(f"polar_model.parse does not decode like {facts['gateway_parser']['parser']}")
    if polar_model.decide(b"[]").stage != "normalize":
        problems.append("polar_model does not end a non-object answer at normalize_response")
    path = facts["builder_tokenizer"]["config_path"]
    config: dict[str, Any] = {}
    node = config
    for key in path[:-1]:
        node = node.setdefault(key, {})
    node[path[-1]] = "probe-tokenizer"
    if retokenize.configured_name(config) != "probe-tokenizer":
        problems.append(f"retokenize.configured_name does not read {'.'.join(path)}")
    exported = facts["exported_counters"]["exported"]
    if {gate.DELTA_METRIC, gate.LIFETIME_METRIC} != set(exported):
        problems.append(f"the gate reads {gate.DELTA_METRIC}/{gate.LIFETIME_METRIC}, Polar exports {exported}")
    drops = facts["worker_drops_inside"]
    # A stand-in of Polar's worker with the recorded attribute names (a class of its own, not a namespace).
    worker = type("PolarWorkerProbe", (), {})()
    setattr(worker, drops["counter_dict"], {drops["internal_counter"]: 4.0})
    setattr(worker, drops["lock"], threading.Lock())
    module = ModuleType("polarstack_verify_worker_probe")
    setattr(module, drops["worker_global"], worker)
    sys.modules[module.__name__] = module
    try:
        if gate.live_dropped(module.__name__) != 4.0:
            problems.append("the gate's watchdog does not read the worker counter where Polar keeps it")
    finally:
        del sys.modules[module.__name__]
    if not load_defaults()["gate"].get("watchdog_seconds"):
        problems.append("gate.watchdog_seconds is unset, but Polar's rollout call blocks while it drops every group")
    return Check(
        "Polar facts (configs/upstream/polar-facts.json) acted on by the verdict model and the gate",
        not problems,
        f"{len(facts)} facts",
        problems,
    )


def run(
    skip_downloads: bool = False, progress: Callable[[str], None] = lambda m: None, *, where: compose.Where
) -> tuple[list[Check], float]:
    """Every check (`where`: the device and cluster the profiles are rendered for, the CLI's site)."""
    import tempfile

    started = time.perf_counter()
    checks: list[Check] = []
    progress("pins")
    checks += check_pins(skip_downloads)
    checks.append(check_polar_facts())
    checks.append(eval_dir.check())  # the grading sandbox's files out of the agent's reach (polarstack.polar.eval_dir)
    checks.append(check_harness_preset(where.cluster))
    checks.append(image_facts.check())  # the trainer image's Polar and router, checked when it is built
    real_problems = real_sglang_facts.problems()  # issue 21: the real engine on the CPU
    checks.append(
        Check(f"the real sglang on the CPU ({real_sglang_facts.RECORD})", not real_problems, "", real_problems)
    )

    output_problems = verifier_output.problems()  # issue 25: one status line, the verifier's own
    checks.append(
        Check(
            f"the verifier's output under Polar's grading ({verifier_output.RECORD})",
            not output_problems,
            "",
            output_problems,
        )
    )
    gate_problems = verifier_output.gate_problems()  # the in-job gate reads a refusal where test_on_output puts it
    checks.append(
        Check(
            f"the in-job gate's refusal keys in test_on_output's report ({verifier_output.RECORD})",
            not gate_problems,
            "",
            gate_problems,
        )
    )
    tool_problems = recorded_fact_problems()
    checks.append(
        Check(f"Polar's harness tool request ({RECORD}) mirrored by the smoke", not tool_problems, "", tool_problems)
    )
    checks.append(
        memory_facts.check(where.cluster)
    )  # issue 26: memory per GPU and host from the recorded upstream lines
    checks.append(
        _host_memory_check(where.cluster)
    )  # issue 32 point 8: MemAvailable, Ray's object store set and counted
    key_problems, key_detail = rehearsal_keys.check()
    checks.append(
        Check(
            f"the rehearsal's report reads what slime, Polar and sglang write ({rehearsal_keys.RECORD})",
            not key_problems,
            key_detail,
            key_problems,
        )
    )
    checks.append(ray_auth_facts.check_record())  # issue 28: Ray's token authentication, measured
    port_facts = ports.record_problems()  # issue 34 point 5: the head's ports as the accounting counts them
    checks.append(
        Check(f"every port of the recorded Ray head is accounted for ({ports.RECORD})", not port_facts, "", port_facts)
    )
    prompt_facts = prompt_budget.record_problems()  # issue 34 point 8: why the stack checks the prompt budget itself
    checks.append(Check(f"the task prompt budget ({prompt_budget.RECORD})", not prompt_facts, "", prompt_facts))
    ifname_facts = socket_ifname.problems()  # issue 34 point 3: what NCCL and Gloo pick without the two variables
    checks.append(Check(f"NCCL and Gloo interfaces ({socket_ifname.RECORD})", not ifname_facts, "", ifname_facts))
    checks.append(
        apptainer_userns.check(where.cluster)
    )  # issue 32: the sessions' user namespace, where the verifier isolates
    checks.append(compose_features.check())  # the node's Compose must be this new (polarstack.stack.compose_version)
    with tempfile.TemporaryDirectory(prefix="polarstack-verify-") as tmp:
        checks.append(ray_auth_facts.check_cpu(Path(tmp) / "cpu", where.cluster))
        for name in profiles.available():
            progress(f"profile {name}")
            try:
                checks += check_profile(profiles.load(name), Path(tmp) / name, where)
                checks.append(check_sequence_budget(profiles.load(name), where.cluster))
                checks.append(check_batch_layout(profiles.load(name), cluster=where.cluster))
                checks.append(check_request_budget(profiles.load(name), where.cluster))
                checks.append(check_assets(profiles.load(name), Path(tmp) / f"{name}-assets", where))
                if profiles.load(name).expect == "pass":  # the rehearsal runs on the working profiles only
                    checks.append(check_preflight(profiles.load(name), where.cluster))
                if profiles.load(name).router is not None:
                    checks.append(check_routing_measurement(profiles.load(name)))
            except StackError as exc:  # a profile that cannot even be rendered is a failed check, not a crash
                checks.append(Check(f"profile {name}", False, "", [exc.message]))
    progress("2 nodes")
    checks += multinode.check(where.cpu)  # issue 28: a 2-node plan of every working router profile, against the facts
    return checks, time.perf_counter() - started


__all__ = ["run", "check_profile", "check_pins"]
