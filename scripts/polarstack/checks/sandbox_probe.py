"""The in-trainer sandbox probe before `make train`: the agent sandbox started the way Polar starts it, and the
task's verifier run in it as Polar's evaluator runs it (polarstack.checks.sandbox_probe.check_in_trainer calls it)."""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from polarstack import paths
from polarstack.errors import ExitCode, StackError
from polarstack.polar import harness_preset
from polarstack.reward import sandbox, tasks
from polarstack.reward.tasks import task_template
from polarstack.reward.verifier import bundle
from polarstack.reward.verifier.verdict import refusal_note_text, refused
from polarstack.stack import assets, compose, host_check, verifier_knobs

# The sandbox's paths (SIF_PATH, AGENT_CLI_DIR, ...) belong to polarstack.reward.sandbox, Polar's direct-exec
# apptainer mode and the sentence naming what is missing to polarstack.stack.assets; both are read at call time.

# One line per variable of a session's environment: its name, with `@` appended for a proxy URL holding credentials.
PROXY_AWK = (
    '{ n = $0; sub(/=.*/, "", n); v = substr($0, length(n) + 2); '
    'if (n ~ /_(proxy|PROXY)$/ && v ~ /^[A-Za-z][A-Za-z0-9+.-]*:\\/\\/[^\\/]*@/) print n "@"; else print n }'
)
SESSION_MOUNT = "/polar/session"  # Polar binds each session's directory here (runtime_session_dir)
CONTROL_MOUNT = "/polar/runtime-control"  # Polar's broker binds its own runtime sources here, read-only
PROBE_NAME = "probe"  # the --name the probe passes to the verifier: it must print `PASSED probe` / `FAILED probe`
PROBE_TASK_ID = "HumanEval/0"
PROBE_CASES = ("good", "bad")  # the canonical solution must pass, the wrong one must fail


def polar_exec_args(
    session_dir: str, control_dir: str, command: str, task: str = "humaneval", environment: dict | None = None
) -> list[str]:
    """The `apptainer exec` command line Polar's runtime builds in direct mode for this stack's task template
    (ApptainerRuntime._runtime_options and .exec, configs/upstream/polar-apptainer.json), running `command`, with
    Polar's environment `environment` (default: what the stack sets wherever Polar runs, assets.sandbox_mode_env)."""

    environment = assets.sandbox_mode_env() if environment is None else environment

    runtime = task_template(task)["runtime"]
    fill = {
        "{args.polar_agent_cli_dir}": sandbox.AGENT_CLI_DIR,
        "{args.polar_apptainer_image_dir}": sandbox.SANDBOX_DIR,
    }

    def resolve(text: str) -> str:
        for key, value in fill.items():
            text = text.replace(key, value)
        return text

    options = ["--overlay", f"{session_dir}/overlay", "--no-mount", assets.no_mount(environment)]
    options += assets.runtime_flags(environment)
    if runtime.get("network") not in (None, "host"):
        options += ["--net", "--network", str(runtime["network"])]
    options += ["--bind", f"{session_dir}:{SESSION_MOUNT}", "--bind", f"{control_dir}:{CONTROL_MOUNT}:ro"]
    for volume in (runtime.get("kwargs") or {}).get("volumes", []):
        options += ["--bind", resolve(volume)]
    # runtime.env as the rendered plan gives it to Polar (polarstack.train.plan): the verifier's knobs included, since
    # under --cleanenv a session gets nothing else of the trainer's environment.
    env = {**(runtime.get("env") or {}), **verifier_knobs.verifier_env()}
    exports = "".join(f"export {key}={shlex.quote(str(env[key]))}; " for key in ("HOME", "PATH") if key in env)
    workdir = runtime.get("workdir") or SESSION_MOUNT
    return [
        "apptainer",
        "exec",
        *options,
        resolve(runtime["image"]),
        "env",
        *[f"{k}={v}" for k, v in env.items()],
        "bash",
        "-lc",
        f"{exports}cd {shlex.quote(workdir)} && {command}",
    ]


def probe_command(task: str = "humaneval") -> str:
    """The task's evaluator test_command (polarstack.reward.tasks.task_template), with the probe's test name."""

    command = task_template(task)["evaluator"]["config"]["test_command"]
    return command.replace(f"--name {task}_verifier", f"--name {PROBE_NAME}")


