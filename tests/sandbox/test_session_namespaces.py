"""Review point 1: what an agent session shares with the trainer, measured with the kernel's own tools in the shape
apptainer gives Polar's sessions there (root in a user namespace mapping uid 0 alone, its own mount namespace:
`unshare --user --map-root-user --mount --fork`, configs/upstream/apptainer-userns.json), plus what the stack's
Polar environment adds (assets.runtime_flags: --ipc gives the session an IPC namespace of its own).

- /dev: the trainer image sets `mount dev = minimal`, so a session's /dev is apptainer's staged one (the devices the
  record lists, a fresh /dev/shm and devpts), not the trainer's with its GPUs, /dev/fuse and the host's /dev/shm.
  The task's verifier gives real verdicts there; before the fix it bound /dev/full, which the staged /dev lacks,
  and refused (every reward 0).
- IPC: a System V shared memory segment of the trainer is not visible from a session started with the stack's
  flags, and is from one without --ipc (what the sessions got before the fix: `ipcrm` could remove NCCL's).
- PID: the limit. With --pid apptainer mounts a fresh procfs (container.addKernelMount), which the kernel refuses to a
  user namespace under Docker's masked and read-only /proc paths (mount_too_revealing: EPERM), and allows without
  them; a failed mount ends the session's start (container.mountGeneric). So the sessions stay in the trainer's PID
  namespace, where a session's uid 0 can signal the trainer's processes (the same global uid) but cannot read their
  environment or files through /proc (commoncap wants CAP_SYS_PTRACE in the trainer's user namespace).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from polarstack.pins import repo_root
from polarstack.reward import tasks
from polarstack.reward.verifier import bundle, verdict
from polarstack.stack import assets

pytestmark = pytest.mark.sandbox
RECORD = json.loads((repo_root() / "configs/upstream/apptainer-userns.json").read_text())
SYSTEM_PYTHON = "/usr/bin/python3"
SHAPE = ["unshare", "--user", "--map-root-user", "--mount", "--fork"]
# Docker's defaults for a container without systempaths=unconfined (`docker inspect`: HostConfig.MaskedPaths and
# ReadonlyPaths): masked files get /dev/null bound over them, masked directories a read-only tmpfs; read-only paths
# are bound read-only onto themselves. Paths this kernel lacks are skipped, as runc does.
DOCKER_MASKED = ["/proc/asound", "/proc/acpi", "/proc/interrupts", "/proc/kcore", "/proc/keys", "/proc/latency_stats",
                 "/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug", "/proc/scsi"]  # fmt: skip
DOCKER_READONLY = ["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"]


@pytest.fixture(scope="module")
def shape():
    if os.geteuid() != 0:
        pytest.skip("needs root: the sessions' shape is root's (a user namespace mapping uid 0 to the host's root)")
    if not shutil.which("unshare") or not os.access(SYSTEM_PYTHON, os.X_OK):
        pytest.skip(f"needs util-linux's unshare and {SYSTEM_PYTHON}")
    probe = subprocess.run([*SHAPE, "cat", "/proc/self/uid_map"], capture_output=True, text=True)
    if probe.returncode != 0 or probe.stdout.split() != ["0", "0", "1"]:
        pytest.skip(f"unshare --user --map-root-user does not give the uid map 0 0 1 here: {probe.stderr[-200:]}")


def session_shape(environment: dict[str, str]) -> list[str]:
    """The namespaces apptainer makes for a session from Polar's flags (apptainer-userns.json: a user and a mount
    namespace always in the trainer, IPC with --ipc, PID with --pid), as an unshare command line."""
    flags = assets.runtime_flags(environment)
    return [*SHAPE[:-1], *(["--ipc"] if "--ipc" in flags else []), *(["--pid"] if "--pid" in flags else []), "--fork"]


def staged_dev_script() -> str:
    """Apptainer's staged /dev (`mount dev = minimal`, container.addDevMount): the recorded devices bound from the
    caller's /dev, a fresh tmpfs at /dev/shm, a new devpts instance, moved over /dev in the session's mount
    namespace."""
    dev = RECORD["mount_dev"]
    lines = ['d="$(mktemp -d)"', 'mount -t tmpfs -o mode=755 tmpfs "$d"']
    for path in dev["minimal_devices"]:
        name = path.removeprefix("/dev/")
        if os.path.islink(path):
            lines.append(f'ln -s {shlex.quote(os.readlink(path))} "$d/{name}"')
        elif os.path.exists(path):
            lines.append(f'touch "$d/{name}" && mount --bind {path} "$d/{name}"')
    lines += [
        'mkdir "$d/shm" "$d/pts" && mount -t tmpfs -o mode=1777 tmpfs "$d/shm"',
        'mount -t devpts -o newinstance,ptmxmode=0666,mode=0620 devpts "$d/pts" && ln -s /dev/pts/ptmx "$d/ptmx"',
        'mount --move "$d" /dev',
        'exec "$@"',
    ]
    return "\n".join(lines)


def in_staged_dev(command: list[str], **kwargs) -> subprocess.CompletedProcess:
    env = assets.sandbox_mode_env()
    script = ["sh", "-c", staged_dev_script(), "staged-dev", *command]
    return subprocess.run([*session_shape(env), *script], capture_output=True, text=True, timeout=120, **kwargs)


def test_the_record_lists_a_staged_dev_without_the_trainers_devices():
    dev = RECORD["mount_dev"]
    assert dev["default"] == "yes" and dev["stack_sets"] == "minimal"
    assert {"/dev/null", "/dev/zero", "/dev/urandom"} <= set(dev["minimal_devices"])
    assert not [d for d in dev["minimal_devices"] if d.startswith(("/dev/nvidia", "/dev/fuse", "/dev/shm"))]


def test_the_staged_dev_holds_only_the_recorded_devices_and_its_own_shm(shape, tmp_path):
    marker = Path("/dev/shm") / f"polarstack-trainer-shm-{os.getpid()}"
    marker.write_text("the trainer's")
    try:
        proc = in_staged_dev(["sh", "-c", f"ls /dev; test -e {marker} && echo shm-shared || echo shm-own"])
    finally:
        marker.unlink()
    assert proc.returncode == 0, proc.stderr
    names = set(proc.stdout.split()) - {"shm-own", "shm-shared"}
    allowed = {p.removeprefix("/dev/") for p in RECORD["mount_dev"]["minimal_devices"]} | {"shm", "pts", "ptmx"}
    assert names <= allowed and "null" in names, names
    assert "shm-own" in proc.stdout.split(), proc.stdout


def test_the_verifier_gives_real_verdicts_in_a_session_with_the_staged_dev(shape, tmp_path):
    """On the verifier before the fix: it bound /dev/full into its sandbox, the staged /dev has none, and it refused
    (`FAILED t (not verified)`, exit 8) on the canonical answer."""
    problem = next(p for p in tasks.load_humaneval() if p["task_id"] == "HumanEval/2")
    bundle.write(tmp_path / "verifier.py")
    (tmp_path / "problem.json").write_text(json.dumps(tasks.verifier_problem_of("humaneval", problem)))
    command = [SYSTEM_PYTHON, "-I", "verifier.py", "--problem", "problem.json", "--solution", "solution.py"]
    for body, code, line in ((problem["canonical_solution"], 0, "PASSED t"), ("    return 0.0\n", 1, "FAILED t")):
        (tmp_path / "solution.py").write_text(problem["prompt"] + body)
        proc = in_staged_dev([*command, "--name", "t"], cwd=tmp_path)
        assert not any(verdict.is_refusal(x) for x in (proc.stdout + proc.stderr).splitlines()), proc
        assert proc.returncode == code and proc.stdout.startswith(line), proc


def _segment() -> str:
    """A System V shared memory segment of this process (the trainer's side), by `ipcmk -M`; its id."""
    proc = subprocess.run(["ipcmk", "-M", "4096"], capture_output=True, text=True, check=True)
    return proc.stdout.split()[-1]


def test_a_session_started_with_the_stacks_flags_has_its_own_ipc_namespace(shape):
    """Before the fix the stack did not set POLAR_APPTAINER_ISOLATE_IPC: the sessions were in the trainer's IPC
    namespace, the host's (ipc: host), and saw (and could remove) its segments, as the second run shows."""
    if not shutil.which("ipcmk") or not shutil.which("ipcs"):
        pytest.skip("needs util-linux's ipcmk and ipcs")
    segment = _segment()
    try:
        listed = "ipcs -m | awk '{print $2}'"
        stack = subprocess.run([*session_shape(assets.sandbox_mode_env()), "sh", "-c", listed], capture_output=True)
        shared = subprocess.run([*SHAPE, "sh", "-c", listed], capture_output=True)
    finally:
        subprocess.run(["ipcrm", "-m", segment], check=False)
    assert shared.returncode == 0 and segment in shared.stdout.decode().split()  # the measurement can tell
    assert stack.returncode == 0 and segment not in stack.stdout.decode().split(), stack


MASK = r"""
set -e
for p in {masked}; do
  if [ -d "$p" ]; then mount -t tmpfs -o ro,size=4k tmpfs "$p"; elif [ -e "$p" ]; then mount --bind /dev/null "$p"; fi
done
for p in {readonly}; do
  [ -e "$p" ] && mount --bind "$p" "$p" && mount -o remount,bind,ro "$p"
done
exec "$@"
"""
FRESH_PROC = "mkdir -p /tmp/fresh-proc && mount -t proc proc /tmp/fresh-proc && echo mounted"


def test_a_pid_namespace_cannot_mount_its_proc_under_dockers_masks(shape):
    """Why the stack cannot set POLAR_APPTAINER_ISOLATE_PID: apptainer's --pid needs a fresh procfs, and the kernel
    refuses it to a user namespace under Docker's masked /proc (the trainer's, without systempaths=unconfined); the
    same mount without the masks goes through, so the refusal is the masks'."""
    session = [*SHAPE[:-1], "--pid", "--fork", "sh", "-c", FRESH_PROC]
    plain = subprocess.run(["unshare", "--mount", "--", *session], capture_output=True, text=True, timeout=60)
    assert plain.returncode == 0 and "mounted" in plain.stdout, plain.stderr
    script = MASK.format(masked=" ".join(DOCKER_MASKED), readonly=" ".join(DOCKER_READONLY))
    docker = ["unshare", "--mount", "--", "sh", "-c", script, "mask", *session]
    masked = subprocess.run(docker, capture_output=True, text=True, timeout=60)
    assert masked.returncode != 0 and "mounted" not in masked.stdout, masked
    assert "permission denied" in masked.stderr.lower() or "not permitted" in masked.stderr.lower(), masked.stderr
    fact = RECORD["facts"]["fresh_proc_with_pid_namespace"]
    assert fact["function"] == "container.addKernelMount" and RECORD["facts"]["mount_failure_is_fatal"]["line"] > 0


def test_without_a_pid_namespace_a_session_can_signal_the_trainer_but_not_read_it(shape, tmp_path):
    """The recorded limit (docs/gpu-node.md, "What a session shares with the trainer"): the session's uid 0 is the
    trainer's uid, so kill() reaches the trainer's processes (kill -1 or pkill from an agent would too); their
    environment and their files through /proc/PID/root stay closed (commoncap's ptrace check)."""
    (tmp_path / "held").write_text("trainer-only")
    trainer = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"], env={"POLARSTACK_PROBE_SECRET": "s3cret"}
    )
    try:
        probe = (
            f"kill -0 {trainer.pid} && echo signal-ok; "
            f"cat /proc/{trainer.pid}/environ >/dev/null 2>&1 && echo environ-read || echo environ-refused; "
            f"cat /proc/{trainer.pid}/root{tmp_path}/held >/dev/null 2>&1 && echo root-read || echo root-refused"
        )
        proc = subprocess.run(
            [*session_shape(assets.sandbox_mode_env()), "sh", "-c", probe], capture_output=True, text=True
        )
    finally:
        trainer.send_signal(signal.SIGTERM)
        trainer.wait(timeout=10)
    assert proc.stdout.split() == ["signal-ok", "environ-refused", "root-refused"], (proc.stdout, proc.stderr)
