"""The reward in the namespace shape of Polar's sessions, before anything is brought up (issue 32 point 3).

The trainer runs as root without CAP_SYS_ADMIN, and apptainer (APPTAINER_RELEASE) then starts every Polar session in a user
namespace that maps only uid 0 onto the trainer's root (`getuid() -> uid, 1`, internal/pkg/runtime/launch/
launcher_linux.go at APPTAINER_RELEASE), with a mount namespace of its own and no PID namespace (the stack does not
set POLAR_APPTAINER_ISOLATE_PID). `unshare --user --map-root-user --mount --fork` reproduces that shape without a SIF.
`make up` (both runtimes), `make preflight` before it brings anything up, and `make train` beside its in-trainer
sandbox probe run the task's own test_command (polarstack.reward.tasks.task_template) in that shape on HumanEval/0's
canonical answer and on a wrong one, with the verifier knobs the task's runtime.env carries, and refuse in seconds
(ExitCode.ENVIRONMENT, the sandbox probe's code) when the reward could not tell them apart:
- docker runtime: inside the trainer image with compose.yaml's security options (`compose run --rm --no-deps trainer`,
  or `compose exec trainer` where the trainer is up, as for `make train`);
- local runtime: on this host, the same command line.
"""

from __future__ import annotations

import contextlib
import shlex
import shutil
import subprocess
import sys
import uuid

from polarstack import paths
from polarstack.checks import sandbox_probe
from polarstack.errors import ExitCode, StackError
from polarstack.pins import pins
from polarstack.stack import compose, host_check, ray_auth, verifier_knobs

# apptainer's shape (APPTAINER_RELEASE) for root without CAP_SYS_ADMIN: a user namespace mapping uid 0 only, and a mount namespace.
UNSHARE = ("unshare", "--user", "--map-root-user", "--mount", "--fork")
SHAPE = "root in a user namespace that maps only uid 0 (uid_map `0 0 1`), with its own mount namespace"
SHAPE_MAP = "0 0 1"  # /proc/self/uid_map inside, whitespace squeezed
TIMEOUT = 120.0  # seconds for the whole probe: two verifications of 10 s each, a container's start


def probe_script(probe_dir: str, env: dict[str, str]) -> str:
    """The shell script the probe runs (in the trainer or on this host): the shape is created first (`shape-failed:`
    when it cannot be), then, inside it, the uid map (`uid-map: ...`) and the task's test_command for each case with
    its session directory at `probe_dir/<case>` (`verifier-<case>: <line>`), in the environment runtime.env gives."""
    inner = ['printf "uid-map: %s\\n" "$(tr -s " " < /proc/self/uid_map | sed "s/^ //")"']
    exports = " ".join(f"{key}={shlex.quote(value)}" for key, value in sorted(env.items()))
    for case in sandbox_probe.PROBE_CASES:
        command = sandbox_probe.probe_command().replace(sandbox_probe.SESSION_MOUNT, f"{probe_dir}/{case}")
        run = f"env {exports} sh -c {shlex.quote(command)}" if exports else command
        inner.append(f"({run}) 2>&1 | sed 's/^/verifier-{case}: /'")
    unshare = shlex.join(UNSHARE)
    return "\n".join(
        [
            "command -v unshare >/dev/null || { echo 'shape-failed: no unshare (util-linux) here'; exit 0; }",
            f"if ! out=$({unshare} true 2>&1); then "
            'echo "shape-failed: $(printf \'%s\' "$out" | tail -n 1)"; exit 0; fi',
            f"{unshare} sh -c {shlex.quote(chr(10).join(inner))}",
        ]
    )


def parse(stdout: str) -> tuple[str | None, str | None, dict[str, list[str]]]:
    """(why the shape could not be made, the uid map seen inside, the verifier's lines per case)."""
    failed, uid_map = None, None
    outputs: dict[str, list[str]] = {case: [] for case in sandbox_probe.PROBE_CASES}
    for line in stdout.splitlines():
        line = line.rstrip()
        case = next((c for c in sandbox_probe.PROBE_CASES if line.startswith(f"verifier-{c}: ")), None)
        if case is not None:
            outputs[case].append(line.removeprefix(f"verifier-{case}: ").strip())
        elif line.startswith("shape-failed:"):
            failed = line.removeprefix("shape-failed:").strip()
        elif line.startswith("uid-map:"):
            uid_map = " ".join(line.removeprefix("uid-map:").split())
    return failed, uid_map, outputs


