"""`make preflight` on the node: bring the profile up with the small model, run both jobs, judge, take it down.

The engines load MODEL_PATH when they start (compose.yaml), so the rehearsal needs the stack down first: it
refuses (STATE) while a profile is up, brings `profile` up with the rehearsal's MODEL_NAME / MODEL_PATH /
SERVED_MODEL_NAME (the environment overrides configs/stack.env, compose.stack_knobs), runs the smoke gate, the
first job, the resumed job, reads each engine's weight_version and the checkpoint tracker between them, writes the
report under .run/train/<run>/ and the pass record under .run/preflight/, and always takes the stack down again:
the real run starts with `make up` of the real model. Every step goes through `Node`, so tests drive the sequence
with a fake node (tests/unit/train/test_rehearsal_run.py); on a machine without the GPU stack nothing here can run.
The device, the cluster and the record it starts from are the CLI's site's (`site`), handed to every step.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import time
from pathlib import Path
from typing import Any, Callable

from polarstack.checks import nodes, rehearsal_report, sandbox_probe, shared_probe
from polarstack.errors import ExitCode, StackError
from polarstack.paths import TRAINER_RUN_DIR, train_run_dir
from polarstack.reward import tasks
from polarstack.stack import assets, compose, docker_state, verifier_knobs
from polarstack.stack import cluster as cluster_mod
from polarstack.stack.cluster import Cluster
from polarstack.stack.profiles import Profile
from polarstack.stack.resolved import Resolved, reread
from polarstack.stack.target import resolve_target
from polarstack.train import cluster_plan, preflight, rehearsal_record, retention, supervise
from polarstack.train import launch as train_launch
from polarstack.train.plan import ray_dashboard_port, weight_sync_on_disk
from polarstack.train.preflight import (
    GPU_SAMPLE_MS,
    SEVEN_B_GPU_LOG,
    SEVEN_B_RELOAD_VERSION,
    SUMMARY_NAME,
    PreflightPlan,
)

UP_ARGS = ["up", "--detach", "--wait"]  # as `make up` (polarstack.stack.runtime.DockerRuntime.up)
# Job 2 runs through the supervisor (polarstack.train.supervise) as `make train` runs its job, and its first attempt
# is made to crash once after the job ended (this exit code, a line in job-resume.log): the supervisor sees a
# checkpoint newer than before and resumes from it. slime's train_async.py starts generating rollout
# start_rollout_id before its loop, so the restart costs one rollout's generation and trains nothing more.
INJECTED_EXIT = 75
# NODES>1: how long the rehearsal waits for the other nodes' `make up` (engines load the small model in minutes).
JOIN_TIMEOUT_SECONDS = 1800
JOIN_POLL_SECONDS = 10
INJECTED_LINE = "polarstack rehearsal: crash injected after attempt 1 of job resume (the supervisor must resume it)"

# Read inside the trainer (host network): every engine's weight_version from sglang's GET /model_info
# (srt/entrypoints/http_server.py l.665-679 at SGLANG_VERSION).
VERSIONS_SCRIPT = (
    "import json, sys, urllib.request\n"
    "out = {}\n"
    "for url in sys.argv[1:]:\n"
    "    try:\n"
    "        out[url] = json.load(urllib.request.urlopen(url + '/model_info', timeout=10)).get('weight_version')\n"
    "    except Exception as exc:\n"
    "        out[url] = 'unreachable: ' + type(exc).__name__\n"
    "print(json.dumps(out))\n"
)


# The 7B's reload into engine-0 (issue 32 point 8), from inside the trainer: sglang's POST /update_weights_from_disk
# with UpdateWeightFromDiskReqInput's model_path and weight_version (srt/managers/io_struct.py at SGLANG_VERSION), the
# request slime's disk weight sync sends each engine (slime/ray/actor_group.py l.247), timed; /model_info around it.
RELOAD_SCRIPT = (
    "import json, sys, time, urllib.request\n"
    "url, path, version = sys.argv[1:4]\n"
    "def info():\n"
    "    try:\n"
    "        return json.load(urllib.request.urlopen(url + '/model_info', timeout=10)).get('weight_version')\n"
    "    except Exception as exc:\n"
    "        return 'unreachable: ' + type(exc).__name__\n"
    "out = {'engine': url, 'wanted': version, 'version_before': info()}\n"
    "body = json.dumps({'model_path': path, 'weight_version': version}).encode()\n"
    "request = urllib.request.Request(url + '/update_weights_from_disk', data=body, "
    "headers={'Content-Type': 'application/json'})\n"
    "began = time.monotonic()\n"
    "try:\n"
    "    answer = json.load(urllib.request.urlopen(request, timeout=1800))\n"
    "    out.update(success=answer.get('success'), message=answer.get('message'))\n"
    "except Exception as exc:\n"
    "    out.update(success=False, message=type(exc).__name__ + ': ' + str(exc)[:300])\n"
    "out['seconds'] = round(time.monotonic() - began, 1)\n"
    "out['version_after'] = info()\n"
    "print(json.dumps(out))\n"
)


class Node:
    """What the rehearsal asks of the docker runtime (replaced by a fake in tests), on the site's device and cluster."""

    def __init__(self, profile: Profile, site: Resolved) -> None:
        self.profile = profile
        self.site = site

    def compose(self, args: list[str]) -> int:
        return compose.run_compose(self.profile, args, where=self.site).returncode

    def trainer(self, command: str) -> tuple[int, str]:
        proc = compose.run_compose(
            self.profile, ["exec", "-T", "trainer", "bash", "-c", command], where=self.site, capture=True
        )
        return proc.returncode, proc.stdout

    def release_workers(self, config: dict[str, Any]) -> None:  # before every job: slime registers the engines again
        # but never from under a job still running (train.launch)
        train_launch.refuse_active_job(self.profile, config, self.site)
        train_launch.release_router_workers(self.profile, self.site.cluster)
        train_launch.resume_engines(self.profile, self.site.cluster)  # a job stopped mid weight-reload left them paused

    def open_session(self, plan: PreflightPlan, progress: Callable[[str], None]) -> None:
        """NODES>1, before this node (the head) starts anything: the session every node's report of this bring-up
        carries, and the line for the other nodes, printed now (with a static worker list the head's router, and so
        its `up`, waits for their engines; the node review's finding)."""
        nodes.start_session(plan.cluster)
        env = " ".join(f"{k}={v}" for k, v in plan.stack_env.items())
        others = ", ".join(f"node {r} ({plan.cluster.addrs[r]})" for r in range(1, plan.cluster.nodes))
        progress(f"now run `make up PROFILE={self.profile.name} {env}` on {others}, with its NODE_RANK")

    def join(self, plan: PreflightPlan, progress: Callable[[str], None]) -> None:
        """NODES>1, once this node (the head) is up: its report in the session open_session opened, every other node's
        `make up` (with the rehearsal's MODEL_* values) joins it, then the cluster check (polarstack.checks.nodes)."""
        cluster, cpu = plan.cluster, self.site.cpu
        nodes.write_report(cluster, self.profile, compose.render_values(self.profile, cluster, cpu=cpu), cpu=cpu)
        deadline = time.monotonic() + JOIN_TIMEOUT_SECONDS
        env = " ".join(f"{k}={v}" for k, v in plan.stack_env.items())
        while waiting := nodes.pending(cluster):
            if time.monotonic() > deadline:
                raise StackError(
                    f"node(s) {', '.join(cluster.addrs[r] for r in waiting)} did not come up within "
                    f"{JOIN_TIMEOUT_SECONDS // 60} min: run `make up PROFILE={self.profile.name} {env}` with their "
                    "NODE_RANK on each, then `make preflight` again.",
                    ExitCode.STATE,
                )
            progress(
                f"waiting for `make up PROFILE={self.profile.name} {env}` on "
                f"{', '.join(f'node {r} ({cluster.addrs[r]})' for r in waiting)}"
            )
            time.sleep(JOIN_POLL_SECONDS)
        first = plan.phases[0][1]
        cluster_plan.require_nodes(self.profile, cluster, first.memory, ray_dashboard_port(self.profile, first.config))

    def gate(self, plan: PreflightPlan) -> None:
        # the record the rehearsal wrote after its `up` (the site's is of before it): read again, on the site's device
        # and cluster (stack.resolved.reread)
        target = resolve_target("docker", self.profile.name, None, verb="train", site=reread(self.site))
        train_launch.host_gate(train_launch.TrainRequest(task=plan.task), target, plan.phases[0][1], self.profile)