def write_probe(directory: Path) -> None:
    """Two evaluation sessions for HumanEval/0, laid out as Polar's eval_prepare leaves them under the session
    directory (eval/verifier.py, eval/problem.json, workspace/solution.py): `good` holds the canonical solution,
    `bad` one that returns False for every input."""
    import json

    problem = next(p for p in tasks.load_humaneval() if p["task_id"] == PROBE_TASK_ID)
    solutions = {
        "good": problem["prompt"] + problem["canonical_solution"],
        "bad": problem["prompt"] + "    return False\n",
    }
    for case, text in solutions.items():
        session = directory / case
        for sub in ("eval", "workspace", "home"):
            (session / sub).mkdir(parents=True, exist_ok=True)
        bundle.write(session / "eval" / "verifier.py")  # the file tasks prepare writes to eval/verifier.py
        (session / "eval" / "problem.json").write_text(json.dumps(tasks.verifier_problem_of("humaneval", problem)))
        (session / "workspace" / "solution.py").write_text(text)
    (directory / "control").mkdir(parents=True, exist_ok=True)


def _session_dir(name: str) -> str:
    """A placeholder for the session directory `name` the probe script makes at run time (see _probe_script)."""
    return "@{%s}" % name


def _probe_script(probe_dir: str) -> str:
    """Presence, the mode, the agent CLI, then the verifier on both solutions, each in its own sandbox started the
    way Polar starts it, in session directories made where and as Polar makes them: Polar's gateway makes each with
    `tempfile.mkdtemp(prefix="session-<id[:8]>-")` in the trainer's temporary directory ($TMPDIR, else /tmp;
    GatewayNodeManager.dispatch, configs/upstream/polar-apptainer.json session_dir), then artifacts/, logs/agent/ and
    (start()) overlay/ in it. The files write_probe laid out in the run dir are copied there. One session also looks
    for the other's hidden tests at their path in the trainer, which Polar's `--no-mount ...,tmp` must keep out.
    Output: missing names, `switch: NAME=V`, `exec-failed: ...`, `session-env: NAME`, `session-tmp: private|shared`,
    `verifier-<case>: <line>`."""

    cli = f"{sandbox.AGENT_CLI_DIR}/bin/{sandbox.AGENT_CLI_BIN}"
    switches = [assets.apptainer_record()[f"{name}_env"] for name in assets.SWITCHES]
    control = f"{probe_dir}/control"
    sessions = ("cli", *PROBE_CASES)

    def run(args: list[str]) -> str:  # the binary Polar resolves (_resolve_binary), then its arguments
        # shlex.join single-quotes every word holding a placeholder ("{" is not a safe character), so closing the
        # quote around the shell variable puts the directory made at run time in its place, inside or outside a word.
        text = '"$binary" ' + shlex.join(args[1:])
        for name in sessions:
            text = text.replace(_session_dir(name), f"'\"${name}\"'")
        return text

    version = run(
        polar_exec_args(
            _session_dir("cli"), control, f"{sandbox.AGENT_CLI_MOUNT}/bin/{sandbox.AGENT_CLI_BIN} --version"
        )
    )
    hidden = f"{_session_dir('bad')}/eval/problem.json"  # another session's hidden tests, at their trainer path
    look = f"if test -e {hidden}; then echo shared; else echo private; fi"
    mkdtemp = "import sys, tempfile; print(tempfile.mkdtemp(prefix=sys.argv[1]))"  # Polar's call, its interpreter
    lines = [
        "command -v apptainer >/dev/null || echo apptainer",
        f"[ -e {sandbox.SIF_PATH} ] || echo sif",
        f"[ -x {cli} ] || echo agent-cli",
        *(f'echo "switch: {name}=${{{name}:-}}"' for name in switches),
        # ApptainerRuntime._resolve_binary: POLAR_APPTAINER_BIN, /usr/bin/apptainer, /bin/apptainer, PATH.
        'binary="${POLAR_APPTAINER_BIN:-}"',
        'for c in /usr/bin/apptainer /bin/apptainer; do [ -n "$binary" ] || { [ -f "$c" ] && binary="$c"; }; done',
        '[ -n "$binary" ] || binary=apptainer',
        f"if command -v apptainer >/dev/null && [ -e {sandbox.SIF_PATH} ] && [ -x {cli} ]; then",
        *(f"  {name}=$(python3 -c {shlex.quote(mkdtemp)} session-probe-{name}-)" for name in sessions),
        '  trap \'rm -rf "$cli" "$good" "$bad"\' EXIT',
        # What the probe's verifier sessions hold (eval/, workspace/, home/), then what Polar's dispatch and start()
        # add; the cli session gets the workdir and HOME the template's `prepare` makes.
        *(f'  cp -a {probe_dir}/{case}/. "${case}"/' for case in PROBE_CASES),
        '  mkdir -p "$cli/home" "$cli/workspace"',
        '  for s in "$cli" "$good" "$bad"; do mkdir -p "$s/artifacts" "$s/logs/agent" "$s/overlay"; done',
        f'  out=$({version} 2>&1) && echo "sandbox-ok: $out" >&2 '
        '|| echo "exec-failed: $(printf \'%s\' "$out" | tail -n 1)"',
        # The names of the session's environment (never a value): what apptainer passed in besides Polar's `env K=V`.
        # apptainer passes every proxy variable even with --cleanenv (configs/upstream/apptainer-userns.json
        # environment): one whose URL carries user:password@ is marked NAME@, its value still never printed.
        f"  {run(polar_exec_args(_session_dir('cli'), control, 'env'))} 2>/dev/null | awk {shlex.quote(PROXY_AWK)} "
        "| sed 's/^/session-env: /'",
        # APPTAINERENV_* / SINGULARITYENV_* in the trainer reach every session, --cleanenv or not (the same record).
        "  env | cut -d= -f1 | grep -E '^(APPTAINERENV|SINGULARITYENV)_' | sed 's/^/trainer-env: /'",
        f"  {run(polar_exec_args(_session_dir('good'), control, look))} 2>/dev/null | tail -n 1 "
        "| sed 's/^/session-tmp: /'",
    ]
    for case in PROBE_CASES:
        lines.append(
            f"  {run(polar_exec_args(_session_dir(case), control, probe_command()))} 2>&1 "
            f"| sed 's/^/verifier-{case}: /'"
        )
    lines.append("fi")
    return "\n".join(lines)


