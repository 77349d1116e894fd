"""`polarstack train`'s steps: resolve the target, plan, gate with the smoke, hand the launch to the trainer.

train/plan.py renders the plan (commands and files); this module runs it: the dry run prints it, a real run
checks the node, runs the smoke gate, prepares the task data under .run/train/<run>, and runs launch.sh
inside the trainer container, turning its exits into one sentence each.
"""

from __future__ import annotations

import contextlib
import json
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from polarstack.checks import sandbox_probe, shape_probe, smoke, tool_exchange
from polarstack.checks.retokenize import configured_name
from polarstack.checks.smoke_inputs import SmokeOptions, SmokeTarget
from polarstack.errors import ExitCode, StackError
from polarstack.paths import TRAINER_RUN_DIR, load_defaults, train_run_dir
from polarstack.processes import interrupt_on
from polarstack.reward import tasks
from polarstack.routers import worker_api
from polarstack.stack import cluster as cluster_mod
from polarstack.stack import compose, local, profiles
from polarstack.stack.cluster import Cluster
from polarstack.stack.profiles import stack_knobs
from polarstack.stack.resolved import Resolved, read_now
from polarstack.stack.target import resolve_target
from polarstack.train import cluster_plan, ray_job, rehearsal_record, retention, supervise
from polarstack.train.plan import (
    POLAR_PORT_HELD,
    POLAR_START_FAILED,
    RESUME_REFUSED,
    LaunchPlan,
    build_plan,
    check_task,
    ray_dashboard_port,
    resume_variant,
    watch_lines,
    weight_sync_on_disk,
)


@dataclass(frozen=True)
class TrainRequest:
    """What `polarstack train` was asked (its command-line options)."""

    task: str
    profile: str | None = None
    runtime: str = "auto"
    dry_run: bool = False
    sets: tuple[str, ...] = ()
    source: str | None = None
    resume: bool = False
    json: bool = False
    without_rehearsal: bool = False  # ALLOW_NO_PREFLIGHT=1: launch on the docker runtime without a passing rehearsal
    # Where it runs as the CLI resolved it (polarstack.cli.site): the run states, the cluster; None: read when needed.
    site: Resolved | None = field(default=None, compare=False, repr=False)

    def resolved(self) -> Resolved:
        return self.site if self.site is not None else read_now()


def run(request: TrainRequest, show_plan: Callable[[LaunchPlan, str], None]) -> int:
    """`polarstack train`: the dry run hands the plan and the runtime to `show_plan` (the CLI renders it)."""

    check_task(request.task)  # the request's task, checked once, before anything else
    site = request.resolved()
    target = resolve_target(request.runtime, request.profile, None, verb="train", plan_only=request.dry_run, site=site)
    profile = target.loaded or profiles.load(target.profile)
    plan = plan_request(request, profile, site.cluster)
    if request.task == "humaneval":
        tasks.load_humaneval()  # validates the task data now, not on the GPU node
    if request.dry_run:
        show_plan(plan, target.runtime)
        return 0
    if target.runtime == "docker":
        compose.check_node("train", profile, need_gpus=True, where=site)
        # NODES>1: every node's report, pins, Ray membership, ports, clock, GPUs and memory (polarstack.checks.nodes)
        cluster_plan.require_nodes(profile, plan.cluster, plan.memory, ray_dashboard_port(profile, plan.config))
        # A passing `make preflight` of these pins, this profile and this plan (polarstack.train.rehearsal_record).
        print(
            rehearsal_record.require(profile, cluster=plan.cluster, override=request.without_rehearsal),
            file=sys.stderr,
        )
    host_gate(request, target, plan, profile)
    if target.local:
        raise StackError(
            f"the gate passed, but training needs the GPU stack, which the local runtime does not have: "
            f"on the GPU node run `make up PROFILE={target.profile}` and then `make train TASK={request.task}`.",
            ExitCode.ENVIRONMENT,
        )
    # What a restart from the last checkpoint runs: the same plan resumed (the plan itself under RESUME=1).
    return launch_in_trainer(
        request, plan, profile, site, resume_variant(plan), int(plan.config["supervise"]["max_restarts"])
    )


def plan_request(request: TrainRequest, profile, cluster: Cluster) -> LaunchPlan:
    """The run's one plan, from the request and the site: configs/train/defaults.yaml with the request's SET, the
    stack's MODEL_PATH and SERVED_MODEL_NAME, each read once here, and the cluster the site read; whatever runs later
    reads them from the plan (plan.config, plan.cluster)."""
    knobs = stack_knobs()
    return build_plan(
        request.task,
        profile,
        run_id=f"{request.task}-{profile.name}-{time.strftime('%Y%m%dT%H%M%S')}",
        config=load_defaults(list(request.sets)),
        model_path=knobs.get("MODEL_PATH"),  # stack_knobs: the environment's MODEL_PATH over configs/stack.env's
        served_model_name=knobs.get("SERVED_MODEL_NAME"),
        resume=request.resume,
        cluster=cluster,
    )