def _engine_urls(profile: Profile, cluster: Cluster = cluster_mod.SINGLE) -> list[str]:
    """Every engine the weight sync must reach: this node's on one node, every node's (cluster address) at NODES>1."""
    if cluster.multi:
        return cluster_mod.engine_urls(profile, cluster)
    return [f"http://127.0.0.1:{profile.engine_port(i)}" for i in range(profile.engine_count)]


def weight_versions(node: Node, profile: Profile, cluster: Cluster = cluster_mod.SINGLE) -> dict[str, Any]:
    code, out = node.trainer(shlex.join(["python3", "-c", VERSIONS_SCRIPT, *_engine_urls(profile, cluster)]))
    try:
        return json.loads(out.strip().splitlines()[-1]) if code == 0 else {}
    except (json.JSONDecodeError, IndexError):
        return {}


def hf_config(node: Node, model_path: str) -> dict[str, Any]:
    """The weights' config.json, read inside the trainer ({} when unreadable: nothing to compare)."""
    code, out = node.trainer(f"cat {shlex.quote(model_path + '/config.json')}")
    try:
        return json.loads(out) if code == 0 else {}
    except json.JSONDecodeError:
        return {}


def tracker(node: Node, checkpoint_dir: str) -> str | None:
    code, out = node.trainer(f"cat {shlex.quote(checkpoint_dir + '/latest_checkpointed_iteration.txt')}")
    return out.strip() if code == 0 else None