def not_verified(outputs: dict[str, list[str]]) -> str | None:
    """The verifier's reason when it refused in either case (verifier/verdict.py's rule, the one it writes by)."""
    for case in PROBE_CASES:
        if any(refused(line, PROBE_NAME) for line in outputs[case]):
            why = [text for text in map(refusal_note_text, outputs[case]) if text is not None]
            return why[0] if why else "no reason given"
    return None


def verdict(outputs: dict[str, list[str]]) -> str | None:
    """Why the reward would be wrong, from the verifier's output on the canonical and the wrong solution; None
    when the canonical one printed `PASSED probe` and the wrong one `FAILED probe` (and nothing else did)."""
    why = not_verified(outputs)
    if why is not None:
        return (
            f"the task's verifier refused to verify inside the agent sandbox ({why[:300]}), so it would print "
            "`FAILED <name> (not verified)` and the reward would be 0 for every sample (GRPO would learn nothing); "
            'the verifier needs its isolation (docs/tasks.md, "Where it holds": root in a user namespace mapping '
            "uid 0 alone, as apptainer gives the trainer's root, root with CAP_SYS_ADMIN, or root with CAP_SETUID "
            "and CAP_SETGID where user namespaces are allowed); the explicit opt-out, "
            "POLARSTACK_VERIFIER_ISOLATION=none in configs/stack.env (it reaches Polar's test_command), keeps the "
            "evidence protocol but runs each candidate on the sandbox's file system with its network, /tmp and "
            "/proc (trusted completions only)"
        )
    passed = {case: f"PASSED {PROBE_NAME}" in [line.strip() for line in outputs[case]] for case in PROBE_CASES}
    failed = {case: any(line.startswith(f"FAILED {PROBE_NAME}") for line in outputs[case]) for case in PROBE_CASES}
    if not passed["good"] or failed["good"]:
        last = (outputs["good"] or ["no output"])[-1]
        return (
            f"the canonical solution of {PROBE_TASK_ID} did not print `PASSED {PROBE_NAME}` when the task's "
            f"verifier ran in the agent sandbox ({last[:200]}): the reward would be 0 for every sample, so GRPO "
            "would learn nothing"
        )
    if passed["bad"] or not failed["bad"]:
        last = (outputs["bad"] or ["no output"])[-1]
        return (
            f"a wrong solution of {PROBE_TASK_ID} (`return False`) did not print `FAILED {PROBE_NAME}` when the "
            f"task's verifier ran in the agent sandbox ({last[:200]}): the reward would not tell right from wrong"
        )
    return None