def host_gate(request: TrainRequest, target, plan, profile) -> None:
    """The smoke against the target with the Polar config the run will use; GATE (one sentence) when it fails."""
    import yaml

    polar_values = yaml.safe_load(plan.files["polar_config.yaml"])
    # a local stack of real engines: its scripted tool answer and timeout
    site = local.smoke_options(target, request.resolved().local_state if target.local else None)
    checked = SmokeTarget(
        target.base_url,
        route=target.route or profile.route,
        register=target.register,
        agent_env=(polar_values["polar_task_template"].get("agent") or {}).get("env") or {},
        tool_fields=site.get("tool_fields"),
        tool_unscripted=site.get("tool_unscripted"),
    )
    knobs = tool_exchange.knobs_from(profile.settings)  # the smoke's knobs, as the profile was loaded (the site)
    options = SmokeOptions(
        model=target.served_model(),
        timeout=tool_exchange.smoke_deadline(site.get("timeout"), knob=knobs.timeout),  # the in-job check's rule too
        tokenizer_name=configured_name(polar_values),
        allow_retokenized=bool(polar_values.get("polar_gate_allow_retokenized")),
        knobs=knobs,
    )
    report = smoke.run_smoke(checked, options)
    if not report.ok:
        raise StackError(f"refusing to launch {request.task} on {target.profile}: {report.message}", ExitCode.GATE)
    print(f"gate passed: {report.message}", file=sys.stderr)


def release_router_workers(profile, cluster: Cluster) -> list[str]:
    """Where slime registers the engines with the router (ROUTER_REGISTRATION=register), the router must list none
    of them when a job starts (routers.worker_api.release_all); elsewhere nothing to do. The router is on the head's
    address at NODES>1 (127.0.0.1 on one node). `cluster`: the plan's (the site's)."""
    if profile.registration != "register" or profile.router is None:
        return []
    return worker_api.release_all(f"http://{cluster.head_addr}:{profile.router_port}", timeout=30)


def resume_engines(profile, cluster: Cluster) -> list[str]:
    """Before every job: POST /continue_generation to each engine (the call slime makes after a weight reload,
    slime/backends/sglang_utils/sglang_engine.py continue_generation; slime/ray/actor_group.py pauses the engines
    before the reload and resumes them after it). A job stopped between the two leaves the engines paused: every
    request, /health's included, then waits (sglang tokenizer_manager pause_generation), so the next attempt's gate
    and healthchecks would fail. Returns one warning per engine that did not accept it (the gate then says more).
    At NODES>1 every engine of every node, by its cluster address. `cluster`: the plan's (the site's)."""
    urls = profiles.docker_engine_urls(profile) if not cluster.multi else cluster_mod.engine_urls(profile, cluster)
    warnings = []
    for url in urls:
        try:
            httpx.post(f"{url}/continue_generation", json={}, timeout=30).raise_for_status()
        except httpx.HTTPError as exc:
            warnings.append(f"polarstack: {url}/continue_generation failed ({exc}); the gate checks the engine next")
    for line in warnings:
        print(line, file=sys.stderr)
    return warnings


def refuse_active_job(profile, config: dict, where: compose.Where) -> None:
    """Refuse (STATE) while the trainer's Ray cluster has a PENDING or RUNNING job (polarstack.train.ray_job): slime's
    placement group would wait for its GPUs forever, and releasing the router's workers would take the engines from
    under it. Runs before the router's workers are released and before launch.sh submits. `where`: the site's device
    and cluster (the plan's)."""
    address = cluster_plan.dashboard_url(where.cluster, ray_dashboard_port(profile, config))
    proc = compose.run_compose(
        profile,
        ["exec", "-T", "trainer", "python3", "-m", "polarstack.train.ray_job", "--address", address],
        where=where,
        capture=True,
    )
    try:
        jobs = json.loads((proc.stdout or "").strip().splitlines()[-1]) if proc.returncode == 0 else None
    except (IndexError, ValueError):
        jobs = None
    if not isinstance(jobs, list):
        print(f"polarstack: the Ray jobs at {address} could not be listed; not checked", file=sys.stderr)
        return
    if jobs:
        raise StackError(ray_job.active_sentence(jobs, address) + ".", ExitCode.STATE)