def rendered_isolation(plan: PreflightPlan) -> str:
    """The verifier's isolation the rendered task template gives Polar's test_command (its runtime.env)."""
    import yaml

    config = yaml.safe_load(plan.files.get("polar_config.yaml") or "{}") or {}
    env = ((config.get("polar_task_template") or {}).get("runtime") or {}).get("env") or {}
    return str(env.get(verifier_knobs.ISOLATION) or "namespaces")


def refuse_if_up(site: Resolved) -> None:
    """STATE while a profile is up (the site's record): the rehearsal brings the stack up with the small model
    itself."""
    up = site.docker_record
    if up:
        raise StackError(
            f"make preflight needs the stack down (profile {up.get('profile')} is up): the engines load the model "
            "when they start; run `make down`, then `make preflight`.",
            ExitCode.STATE,
        )


def run(
    profile: Profile,
    plan: PreflightPlan,
    site: Resolved,
    *,
    node: Node | None = None,
    clock: Callable[[], float] = time.monotonic,
    progress: Callable[[str], None] = lambda m: print(f"preflight: {m}", file=sys.stderr),
) -> dict[str, Any]:
    """The rehearsal (module docstring) on the site's device and cluster, from the record the site read."""
    node = node or Node(profile, site)
    refuse_if_up(site)
    os.environ.update(plan.stack_env)  # the small model for `make up` (environment overrides configs/stack.env)
    # Until this rehearsal passes, no earlier pass of this profile counts: a run stopped half-way leaves a failure.
    rehearsal_record.write(profile, {"passed": False}, plan.report_path, cluster=plan.cluster, sets=plan.sets)
    _require_small_model(profile, plan, site.cpu)
    out = train_run_dir() / plan.run_id
    phases: dict[str, float] = {}
    evidence: dict[str, Any] = {}
    started = clock()
    _bring_up(node, profile, plan, progress, site.cpu)
    try:
        if plan.cluster.multi:  # every other node's `make up`, then the cluster check (Node.join)
            node.join(plan, progress)
        phases["up"] = clock() - started
        _before_jobs(node, profile, plan, out, evidence, progress, site)
        failed = _run_jobs(node, profile, plan, out, evidence, phases, clock, progress)
        # The small model's evidence is on disk before anything is removed or the 7B's parts start (replaced below).
        provisional = {**evidence, "seven_b": {"skipped": "the rehearsal stopped before the 7B's parts"}}
        _write_report(out, plan, profile, provisional)
    finally:
        _take_down(node, profile, plan, progress, site.cpu)
    evidence["seven_b"] = _seven_b_evidence(node, profile, plan, failed, phases, clock, progress, site.cpu)
    result = _write_report(out, plan, profile, evidence)
    rehearsal_record.write(profile, result, plan.report_path, cluster=plan.cluster, sets=plan.sets)
    return result