def judge(where: str, stdout: str, env: dict[str, str]) -> str:
    """The one sentence of a refusal (StackError, ENVIRONMENT), or the line to print when the reward holds."""
    failed, uid_map, outputs = parse(stdout)
    if failed is not None:
        host = host_check.userns_problems()
        raise StackError(
            f"cannot reproduce the namespace shape of Polar's sessions {where} ({SHAPE}; `{shlex.join(UNSHARE)}` "
            f"failed: {failed[:160]}); "
            + (
                host[0] + "."
                if host
                else "apptainer would fail the same way: the trainer needs seccomp unconfined (compose.yaml) and a host "
                'that allows user namespaces (docs/gpu-node.md, "The agent sandbox").'
            ),
            ExitCode.ENVIRONMENT,
        )
    if uid_map != SHAPE_MAP:
        raise StackError(
            f"the verifier probe {where} ran with uid_map {uid_map!r}, not {SHAPE_MAP!r} ({SHAPE}), so it did not "
            "test the shape Polar's sessions run in; report it with the output of "
            f"`{shlex.join(UNSHARE)} cat /proc/self/uid_map`.",
            ExitCode.ENVIRONMENT,
        )
    shape = f"{SHAPE}, as apptainer {pins()['APPTAINER_RELEASE']} runs them for the trainer's root"
    fix = (
        f"fix: a verifier that isolates in that shape, or {verifier_knobs.ISOLATION}=none in configs/stack.env or the "
        "environment (unisolated candidates, trusted completions only; docs/tasks.md)"
    )
    refused = sandbox_probe.not_verified(outputs)
    if refused is not None:
        raise StackError(
            f"refusing before anything starts: the task's verifier refused to verify {sandbox_probe.PROBE_TASK_ID} in "
            f"the namespace shape of Polar's sessions {where} ({shape}): {refused[:240].rstrip('.')}; so every "
            f"reward would be 0 and GRPO would learn nothing; {fix}.",
            ExitCode.ENVIRONMENT,
            details=outputs,
        )
    why = sandbox_probe.verdict(outputs)
    if why is not None:
        raise StackError(
            f"refusing before anything starts: in the namespace shape of Polar's sessions {where} ({shape}), {why}; "
            f"{fix}.",
            ExitCode.ENVIRONMENT,
            details=outputs,
        )
    limits = next((x for x in outputs["good"] if "verifier: limits" in x), "")
    opted_out = env.get(verifier_knobs.ISOLATION) == "none"
    return (
        f"polarstack: the task's verifier in the namespace shape of Polar's sessions {where} (uid_map {uid_map}): "
        f"PASSED {sandbox_probe.PROBE_NAME} for the canonical {sandbox_probe.PROBE_TASK_ID}, FAILED for a wrong one"
        + (f"; {limits.split('limits:', 1)[-1].strip()}" if limits else "")
        + (f"; {verifier_knobs.opt_out_sentence()}" if opted_out else "")
    )


def check_docker(profile, where: compose.Where, *, running: bool = False) -> None:
    """In the trainer image with compose.yaml's security options: `compose run --rm --no-deps trainer` before the
    stack is up (make up, make preflight), `compose exec trainer` in the running one (make train). `where`: the
    caller's device and cluster (the site)."""
    env = verifier_knobs.verifier_env()
    probe = f"shape-probe-{uuid.uuid4().hex[:8]}"
    host_dir = paths.run_dir() / "train" / probe  # mounted at TRAINER_RUN_DIR in the trainer
    sandbox_probe.write_probe(host_dir)
    script = probe_script(f"{paths.TRAINER_RUN_DIR}/{probe}", env)
    try:
        if running:
            args = ["exec", "-T", "trainer", "sh", "-c", script]
        else:  # the trainer's mounts include the Ray token file, which must exist (make up writes it anyway)
            ray_auth.prepare(compose.token_file(), head=where.cluster.head)
            args = ["run", "--rm", "--no-deps", "-T", "trainer", "sh", "-c", script]
        proc = compose.run_compose(profile, args, where=where, capture=True)
    finally:
        shutil.rmtree(host_dir, ignore_errors=True)
    if proc.returncode != 0:
        raise StackError(
            f"cannot run the verifier probe in the trainer image of profile {profile.name} (docker compose "
            f"{args[0]} exit {proc.returncode}: {compose.first_line(proc)}); build it with `make build`.",
            ExitCode.ENVIRONMENT,
        )
    print(judge("in the trainer image", proc.stdout, env), file=sys.stderr)


def check_local() -> None:
    """On this host (the local runtime), the same command line as in the trainer."""
    env = verifier_knobs.verifier_env()
    host_dir = paths.run_dir() / "shape-probe" / uuid.uuid4().hex[:8]
    sandbox_probe.write_probe(host_dir)
    try:
        proc = subprocess.run(
            ["sh", "-c", probe_script(str(host_dir), env)], capture_output=True, text=True, timeout=TIMEOUT
        )
    except subprocess.TimeoutExpired:
        raise StackError(
            f"the verifier probe on this host did not finish within {TIMEOUT:g} s; the machine is overloaded or "
            "the verifier hangs: rerun, then `polarstack verify --task humaneval`.",
            ExitCode.ENVIRONMENT,
        ) from None
    finally:
        shutil.rmtree(host_dir, ignore_errors=True)
        with contextlib.suppress(OSError):  # .run/shape-probe itself, once no other probe uses it
            host_dir.parent.rmdir()
    print(judge("on this host", proc.stdout, env), file=sys.stderr)
