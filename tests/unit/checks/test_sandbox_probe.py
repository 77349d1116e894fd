"""Pins the pre-launch probe inside the trainer (scripts/polarstack/checks/sandbox_probe.py, reached through
polarstack.checks.sandbox_probe.check_in_trainer): it names what `make sif` must provide, refuses a sandbox that cannot start, a
trainer in Polar's instance mode and a verifier that cannot tell right from wrong, and runs the real verifier the
way Polar starts the sandbox (direct `apptainer exec`, Polar's binds)."""

import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

import fake_node
from polarstack.checks import sandbox_probe
from polarstack.errors import ExitCode, StackError
from polarstack.pins import pins, repo_root
from polarstack.polar import harness_preset
from polarstack.reward import sandbox as sandbox_paths
from polarstack.stack import profiles
from polarstack.stack.cluster import load as load_cluster
from polarstack.stack.resolved import read_now

pytestmark = pytest.mark.unit


def test_train_checks_inside_the_trainer(tmp_path, monkeypatch):
    fake_node.install(tmp_path, monkeypatch)
    monkeypatch.setenv("FAKE_ABSENT", "agent-cli")
    with pytest.raises(Exception) as exc:
        sandbox_probe.check_in_trainer(profiles.load("engine-direct"), read_now())
    assert exc.value.code == ExitCode.ASSETS_MISSING and "make sif" in exc.value.message


def test_train_names_a_sandbox_that_cannot_start(tmp_path, monkeypatch):
    fake_node.install(tmp_path, monkeypatch)
    monkeypatch.setenv("FAKE_SANDBOX_ERROR", "FATAL: could not create user namespace")
    with pytest.raises(Exception) as exc:
        sandbox_probe.check_in_trainer(profiles.load("engine-direct"), read_now())
    assert exc.value.code == ExitCode.ENVIRONMENT
    assert "could not create user namespace" in exc.value.message and "/dev/fuse" in exc.value.message


# --- the pre-launch probe: Polar's sandbox mode, and the reward inside the sandbox --------------------------------
# A stand-in `apptainer` that runs `bash -lc CMD` on this machine with the session bind's source in place of
# /polar/session (and the agent CLI bind's in place of /opt/node), optionally under FAKE_APPTAINER_WRAP; the Compose
# fake runs the probe script for real. The verifier is the real one, on the real HumanEval/0 files.
APPTAINER_SHIM = r"""#!/usr/bin/env python3
import json, os, shlex, sys
args = sys.argv[1:]
with open(os.environ["FAKE_LOG"], "a") as log:
    log.write("apptainer " + shlex.join(args) + "\n")
binds = [args[i + 1].split(":") for i, a in enumerate(args) if a == "--bind"]
no_mount = args[args.index("--no-mount") + 1].split(",")
tail = args[next(i for i, a in enumerate(args) if a.endswith(".sif")) + 1:]  # `env K=V... bash -lc CMD`
# The session's file system as apptainer makes it, in a private mount namespace: each --bind source at a staged
# path standing for its target, and under --no-mount tmp a fresh /tmp and /var/tmp, so the trainer's are out of
# sight (the command runs on this machine's root file system, with the targets rewritten to the staged paths).
stage = next(d for d in ("/mnt", "/srv", "/media", "/opt") if os.path.isdir(d))
cmd, prelude = tail[-1], ['mount -t tmpfs tmpfs %s' % stage]
for index, (source, target, *options) in sorted(enumerate(binds), key=lambda b: -len(b[1][1])):
    staged = "%s/b%d" % (stage, index)
    prelude.append("mkdir -p %s && mount --bind %s %s" % (staged, shlex.quote(source), staged))
    if options == ["ro"]:
        prelude.append("mount -o remount,bind,ro %s" % staged)
    cmd = cmd.replace(target, staged)
if "tmp" in no_mount and not os.environ.get("FAKE_APPTAINER_BINDS_TMP"):
    prelude.append("mount -t tmpfs tmpfs /tmp && mount -t tmpfs tmpfs /var/tmp")
prelude.append('exec "$@"')
# The session's environment by apptainer's rule (configs/upstream/apptainer-userns.json "environment").
rule = json.load(open(os.environ["FAKE_USERNS_RECORD"]))["environment"]
clean = "--cleanenv" in args
env = dict(rule["cleanenv_sets"]) if clean else {}
skip = tuple(rule["prefixes_not_forwarded"] + rule["override_prefixes"])
for key, value in os.environ.items():
    if key in rule["always_passed"] or not (clean or key in rule["always_omitted"] or key.startswith(skip)):
        env[key] = value
for key, value in os.environ.items():
    for prefix in rule["override_prefixes"]:
        if key.startswith(prefix) and key[len(prefix):]:
            env[key[len(prefix):]] = value
env.update(HOME=os.environ.get("HOME", "/"), PATH="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
wrap = shlex.split(os.environ.get("FAKE_APPTAINER_WRAP", ""))
argv = ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", "\n".join(prelude), "apptainer"]
argv += [*wrap, *tail[:-2], "-c", cmd]  # bash -c: no profile
os.execvpe(argv[0], argv, env)
"""
COMPOSE_RUNS_SCRIPT = """#!/usr/bin/env bash
echo "compose $*" >> "$FAKE_LOG"
script="${@: -1}"
exec sh -c "$script"
"""