def _require_small_model(profile: Profile, plan: PreflightPlan, cpu: bool) -> None:
    """assets.check_before_up with the rehearsal's model: a missing one is named with the `make model` that fetches
    it (plain `make model` would fetch the real model). `cpu`: the site's device."""
    try:
        assets.check_before_up(profile, cpu=cpu)
    except StackError as exc:  # plain `make model` would fetch the real model: name the rehearsal's
        if exc.code != ExitCode.ASSETS_MISSING or assets.MODEL_MARKER not in exc.message:
            raise
        raise StackError(
            f"make preflight needs the weights of {plan.stack_env['MODEL_NAME']} in the models volume (no "
            f"{assets.MODEL_MARKER} at {plan.stack_env['MODEL_PATH']}): run `make model "
            f"MODEL_NAME={plan.stack_env['MODEL_NAME']} MODEL_PATH={plan.stack_env['MODEL_PATH']}` first"
            + ("" if "sandbox" not in exc.message else ", and `make sif`")
            + ".",
            ExitCode.ASSETS_MISSING,
        ) from None


def _bring_up(node: Node, profile: Profile, plan: PreflightPlan, progress: Callable[[str], None], cpu: bool) -> None:
    """`up` of the profile with the small model (ENVIRONMENT when it fails), recorded as the docker runtime's state
    (of the site's device, `cpu`)."""
    progress(f"bringing {profile.name} up with {plan.stack_env['MODEL_NAME']}")
    if (
        plan.cluster.multi
    ):  # the session first, and the other nodes asked now: the head's `up` may wait for their engines
        node.open_session(plan, progress)
    if node.compose(UP_ARGS) != 0:
        raise StackError(
            f"docker compose up failed for profile {profile.name}; see the output above.", ExitCode.ENVIRONMENT
        )
    docker_state.write(profile, cpu=cpu)


def _before_jobs(
    node: Node,
    profile: Profile,
    plan: PreflightPlan,
    out: Path,
    evidence: dict[str, Any],
    progress: Callable[[str], None],
    site: Resolved,
) -> None:
    """Once the stack is up, before the first job: the smoke gate, the task data and the plan's files, the sandbox
    probe (in the site's trainer), SHARED_DIR (NODES>1), the disk space, and slime's model script against the weights'
    config."""
    node.gate(plan)
    tasks.prepare(
        plan.task,
        out / "tasks",
        ids=plan.task_ids,
        tasks_dir_in_trainer=f"{TRAINER_RUN_DIR}/{plan.run_id}/tasks",
        max_prompt_tokens=int(plan.phases[0][1].config["grpo"]["rollout_max_prompt_len"]),
    )
    for file_name, text in plan.files.items():
        (out / file_name).write_text(text)
    sandbox_probe.check_in_trainer(profile, site)
    if plan.cluster.multi:  # SHARED_DIR is one directory on every node, before anything writes to it
        evidence["shared_dir"] = prove_shared_dir(node, plan, progress)
    check_space(node, plan, progress)
    # The probe passed: the verifier, run through the agent sandbox as Polar's evaluator runs it, printed PASSED
    # for the canonical HumanEval/0 (reward 1) and FAILED for a wrong answer (reward 0); no_mixed_rewards uses it.
    evidence["reward_path"] = {
        "task": "HumanEval/0",
        "canonical_reward": 1.0,
        "wrong_reward": 0.0,
        # what the task's runtime.env gives Polar's test_command (polarstack.stack.verifier_knobs): `none` is named
        "isolation": rendered_isolation(plan),
    }
    mismatched = preflight.config_mismatches(plan.model, hf_config(node, plan.stack_env["MODEL_PATH"]))
    if mismatched:
        raise StackError(
            f"slime's scripts/models/qwen2.5-{plan.size}.sh does not describe {plan.stack_env['MODEL_PATH']}: "
            f"{'; '.join(mismatched)}; choose another model.size in configs/train/preflight.yaml.",
            ExitCode.REHEARSAL_FAILED,
        )