@dataclass
class _ProbeOutput:
    """What the probe script printed (see _probe_script), sorted by kind of line."""

    outputs: dict[str, list[str]] = field(default_factory=lambda: {case: [] for case in PROBE_CASES})
    failed: list[str] = field(default_factory=list)  # exec-failed: apptainer could not start the sandbox
    missing: list[str] = field(default_factory=list)  # apptainer, sif, agent-cli
    switches: dict[str, str] = field(default_factory=dict)  # Polar's mode switches as the trainer has them
    session_env: set[str] = field(default_factory=set)  # the names of a session's environment (NAME@: credentials)
    session_tmp: str | None = None  # private, shared, or None when not looked at
    forced: list[str] = field(default_factory=list)  # the trainer's APPTAINERENV_* / SINGULARITYENV_*


def check_in_trainer(profile, where: compose.Where) -> None:
    """Before `make train` launches, inside the running trainer: apptainer, the SIF and the agent CLI are there,
    Polar's direct-exec mode is selected, the sandbox starts the way Polar starts it, and the task's verifier run in
    it as the evaluator runs it passes the canonical HumanEval/0 and fails a wrong one. `where`: the trainer's device
    and cluster (the caller's site)."""
    proc = _run_probe(profile, where)
    found = _parse_probe(proc.stdout)
    if found.missing:
        raise StackError(
            assets.missing_sentence("train", found.missing, assets.knobs()),
            ExitCode.ASSETS_MISSING,
            details=found.missing,
        )
    # ENVIRONMENT, not ASSETS_MISSING, from here on: everything `make sif` / `make build` provide is in place; what
    # fails is what the node and the trainer container allow (or a container created before this setting existed).
    # The probe's command line has --no-mount ...,tmp and --cleanenv only if Polar's would.
    problems = assets.mode_problems(found.switches, "the running trainer container")
    if problems:
        raise StackError(problems[0] + "; recreate it with `make up` (compose.yaml sets it).", ExitCode.ENVIRONMENT)
    _refuse_sandbox_start(found.failed)
    _refuse_agent_cli(proc.stderr)
    _refuse_shared_tmp(found.session_tmp)
    _refuse_session_env(found.session_env, found.forced)
    why = verdict(found.outputs)
    if why is not None:
        raise StackError(
            f'refusing to train: {why}; see docs/gpu-node.md, "The agent sandbox".',
            ExitCode.ENVIRONMENT,
            details=found.outputs,
        )
    _report_pass(proc.stderr, found)


def _run_probe(profile, where: compose.Where) -> subprocess.CompletedProcess:
    """The probe script run in the trainer on the two sessions write_probe lays out in the run dir (removed after);
    STATE when the trainer cannot be reached."""
    probe = f"sandbox-probe-{uuid.uuid4().hex[:8]}"
    host_dir = paths.run_dir() / "train" / probe  # the host's .run/train is mounted at TRAINER_RUN_DIR in the trainer
    write_probe(host_dir)
    try:
        proc = compose.run_compose(
            profile,
            ["exec", "-T", "trainer", "sh", "-c", _probe_script(f"{paths.TRAINER_RUN_DIR}/{probe}")],
            where=where,
            capture=True,
        )
    finally:
        shutil.rmtree(host_dir, ignore_errors=True)
    if proc.returncode != 0:
        raise StackError(
            f"cannot look inside the trainer of profile {profile.name} (exit {proc.returncode}); "
            "is the stack up? run `make up` first.",
            ExitCode.STATE,
        )
    return proc


def _parse_probe(stdout: str) -> _ProbeOutput:
    """The probe script's output, line by line by its prefix; a line without one names what is missing."""
    found = _ProbeOutput()
    for line in [line.rstrip() for line in stdout.splitlines() if line.strip()]:
        case = next((c for c in PROBE_CASES if line.startswith(f"verifier-{c}: ")), None)
        if case is not None:
            found.outputs[case].append(line.removeprefix(f"verifier-{case}: ").strip())
        elif line.startswith("exec-failed:"):
            found.failed.append(line.removeprefix("exec-failed:").strip())
        elif line.startswith("switch: "):
            name, _, value = line.removeprefix("switch: ").partition("=")
            found.switches[name] = value.strip()
        elif line.startswith("session-env: "):
            found.session_env.add(line.removeprefix("session-env: ").strip())
        elif line.startswith("trainer-env: "):
            found.forced.append(line.removeprefix("trainer-env: ").strip())
        elif line.startswith("session-tmp:"):
            found.session_tmp = line.removeprefix("session-tmp:").strip()
        else:
            found.missing.append(line.strip())
    return found