def real_probe(tmp_path, monkeypatch) -> Path:
    if os.geteuid() != 0 or not shutil.which("unshare"):
        pytest.skip("the stand-in apptainer makes the session's mounts: needs root and util-linux's unshare")
    log = fake_node.install(tmp_path, monkeypatch)
    bin_dir = tmp_path / "fake-bin"
    for name, text in (("apptainer", APPTAINER_SHIM), ("compose", COMPOSE_RUNS_SCRIPT)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    sandbox = tmp_path / "models" / "apptainer"
    (sandbox / "agent-cli" / "bin").mkdir(parents=True)
    (sandbox / sandbox_paths.SIF_NAME).write_text("")
    cli = sandbox / "agent-cli" / "bin" / sandbox_paths.AGENT_CLI_BIN
    cli.write_text("#!/bin/sh\necho '2.1.332 (Claude Code)'\n")
    cli.chmod(0o755)
    monkeypatch.setattr(sandbox_paths, "SANDBOX_DIR", str(sandbox))
    monkeypatch.setattr(sandbox_paths, "SIF_PATH", str(sandbox / sandbox_paths.SIF_NAME))
    monkeypatch.setattr(sandbox_paths, "AGENT_CLI_DIR", str(sandbox / "agent-cli"))
    monkeypatch.setattr("polarstack.paths.TRAINER_RUN_DIR", str(tmp_path / "run" / "train"))  # the trainer's mount
    monkeypatch.setenv("POLAR_APPTAINER_NO_INSTANCE", "1")  # what compose.yaml gives the trainer container
    monkeypatch.setenv("POLAR_APPTAINER_NO_MOUNT_TMP", "1")  # likewise
    monkeypatch.setenv("POLAR_APPTAINER_CLEANENV", "1")  # likewise
    monkeypatch.setenv("POLAR_APPTAINER_ISOLATE_IPC", "1")  # likewise
    monkeypatch.setenv("FAKE_USERNS_RECORD", str(repo_root() / "configs/upstream/apptainer-userns.json"))
    monkeypatch.setenv("POLAR_APPTAINER_BIN", str(bin_dir / "apptainer"))  # Polar's override, honoured by the probe
    monkeypatch.delenv("POLARSTACK_VERIFIER_ISOLATION", raising=False)
    monkeypatch.delenv("FAKE_APPTAINER_WRAP", raising=False)
    monkeypatch.delenv("FAKE_APPTAINER_BINDS_TMP", raising=False)
    return log


def test_probe_runs_the_verifier_the_way_polar_starts_the_sandbox(tmp_path, monkeypatch, capsys):
    log = real_probe(tmp_path, monkeypatch)
    sandbox_probe.check_in_trainer(profiles.load("engine-direct"), read_now())
    err = capsys.readouterr().err
    assert "PASSED probe for the canonical HumanEval/0, FAILED probe for a wrong one" in err
    assert "agent sandbox starts in the trainer (2.1.332 (Claude Code))" in err
    calls = [shlex.split(line)[1:] for line in log.read_text().splitlines() if line.startswith("apptainer ")]
    assert len(calls) == 5 and all(call[0] == "exec" for call in calls)  # direct exec: never `instance start`
    for call in calls:  # ApptainerRuntime._runtime_options for this template (configs/upstream/polar-apptainer.json)
        assert call[1:5] == ["--overlay", call[2], "--no-mount", "cwd,home,bind-paths,tmp"]  # the trainer's /tmp out
        assert call[5:7] == ["--cleanenv", "--ipc"]  # the trainer's environment and IPC namespace out
        assert "--pid" not in call  # the recorded limit: no fresh procfs under Docker's masked /proc
        assert call[2].endswith("/overlay")
        binds = [call[i + 1] for i, a in enumerate(call) if a == "--bind"]
        assert [b.split(":", 1)[1] for b in binds] == ["/polar/session", "/polar/runtime-control:ro", "/opt/node:ro"]
        assert not {"--userns", "--fakeroot", "--containall", "--no-privs", "--net", "--nv"} & set(call)
    verifier_calls = [c for c in calls if "verifier.py" in c[-1]]
    assert len(verifier_calls) == 2
    assert all(
        c[-1].endswith(f"cd /polar/session/workspace && {sandbox_probe.probe_command()}") for c in verifier_calls
    )
    assert "--name probe" in sandbox_probe.probe_command() and "--solution solution.py" in sandbox_probe.probe_command()
    assert not list((tmp_path / "run" / "train").glob("sandbox-probe-*"))  # the probe cleans up after itself
    # Review point 9: every session directory is where Polar's gateway makes it (tempfile.mkdtemp in the trainer's
    # temporary directory, session-<name>-XXXXXXXX) and is removed afterwards; one session looked for another's
    # hidden tests at their path in the trainer (and the stand-in's --no-mount tmp kept them out, or the probe
    # would have refused).
    sessions = {call[2].removesuffix("/overlay") for call in calls}
    assert len(sessions) == 3, sessions
    for session in sessions:
        assert Path(session).parent == Path(tempfile.gettempdir()) and Path(session).name.startswith("session-probe-")
        assert not Path(session).exists()
    look = [c for c in calls if "eval/problem.json; then echo shared" in c[-1]]
    assert len(look) == 1
    others = sessions - {look[0][2].removesuffix("/overlay")}
    assert any(f"test -e {other}/eval/problem.json" in look[0][-1] for other in others), look[0][-1]


def test_probe_refuses_sessions_that_see_the_trainers_tmp(tmp_path, monkeypatch):
    """Review point 9: the probe's sessions live where Polar's do, in the trainer's /tmp, so a sandbox that binds the
    trainer's /tmp (the stand-in ignoring --no-mount tmp, as apptainer does without it) finds the other session's
    hidden tests and the probe stops `make train`. Before the fix the probe's sessions were in the run dir, out of
    every /tmp, and it passed whatever the sessions' /tmp was."""
    log = real_probe(tmp_path, monkeypatch)
    monkeypatch.setenv("FAKE_APPTAINER_BINDS_TMP", "1")
    with pytest.raises(StackError) as exc:
        sandbox_probe.check_in_trainer(profiles.load("engine-direct"), read_now())
    assert exc.value.code == ExitCode.ENVIRONMENT
    assert "found another session's hidden tests (eval/problem.json)" in exc.value.message
    assert "POLAR_APPTAINER_NO_MOUNT_TMP=1" in exc.value.message
    # removed on the refusal too: this probe's own sessions, read from the stand-in's log (another test worker's
    # probe may have its session-probe-* folders in the same /tmp at this moment)
    calls = [shlex.split(line)[1:] for line in log.read_text().splitlines() if line.startswith("apptainer ")]
    sessions = {call[2].removesuffix("/overlay") for call in calls}
    assert sessions and all(Path(s).name.startswith("session-probe-") for s in sessions), sessions
    assert not [s for s in sessions if Path(s).exists()]


@pytest.mark.parametrize("seen,says", [("shared", "hidden tests"), ("", "could not look")])
def test_probe_refuses_a_session_tmp_it_cannot_vouch_for(tmp_path, monkeypatch, seen, says):
    fake_node.install(tmp_path, monkeypatch)
    monkeypatch.setenv("FAKE_SESSION_TMP", seen)
    with pytest.raises(StackError) as exc:
        sandbox_probe.check_in_trainer(profiles.load("engine-direct"), read_now())
    assert exc.value.code == ExitCode.ENVIRONMENT and says in exc.value.message


def test_no_secret_of_the_trainer_reaches_the_sandbox(tmp_path, monkeypatch, capsys):
    """Review point 6: the trainer is handed WANDB_API_KEY for slime's W&B logging, and apptainer passes Polar's
    environment into every session unless --cleanenv (configs/upstream/apptainer-userns.json). The probe starts its
    sessions with Polar's flags for the stack's environment (POLAR_APPTAINER_CLEANENV=1: --cleanenv), lists the names
    in a session's environment and refuses one compose.yaml passes through; the stand-in applies apptainer's recorded
    rule, under which APPTAINERENV_WANDB_API_KEY still reaches the session."""
    log = real_probe(tmp_path, monkeypatch)
    monkeypatch.setenv("WANDB_API_KEY", "wandb-secret-value-7f3a9c")
    sandbox_probe.check_in_trainer(profiles.load("engine-direct"), read_now())
    assert "PASSED probe for the canonical HumanEval/0" in capsys.readouterr().err
    assert "wandb-secret-value-7f3a9c" not in log.read_text()
    monkeypatch.setenv("APPTAINERENV_WANDB_API_KEY", "wandb-secret-value-7f3a9c")
    with pytest.raises(StackError) as exc:
        sandbox_probe.check_in_trainer(profiles.load("engine-direct"), read_now())
    assert exc.value.code == ExitCode.ENVIRONMENT
    assert "the agent sandbox's environment holds WANDB_API_KEY" in exc.value.message


def test_probe_refuses_a_trainer_that_passes_its_environment_into_the_sessions(tmp_path, monkeypatch):
    fake_node.install(tmp_path, monkeypatch)
    monkeypatch.setenv("FAKE_APPTAINER_CLEANENV", "")
    with pytest.raises(StackError) as exc:
        sandbox_probe.check_in_trainer(profiles.load("engine-direct"), read_now())
    assert exc.value.code == ExitCode.ENVIRONMENT
    assert "POLAR_APPTAINER_CLEANENV=1" in exc.value.message and "WANDB_API_KEY" in exc.value.message
    monkeypatch.setenv("FAKE_APPTAINER_CLEANENV", "1")
    monkeypatch.setenv("FAKE_SESSION_ENV", "HOME PATH WANDB_API_KEY")
    with pytest.raises(StackError) as exc:
        sandbox_probe.check_in_trainer(profiles.load("engine-direct"), read_now())
    assert "holds WANDB_API_KEY" in exc.value.message


def test_probe_refuses_a_trainer_whose_sessions_share_its_ipc_namespace(tmp_path, monkeypatch):
    fake_node.install(tmp_path, monkeypatch)
    monkeypatch.setenv("FAKE_APPTAINER_ISOLATE_IPC", "")
    with pytest.raises(StackError) as exc:
        sandbox_probe.check_in_trainer(profiles.load("engine-direct"), read_now())
    assert exc.value.code == ExitCode.ENVIRONMENT and "POLAR_APPTAINER_ISOLATE_IPC=1" in exc.value.message


def test_probe_passes_in_the_namespace_shape_apptainer_gives_the_sessions(tmp_path, monkeypatch, capsys):
    """Issue 32: each session as apptainer runs it for the trainer's root (a user namespace mapping uid 0 alone and a
    mount namespace, configs/upstream/apptainer-userns.json): the real verifier gives both verdicts; on f6ba232 it
    refused there, so the probe stopped `make train` and every reward on the node was 0."""
    if not shutil.which("unshare"):
        pytest.skip("needs util-linux's unshare")
    real_probe(tmp_path, monkeypatch)
    monkeypatch.setenv("FAKE_APPTAINER_WRAP", "unshare --user --map-root-user --mount --fork --")
    sandbox_probe.check_in_trainer(profiles.load("engine-direct"), read_now())
    assert "PASSED probe for the canonical HumanEval/0, FAILED probe for a wrong one" in capsys.readouterr().err


def test_probe_refuses_when_the_verifier_cannot_isolate(tmp_path, monkeypatch):
    """Root without CAP_SYS_ADMIN, CAP_SETUID and CAP_SETGID: the real verifier prints `FAILED probe (not verified)`.
    (Before issue 32 this test used root in a user namespace mapping uid 0 alone, where the verifier now isolates.)"""
    if not shutil.which("setpriv"):
        pytest.skip("needs util-linux's setpriv to drop CAP_SYS_ADMIN, CAP_SETUID and CAP_SETGID")
    real_probe(tmp_path, monkeypatch)
    drop = "-sys_admin,-setuid,-setgid"
    monkeypatch.setenv("FAKE_APPTAINER_WRAP", f"setpriv --inh-caps={drop} --bounding-set={drop} --")
    with pytest.raises(StackError) as exc:
        sandbox_probe.check_in_trainer(profiles.load("engine-direct"), read_now())
    message = exc.value.message
    assert exc.value.code == ExitCode.ENVIRONMENT
    assert "reward would be 0 for every sample" in message and "needs CAP_SETUID and CAP_SETGID" in message
    assert "Where it holds" in message and "POLARSTACK_VERIFIER_ISOLATION=none" in message and "/tmp" in message


def test_probe_refuses_a_verifier_that_passes_a_wrong_solution(tmp_path, monkeypatch):
    fake_node.install(tmp_path, monkeypatch)
    monkeypatch.setenv("FAKE_VERIFIER_BAD", "PASSED probe")
    with pytest.raises(StackError) as exc:
        sandbox_probe.check_in_trainer(profiles.load("engine-direct"), read_now())
    assert exc.value.code == ExitCode.ENVIRONMENT and "did not print `FAILED probe`" in exc.value.message


def test_probe_refuses_when_the_canonical_solution_fails(tmp_path, monkeypatch):
    fake_node.install(tmp_path, monkeypatch)
    monkeypatch.setenv("FAKE_VERIFIER_GOOD", "FATAL:   could not open image\\nFAILED probe (timeout: 10 s)")
    with pytest.raises(StackError) as exc:
        sandbox_probe.check_in_trainer(profiles.load("engine-direct"), read_now())
    assert exc.value.code == ExitCode.ENVIRONMENT and "reward would be 0 for every sample" in exc.value.message
    assert "FAILED probe (timeout: 10 s)" in exc.value.message


def test_probe_refuses_a_trainer_in_polar_instance_mode(tmp_path, monkeypatch):
    fake_node.install(tmp_path, monkeypatch)
    monkeypatch.setenv("FAKE_APPTAINER_MODE", "")
    with pytest.raises(StackError) as exc:
        sandbox_probe.check_in_trainer(profiles.load("engine-direct"), read_now())
    assert exc.value.code == ExitCode.ENVIRONMENT
    assert "POLAR_APPTAINER_NO_INSTANCE=1" in exc.value.message and "make up" in exc.value.message


def test_probe_refuses_a_trainer_that_binds_its_tmp_into_the_sessions(tmp_path, monkeypatch):
    """A trainer created without POLAR_APPTAINER_NO_MOUNT_TMP: Polar would not pass `--no-mount ...,tmp`, and
    every session would see the trainer's /tmp (the other sessions' hidden tests): the probe stops `make train`."""
    fake_node.install(tmp_path, monkeypatch)
    monkeypatch.setenv("FAKE_APPTAINER_NO_MOUNT_TMP", "")
    with pytest.raises(StackError) as exc:
        sandbox_probe.check_in_trainer(profiles.load("engine-direct"), read_now())
    assert exc.value.code == ExitCode.ENVIRONMENT
    assert "POLAR_APPTAINER_NO_MOUNT_TMP=1" in exc.value.message and "hidden tests" in exc.value.message
    assert "make up" in exc.value.message


def test_the_probe_builds_the_no_mount_list_the_way_polar_does():
    """ApptainerRuntime._runtime_options (configs/upstream/polar-apptainer.json no_mount_tmp): tmp only when
    POLAR_APPTAINER_NO_MOUNT_TMP is truthy, after hostfs; what the stack sets gives `cwd,home,bind-paths,tmp`."""

    def listed(env):
        call = sandbox_probe.polar_exec_args("/s", "/c", "true", environment=env)
        return call[call.index("--no-mount") + 1]

    assert listed(None) == "cwd,home,bind-paths,tmp"  # default: the stack's own environment (assets.sandbox_mode_env)
    assert listed({}) == listed({"POLAR_APPTAINER_NO_MOUNT_TMP": "0"}) == "cwd,home,bind-paths"
    assert listed({"POLAR_APPTAINER_NO_MOUNT_TMP": "Yes"}) == "cwd,home,bind-paths,tmp"
    both = {"POLAR_APPTAINER_NO_MOUNT_TMP": "1", "POLAR_APPTAINER_NO_MOUNT_HOSTFS": "on"}
    assert listed(both) == "cwd,home,bind-paths,hostfs,tmp"


def test_the_probe_files_tell_right_from_wrong_with_the_real_verifier(tmp_path):
    sandbox_probe.write_probe(tmp_path)
    for case, expected, code in (("good", "PASSED probe", 0), ("bad", "FAILED probe (failed", 1)):
        proc = subprocess.run(
            [
                sys.executable,
                "../eval/verifier.py",
                "--problem",
                "../eval/problem.json",
                "--solution",
                "solution.py",
                "--name",
                "probe",
            ],
            cwd=tmp_path / case / "workspace",
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode == code and proc.stdout.startswith(expected), (case, proc.stdout, proc.stderr)


# --- issue 18 point 3: the sandbox's agent CLI is AGENT_CLI_VERSION ------------------------------------------------
def test_the_probe_refuses_a_sandbox_cli_of_another_version(tmp_path, monkeypatch):
    fake_node.install(tmp_path, monkeypatch)
    monkeypatch.setenv("FAKE_CLI_VERSION", "2.0.1 (Claude Code)")
    with pytest.raises(StackError) as exc:
        sandbox_probe.check_in_trainer(profiles.load("engine-direct"), read_now())
    assert exc.value.code == ExitCode.ASSETS_MISSING
    assert "reports 2.0.1, not AGENT_CLI_VERSION=" in exc.value.message and "make sif" in exc.value.message


def test_the_probe_accepts_the_pinned_cli_and_says_so(tmp_path, monkeypatch, capsys):
    fake_node.install(tmp_path, monkeypatch)
    sandbox_probe.check_in_trainer(profiles.load("engine-direct"), read_now())
    assert (
        f"agent sandbox starts in the trainer ({pins()['AGENT_CLI_VERSION']} (Claude Code))" in capsys.readouterr().err
    )


def test_the_probe_refuses_a_cli_that_prints_no_version(tmp_path, monkeypatch):
    fake_node.install(tmp_path, monkeypatch)
    monkeypatch.setenv("FAKE_CLI_VERSION", "command not found")
    with pytest.raises(StackError) as exc:
        sandbox_probe.check_in_trainer(profiles.load("engine-direct"), read_now())
    assert "printed no version (command not found)" in exc.value.message


def test_claude_codes_preset_checks_no_version_and_a_checking_preset_gets_the_pin():
    facts = harness_preset.record()
    assert facts["presets"]["claude_code"]["checks_cli_version"] is False
    assert harness_preset.settings_for("claude_code") == {}
    assert harness_preset.settings_for("codex") == {"version": pins()["AGENT_CLI_VERSION"]}
    assert harness_preset.problems({"harness": "claude_code", "env": {"X": "1"}}) == []
    assert harness_preset.problems({"harness": "codex", "settings": {"version": "0.125.0"}})
    assert harness_preset.problems({"harness": "codex", "settings": {"version": ""}}) == []


def test_verify_offline_checks_the_preset_against_the_record(monkeypatch):
    from polarstack.offline import verify as verify_offline

    assert verify_offline.check_harness_preset(load_cluster()).ok
    facts = harness_preset.record()
    facts["presets"]["claude_code"]["checks_cli_version"] = True  # a preset that checks: the template must say so
    monkeypatch.setattr(harness_preset, "record", lambda: facts)
    monkeypatch.setattr(harness_preset, "settings_for", lambda harness, facts=None: {})
    check = verify_offline.check_harness_preset(load_cluster())
    assert not check.ok and "checks the CLI version" in check.problems[0]


def test_a_proxy_with_credentials_or_an_apptainerenv_variable_in_the_trainer_is_refused(tmp_path, monkeypatch):
    """The second node-path review's finding 3: apptainer passes every proxy variable and APPTAINERENV_* into a session
    even with --cleanenv (configs/upstream/apptainer-userns.json environment), so a node whose Docker hands the trainer
    HTTPS_PROXY=http://user:password@... gives every agent the credential. The probe marks such a proxy by name (its
    value never printed) and refuses it, and refuses any APPTAINERENV_* / SINGULARITYENV_* of the trainer."""
    log = real_probe(tmp_path, monkeypatch)
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy-user:proxy-secret-4c1d@proxy.example:3128")
    with pytest.raises(StackError) as exc:
        sandbox_probe.check_in_trainer(profiles.load("engine-direct"), read_now())
    assert exc.value.code == ExitCode.ENVIRONMENT
    assert "HTTPS_PROXY with a user and password in its URL" in exc.value.message, exc.value.message
    assert "proxy-secret-4c1d" not in exc.value.message and "proxy-secret-4c1d" not in log.read_text()
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.example:3128")  # no credentials: passes
    sandbox_probe.check_in_trainer(profiles.load("engine-direct"), read_now())
    monkeypatch.setenv("APPTAINERENV_SOMETHING", "x")
    with pytest.raises(StackError) as exc:
        sandbox_probe.check_in_trainer(profiles.load("engine-direct"), read_now())
    assert "what the trainer's APPTAINERENV_SOMETHING set" in exc.value.message, exc.value.message