def _run_jobs(
    node: Node,
    profile: Profile,
    plan: PreflightPlan,
    out: Path,
    evidence: dict[str, Any],
    phases: dict[str, float],
    clock: Callable[[], float],
    progress: Callable[[str], None],
) -> str:
    """Both jobs in order (the resumed one under the supervisor), each engine's weight_version and the checkpoint
    tracker after each, until one fails; what they left goes into `evidence`. Returns why a job failed ("" when
    none did)."""
    versions = {"before": weight_versions(node, profile, plan.cluster)}
    failed = ""
    checkpoint: dict[str, Any] = {}
    rollouts: list[dict[str, Any]] = []
    logs = []
    for name, phase in plan.phases:
        progress(f"job {name}")
        node.release_workers(phase.config)
        began = clock()
        run_dir = f"{TRAINER_RUN_DIR}/{plan.run_id}"
        if name == "resume":
            code = _supervised(node, plan, phase, run_dir, evidence)
        else:
            code, _ = node.trainer(f"bash {run_dir}/launch-{name}.sh > {run_dir}/job-{name}.log 2>&1")
        phases[name] = clock() - began
        log = out / f"job-{name}.log"
        logs.append(log.read_text(errors="replace") if log.is_file() else "")
        seen = rehearsal_report.read_rollouts(out / SUMMARY_NAME)
        rollouts += [{**row, "phase": name} for row in seen[len(rollouts) :]]
        versions[f"after_{name}"] = weight_versions(node, profile, plan.cluster)
        checkpoint[f"after_{name}"] = tracker(node, phase.checkpoint_dir)
        if code != 0:
            abort = out / "gate-abort.txt"
            reason = abort.read_text().strip() if abort.is_file() else f"exit {code}, see {log}"
            progress(f"job {name} failed ({reason}); judging what it left")
            failed = f"job {name} failed ({reason})"
            break
    evidence.update(
        engines=_engine_urls(profile, plan.cluster),  # the weight_sync class judges every one of them
        rollouts=rollouts,
        slime=rehearsal_report.parse_slime_log("\n".join(logs)),
        weight_versions=versions,
        checkpoint=checkpoint,
        phases=phases,
        first=_rollouts(plan, 0),
        after_resume=_rollouts(plan, 1) - _rollouts(plan, 0),
        expected_steps=_rollouts(plan, 1),
        **plan.report_settings,
    )
    return failed


def _write_report(out: Path, plan: PreflightPlan, profile: Profile, evidence: dict[str, Any]) -> dict[str, Any]:
    """The report judged from `evidence`, written with it to rehearsal-report.json; returns the report."""
    result = {**rehearsal_report.report(evidence), "plan": plan.run_id, "profile": profile.name}
    (out / "rehearsal-report.json").write_text(json.dumps({**result, "evidence": evidence}, indent=1) + "\n")
    return result


def _take_down(node: Node, profile: Profile, plan: PreflightPlan, progress: Callable[[str], None], cpu: bool) -> None:
    """Always, however the rehearsal ended: its checkpoints removed (the trainer still up), then the stack down and
    its record (of the site's device, `cpu`) cleared."""
    remove_checkpoints(node, plan, progress)
    progress(f"taking {profile.name} down (the real run starts with `make up`)")
    node.compose(["down"])
    docker_state.clear(cpu=cpu)


def _seven_b_evidence(
    node: Node,
    profile: Profile,
    plan: PreflightPlan,
    failed: str,
    phases: dict[str, float],
    clock: Callable[[], float],
    progress: Callable[[str], None],
    cpu: bool,
) -> dict[str, Any]:
    """The 7B's parts when planned and both jobs passed (their time in phases["7b"]); else why they did not run.
    `cpu`: the site's device."""
    if plan.seven_b is None:
        return {"not_planned": "NODES>1 (the 7B's parts run on one node)"}
    if failed:
        return {"skipped": f"{failed}, so the 7B's parts did not run"}
    began = clock()
    parts = seven_b_parts(node, profile, plan, progress, cpu)
    phases["7b"] = clock() - began
    return parts


def parse_gpu_log(text: str) -> dict[str, float]:
    """nvidia-smi --query-gpu=index,memory.used --format=csv,noheader,nounits lines: the peak per GPU in decimal GB."""
    peaks: dict[str, float] = {}
    for line in text.splitlines():
        index, _, used = line.partition(",")
        try:
            gb = float(used.strip()) * 1024**2 / 1e9  # MiB
        except ValueError:
            continue
        peaks[index.strip()] = max(peaks.get(index.strip(), 0.0), gb)
    return peaks