def stop_attempt_job(plan: LaunchPlan, profile, out: Path, where: compose.Where) -> None:
    """The host's half of launch.sh's trap: `docker compose exec` passes no signal into the trainer, so when make is
    interrupted (Ctrl-C, SIGTERM, a dropped session's SIGHUP) the job of the last attempt (job-id.txt, written by
    launch.sh) is stopped here by its submission id; `ray job stop` waits until it is terminal (ray-job.json)."""
    job_file = out / "job-id.txt"
    job = job_file.read_text().strip() if job_file.is_file() else ""
    if not job:
        return
    address = cluster_plan.dashboard_url(plan.cluster, ray_dashboard_port(profile, plan.config))
    with contextlib.suppress(OSError):  # the terminal may be gone
        print(f"polarstack: interrupted; stopping Ray job {job}", file=sys.stderr)
    compose.run_compose(
        profile, ["exec", "-T", "trainer", "ray", "job", "stop", f"--address={address}", job], where=where, capture=True
    )


def checkpoint_free_bytes(profile, where: compose.Where, volume: str = cluster_plan.CHECKPOINTS_VOLUME) -> int | None:
    """Free bytes of the checkpoints volume (SHARED_DIR/checkpoints at NODES>1), read inside the trainer (where it is
    mounted); None when unreadable."""
    proc = compose.run_compose(
        profile, ["exec", "-T", "trainer", *retention.DF_AVAIL, volume], where=where, capture=True
    )
    return retention.parse_df(proc.stdout) if proc.returncode == 0 else None


def logs_space(profile, where: compose.Where, checkpoints: str) -> tuple[bool, int] | None:
    """Whether the logs volume (Polar's saved results) shares the checkpoints' filesystem, and its free bytes, read
    inside the trainer (where both are mounted); None when unreadable."""
    script = retention.logs_probe(checkpoints, cluster_plan.LOGS_VOLUME)
    proc = compose.run_compose(profile, ["exec", "-T", "trainer", "sh", "-c", script], where=where, capture=True)
    return retention.parse_logs_probe(proc.stdout) if proc.returncode == 0 else None


def check_checkpoint_space(profile, plan: LaunchPlan, resume: bool, where: compose.Where) -> None:
    """Refuse (ENVIRONMENT) when the plan's saves cannot fit the volume (polarstack.train.retention). Also says where
    Polar's saved results grow, uncounted: on the checkpoints' filesystem, or with their own free space."""
    volume = cluster_plan.checkpoint_volume(plan.cluster)
    free = checkpoint_free_bytes(profile, where, volume)
    print(
        "polarstack: " + retention.logs_sentence(logs_space(profile, where, volume), cluster_plan.POLAR_RESULTS_DIR),
        file=sys.stderr,
    )
    if free is None:
        print("polarstack: the checkpoints volume's free space could not be read; not checked", file=sys.stderr)
        return
    problem = retention.disk_problem(
        plan.config, free, resume, weight_sync_on_disk=weight_sync_on_disk(plan.train_args)
    )
    if problem:
        raise StackError(f"refusing to launch run {plan.run_id}: {problem}.", ExitCode.ENVIRONMENT)
    print(f"polarstack: {retention.sentence(plan.config)}; {free / 1e9:,.1f} GB free", file=sys.stderr)


def logs_hint(out: Path) -> str:
    """Where an attempt's output is, for the supervisor's sentences: launch.sh runs through `docker compose exec`, so
    `make logs SERVICE=trainer` shows only the Ray head (the container's main process); launch.sh tees its own and the
    job's output to launch.log in the run's directory on the host, beside Polar's server logs and retention's."""
    return (
        f"{out}/launch.log (the job's output; polar-rollout.log, polar-gateway.log and retention.log are beside it, "
        "and job-id.txt names the Ray submission, whose driver log `ray job logs <id>` shows inside the trainer until "
        "`make down`)"
    )


def polar_refusal(rc: int, plan, out: Path) -> StackError | None:
    """launch.sh's two Polar exits as one sentence each (polarstack.train.plan.polar_lines), or None for any other exit.
    A server of another launch on Polar's ports is state: no restart clears it (every attempt would find it)."""
    polar = plan.config["polar"]
    ports = f"{polar['rollout_port']} (rollout) or {polar['gateway_port']} (gateway)"
    if rc == POLAR_PORT_HELD:
        return StackError(
            f"the trainer refused run {plan.run_id}: a Polar server of another launch still answers on port {ports} "
            "and no Ray job runs, so it was left by a launch.sh that did not reach its cleanup; `make down` and "
            "`make up` restart the trainer without it, then rerun make train.",
            ExitCode.STATE,
        )
    if rc == POLAR_START_FAILED:
        return StackError(
            f"Polar's rollout server or gateway of run {plan.run_id} exited, or did not answer /health within 120 s, "
            f"before the job was submitted: {out}/polar-rollout.log and polar-gateway.log say why.",
            ExitCode.POLAR_START,
        )
    return None