def _refuse_sandbox_start(failed: list[str]) -> None:
    """ENVIRONMENT when apptainer in the trainer could not start the sandbox, naming the host setting when it is
    what blocks it."""
    if failed:
        host = host_check.userns_problems()  # the host setting and its fix, when the host is what blocks it
        raise StackError(
            f"apptainer in the trainer cannot start the agent sandbox ({failed[0][:160]}); "
            + (
                host[0] + "."
                if host
                else "the trainer needs /dev/fuse and seccomp and AppArmor unconfined (compose.yaml) and "
                "a host kernel that allows unprivileged user namespaces (kernel.apparmor_restrict_unprivileged_userns"
                '=0, user.max_user_namespaces>0): see docs/gpu-node.md, "The agent sandbox".'
            ),
            ExitCode.ENVIRONMENT,
        )


def _refuse_agent_cli(stderr: str | None) -> None:
    """ASSETS_MISSING unless the CLI the agent will run is the pinned one (issue 18 point 3;
    polarstack.polar.harness_preset)."""
    reported = [
        line.removeprefix("sandbox-ok:").strip()
        for line in (stderr or "").splitlines()
        if line.startswith("sandbox-ok:")
    ]
    wrong_cli = harness_preset.version_problem(reported[0] if reported else "")
    if wrong_cli is not None:
        raise StackError(f"refusing to train: {wrong_cli}.", ExitCode.ASSETS_MISSING)


def _refuse_shared_tmp(session_tmp: str | None) -> None:
    """ENVIRONMENT unless a session's /tmp is its own (another session's hidden tests not found there)."""
    if session_tmp != "private":
        raise StackError(
            "refusing to train: an agent sandbox started the way Polar starts it, in a session directory of the "
            "trainer's /tmp where Polar makes them, "
            + (
                "found another session's hidden tests (eval/problem.json) at their path in the trainer: the sessions "
                "see the trainer's /tmp, so an agent could read or delete every other session's tests"
                if session_tmp == "shared"
                else "could not look for another session's files in its /tmp"
            )
            + "; recreate the trainer with `make up` (compose.yaml sets POLAR_APPTAINER_NO_MOUNT_TMP=1).",
            ExitCode.ENVIRONMENT,
        )


def _refuse_session_env(session_env: set[str], forced: list[str]) -> None:
    """ENVIRONMENT when a session's environment holds a secret of the trainer's, a proxy URL with credentials, or
    what the trainer's APPTAINERENV_* set."""
    leaked = sorted(session_env & set(assets.pass_through_secrets()))
    if leaked:
        raise StackError(
            f"refusing to train: the agent sandbox's environment holds {', '.join(leaked)}, which the trainer is "
            "handed for itself alone (compose.yaml): every agent session could read it; recreate the trainer with "
            "`make up` (compose.yaml sets POLAR_APPTAINER_CLEANENV=1).",
            ExitCode.ENVIRONMENT,
        )
    credentials = sorted(name.removesuffix("@") for name in session_env if name.endswith("@"))
    if credentials or forced:
        raise StackError(
            "refusing to train: every agent session gets "
            + (f"{', '.join(credentials)} with a user and password in its URL" if credentials else "")
            + (" and " if credentials and forced else "")
            + (f"what the trainer's {', '.join(forced)} set" if forced else "")
            + " (apptainer passes proxy variables and APPTAINERENV_* even with --cleanenv); remove them from the "
            "trainer's environment (Docker's proxy settings, ~/.docker/config.json) and recreate it with `make up`.",
            ExitCode.ENVIRONMENT,
        )


def _report_pass(stderr: str | None, found: _ProbeOutput) -> None:
    """The passing probe's lines on stderr: the sandbox's own line, then the verifier's verdicts and limits."""
    for line in (stderr or "").splitlines():
        if line.startswith("sandbox-ok:"):
            print(
                f"polarstack: agent sandbox starts in the trainer ({line.removeprefix('sandbox-ok:').strip()})",
                file=sys.stderr,
            )
    print(
        f"polarstack: the task's verifier ran in the agent sandbox the way Polar starts it (direct exec, "
        f"{' '.join(f'{k}={v}' for k, v in found.switches.items())}): PASSED {PROBE_NAME} for the canonical "
        f"{PROBE_TASK_ID}, FAILED "
        f"{PROBE_NAME} for a wrong one; {next((x[21:] for x in found.outputs['good'] if 'verifier: limits' in x), '')}",
        file=sys.stderr,
    )