def seven_b_parts(
    node: Node, profile: Profile, plan: PreflightPlan, progress: Callable[[str], None], cpu: bool
) -> dict[str, Any]:
    """The 7B's parts (polarstack.train.preflight.seven_b), after the small model's stack went down: the profile up
    again with the real run's model, the train-only step (launch-7b-step.sh) with its GPU samples, the reload into
    engine-0, and the stack down. Returns the evidence the report's seven_b_* classes judge. `cpu`: the site's
    device (the assets' check and the record)."""
    seven = plan.seven_b
    assert seven is not None
    out = train_run_dir() / plan.run_id
    run_dir = f"{TRAINER_RUN_DIR}/{plan.run_id}"
    record: dict[str, Any] = {
        "estimate_gb": round(seven.memory.trainer_gb, 3),
        "capacity_gb": seven.memory.capacity.gpu_gb,
        "sample_ms": GPU_SAMPLE_MS,
        "added_seconds_estimate": seven.added_seconds,
    }
    os.environ.update(seven.stack_env)  # `make up`'s model: the real run's
    try:
        assets.check_before_up(profile, cpu=cpu)
    except StackError as exc:
        return {**record, "skipped": f"the 7B cannot come up: {exc.message}"}
    progress(f"bringing {profile.name} up with {seven.stack_env['MODEL_NAME']} for the 7B's parts")
    if node.compose(UP_ARGS) != 0:
        node.compose(["down"])
        return {**record, "skipped": f"docker compose up with {seven.model} failed (see the output above)"}
    docker_state.write(profile, cpu=cpu)
    try:
        progress(f"the 7B's train-only step ({seven.prompts * seven.per_prompt} synthetic traces)")
        code, _ = node.trainer(f"bash {run_dir}/launch-7b-step.sh > {run_dir}/job-7b-step.log 2>&1")
        log = out / "job-7b-step.log"
        steps = rehearsal_report.parse_slime_log(log.read_text(errors="replace") if log.is_file() else "")["steps"]
        gpu_log = out / SEVEN_B_GPU_LOG
        record.update(
            exit=code,
            steps=len(steps),
            peak_gpu_gb={
                k: round(v, 2) for k, v in parse_gpu_log(gpu_log.read_text() if gpu_log.is_file() else "").items()
            },
        )
        progress(f"the 7B's reload into {seven.engine_url}")
        script = ["python3", "-c", RELOAD_SCRIPT, seven.engine_url, seven.hf_checkpoint, SEVEN_B_RELOAD_VERSION]
        code, text = node.trainer(shlex.join(script))
        try:
            record["reload"] = json.loads(text.strip().splitlines()[-1]) if code == 0 else {"message": f"exit {code}"}
        except (json.JSONDecodeError, IndexError):
            record["reload"] = {"message": "no answer from the reload script"}
    finally:
        progress(f"taking {profile.name} down again")
        node.compose(["down"])
        docker_state.clear(cpu=cpu)
    return record


def check_space(node: Node, plan: PreflightPlan, progress: Callable[[str], None]) -> None:
    """make train's disk check (polarstack.train.retention) for the rehearsal's saves and weight-sync copy, read
    inside the trainer once it is up (the volumes are mounted there only)."""
    last = plan.phases[-1][1]  # every rollout of both jobs: all the saves the rehearsal makes
    code, out = node.trainer(shlex.join([*retention.DF_AVAIL, cluster_plan.checkpoint_volume(plan.cluster)]))
    free = retention.parse_df(out) if code == 0 else None
    if free is None:
        progress("the checkpoints volume's free space could not be read; not checked")
        return
    problem = retention.disk_problem(last.config, free, False, weight_sync_on_disk=weight_sync_on_disk(last.train_args))
    if problem:
        raise StackError(f"refusing to rehearse {plan.run_id}: {problem}.", ExitCode.ENVIRONMENT)
    progress(f"{retention.sentence(last.config)}; {free / 1e9:,.1f} GB free")