def launch_in_trainer(
    request: TrainRequest, plan, profile, where: compose.Where, resume_plan=None, max_restarts: int = 0
) -> int:
    """Prepare .run/train/<run> and run launch.sh inside the trainer; its exits as one sentence each. `where`: the
    site's device and cluster (the plan's), whose trainer runs it."""

    run_id = plan.run_id
    shape_probe.check_docker(profile, where, running=True)  # the reward in the namespace shape of Polar's sessions
    sandbox_probe.check_in_trainer(profile, where)  # apptainer, the SIF and the agent CLI dir, inside the trainer
    if plan.memory is not None:  # computed per GPU and per host (polarstack.train.memory)
        print("\n".join(plan.memory.lines()), file=sys.stderr)
    check_checkpoint_space(profile, plan, request.resume, where)
    out = train_run_dir() / run_id
    tasks.prepare(
        request.task,
        out / "tasks",
        source=Path(request.source) if request.source else None,
        tasks_dir_in_trainer=f"{TRAINER_RUN_DIR}/{run_id}/tasks",
        max_prompt_tokens=int(plan.config["grpo"]["rollout_max_prompt_len"]),  # the budget the plan counts (issue 34)
    )
    for file_name, text in plan.files.items():
        (out / file_name).write_text(text)
    print("what to watch on the GPU node:\n  " + "\n  ".join(watch_lines(plan)), file=sys.stderr)
    if resume_plan is not None:  # what a restart from the last checkpoint runs (polarstack.train.supervise)
        (out / "launch-resume.sh").write_text(resume_plan.files["launch.sh"])
    abort = out / "gate-abort.txt"

    def attempt(resume: bool) -> int:
        abort.unlink(missing_ok=True)  # a sentence left by an earlier attempt of this run is stale
        refuse_active_job(profile, plan.config, where)  # one job at a time, before the engines are released
        release_router_workers(profile, plan.cluster)  # slime registers the engines again at every job's start
        resume_engines(profile, plan.cluster)  # an earlier job stopped mid weight-reload left them paused
        script = "launch.sh" if resume == request.resume else "launch-resume.sh"
        proc = compose.run_compose(
            profile, ["exec", "-T", "trainer", "bash", f"{TRAINER_RUN_DIR}/{run_id}/{script}"], where=where
        )
        if proc.returncode == RESUME_REFUSED and not abort.is_file():  # launch.sh's checkpoint guard said why
            raise StackError(
                f"the trainer refused run {run_id}: "
                + (
                    f"RESUME=1 found no checkpoint in {plan.checkpoint_dir}; run make train without RESUME to start it."
                    if resume
                    else f"{plan.checkpoint_dir} already holds a checkpoint; make train RESUME=1 continues "
                    "it, or SET=checkpoint.run_name=NEW starts another run."
                ),
                ExitCode.STATE,
            )
        refusal = polar_refusal(proc.returncode, plan, out) if not abort.is_file() else None
        if refusal is not None:  # never restarted (polarstack.train.supervise)
            raise refusal
        return proc.returncode

    def checkpoint() -> int | None:  # the checkpoints volume lives in the trainer
        proc = compose.run_compose(
            profile,
            ["exec", "-T", "trainer", "cat", f"{plan.checkpoint_dir}/latest_checkpointed_iteration.txt"],
            where=where,
            capture=True,
        )
        return supervise.parse_iteration(proc.stdout) if proc.returncode == 0 else None

    main_thread = threading.current_thread() is threading.main_thread()  # signal handlers are the main thread's
    previous = interrupt_on(signal.SIGTERM, signal.SIGHUP) if main_thread else {}
    try:
        supervise.supervise(
            attempt,
            checkpoint,
            lambda: abort.read_text().strip() if abort.is_file() else None,  # every in-job gate stop writes one
            max_restarts=max_restarts,
            resume=request.resume,
            describe=f"the training job of run {run_id}",
            logs=logs_hint(out),
        )
    except KeyboardInterrupt:  # SIGINT, or SIGTERM / SIGHUP through processes.interrupt_on
        stop_attempt_job(plan, profile, out, where)
        raise
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0