def prove_shared_dir(node: Node, plan: PreflightPlan, progress: Callable[[str], None]) -> dict[str, Any]:
    """At NODES>1: a Ray job from the head's trainer writes a nonce into SHARED_DIR and one task pinned to each node
    reads it and writes its own file back (polarstack.checks.shared_probe); REHEARSAL_FAILED naming the first node that
    does not share it. Returns the probe's result (no nonce in it, only its hash)."""
    cluster = plan.cluster
    run_dir = f"{TRAINER_RUN_DIR}/{plan.run_id}"
    first = plan.phases[0][1]
    dashboard = cluster_plan.dashboard_url(cluster, first.config["ray"]["dashboard_port"])  # set by build_plan
    directory = f"{cluster_plan.shared_dir(cluster, 'the rehearsal')}/{cluster_plan.NODE_REPORTS}/probe-{plan.run_id}"
    submit = ["ray", "job", "submit", f"--address={dashboard}", "--"]
    submit += ["python3", "-m", "polarstack.checks.shared_probe", "--dir", directory]
    progress(f"proving SHARED_DIR on {cluster.nodes} nodes")
    code, out = node.trainer(f"{shlex.join(submit)} 2>&1 | tee {run_dir}/job-shared-dir.log")
    result = None
    for line in reversed(out.splitlines()):
        if line.startswith("{") and '"nodes"' in line:
            try:
                result = json.loads(line)
            except json.JSONDecodeError:
                result = None
            break
    problems = (
        shared_probe.problems(result, list(cluster.addrs))
        if code == 0
        else [f"the shared-directory probe job failed (exit {code}; {run_dir}/job-shared-dir.log)"]
    )
    if problems:
        raise StackError(
            f"SHARED_DIR={cluster.shared_dir} is not one directory on every node: {problems[0]}; mount the same "
            "filesystem at the same path on every node (docs/multi-node.md, Weights and checkpoints).",
            ExitCode.REHEARSAL_FAILED,
        )
    progress(f"SHARED_DIR is shared by {', '.join(cluster.addrs)}")
    return result or {}


def remove_checkpoints(node: Node, plan: PreflightPlan, progress: Callable[[str], None]) -> None:
    """Each rehearsal saves into a checkpoint run of its own (preflight.build: checkpoint.run_name = the run id) that
    nothing resumes; its report and job logs stay under .run/train/<run>/, its saves (keep_last of them, 14 B x
    parameters each) would stay on the checkpoints volume for good. Runs while the trainer is still up."""
    for directory in sorted({phase.checkpoint_dir for _, phase in plan.phases}):
        if not directory.rstrip("/").endswith(f"/{plan.run_id}"):  # only this rehearsal's own directory
            continue
        code, _ = node.trainer(f"rm -rf -- {shlex.quote(directory)}")
        progress(
            f"removed the rehearsal's checkpoints {directory}"
            if code == 0
            else f"could not remove {directory} (exit {code}); remove it inside the trainer to free its space"
        )


def _supervised(node: Node, plan: PreflightPlan, phase: Any, run_dir: str, evidence: dict[str, Any]) -> int:
    """Job 2 under polarstack.train.supervise (max_restarts 1), its first attempt made to crash after the job ended;
    the attempts and any stop go into evidence["supervisor"]. Returns 0 or the last attempt's exit code."""
    log = f"{run_dir}/job-resume.log"
    abort = train_run_dir() / plan.run_id / "gate-abort.txt"
    attempts: list[int] = []
    record: dict[str, Any] = {"injected_exit": INJECTED_EXIT, "attempts": []}
    evidence["supervisor"] = record

    def attempt(resume: bool) -> int:
        first = not attempts
        if not first:
            node.release_workers(phase.config)  # slime registers the engines again at every job's start
        inject = (
            f"; rc=$?; if [ $rc -eq 0 ]; then echo {shlex.quote(INJECTED_LINE)} >> {log}; exit {INJECTED_EXIT}; fi; "
            "exit $rc"
            if first
            else ""
        )
        code, _ = node.trainer(f"bash {run_dir}/launch-resume.sh {'>' if first else '>>'} {log} 2>&1{inject}")
        attempts.append(code)
        record["attempts"].append({"resume": resume, "exit": code, "checkpoint": None})  # until the supervisor's own
        return code

    try:
        outcome = supervise.supervise(
            attempt,
            lambda: supervise.parse_iteration(tracker(node, phase.checkpoint_dir) or ""),
            lambda: abort.read_text().strip() if abort.is_file() else None,
            max_restarts=1,
            resume=True,
            describe=f"job resume of rehearsal {plan.run_id}",
            logs=str(train_run_dir() / plan.run_id / "job-resume.log"),  # launch.sh's and the job's output, on the host
            log=lambda m: None,
        )
        record["attempts"] = outcome.attempts
        return 0
    except StackError as exc:
        record["error"] = exc.message
        return attempts[-1] if attempts and attempts[-1] else 1


def _rollouts(plan: PreflightPlan, index: int) -> int:
    args = plan.phases[index][1].train_args
    return int(args[args.index("--num-rollout") + 1])


__all__ = ["run", "Node", "weight_versions", "tracker"]
