"""Pins issue 12 (follow-up): the verifier run as root WITHOUT CAP_SYS_ADMIN (root in a Docker container, an
Apptainer session in the trainer container) still verifies, isolated, through a user namespace into which a helper
maps the run's sandbox uid, instead of failing closed and silently giving every sample reward 0. Measured for real:
the verifier is started as root with CAP_SYS_ADMIN dropped from its bounding, inheritable, permitted and effective
sets (util-linux `setpriv`); a correct HumanEval solution passes, a wrong one and a reward hack (os._exit(0)) fail,
a listener the test opens on 127.0.0.1 stays unreachable, nothing written to /tmp, /var/tmp or /dev/shm persists,
the candidate holds no capability, is not uid 0 and cannot chroot, chmod the host's /dev/null or open
/proc/sysrq-trigger for writing, and RLIMIT_NPROC holds (the candidate never runs as the host's root, which the
kernel exempts from it), and no process, thread or namespace can be made (issue 32). When user namespaces are
refused too (a seccomp filter that denies unshare(2)), or root also lacks CAP_SETUID and CAP_SETGID to map that
uid, it still fails closed: exit code 8 and one sentence naming the fix (never the opt-out, which Polar's
test_command does not carry). Root in a user namespace that maps uid 0 alone (as `unshare --map-root-user` makes,
as apptainer makes for the trainer) verifies since issue 32 (test_verifier_one_uid.py)."""

import json
import os
import platform
import shutil
import socket
import subprocess
import uuid
from pathlib import Path

import pytest
from creation_probe import NO_CREATION

import bundled_verifier
from polarstack.reward import tasks
from polarstack.reward.verifier.limits import ISOLATION_ENV

pytestmark = pytest.mark.sandbox
VERIFIER = bundled_verifier.VERIFIER  # as tasks writes it, under pytest's tmp_path_factory
SYSTEM_PYTHON = "/usr/bin/python3"
CAP_SYS_ADMIN = 21
# Drops CAP_SYS_ADMIN from the bounding and inheritable sets, so the exec'd program (root) has it nowhere.
CAPLESS = ["setpriv", "--inh-caps=-sys_admin", "--bounding-set=-sys_admin", "--"]


def _capless_reason() -> str | None:
    """Why root-without-CAP_SYS_ADMIN cannot be reproduced here, or None when it can."""
    if os.geteuid() != 0:
        return "needs root (to start the verifier as root with CAP_SYS_ADMIN dropped)"
    if not shutil.which("setpriv"):
        return "needs util-linux's setpriv to drop CAP_SYS_ADMIN"
    if not os.access(SYSTEM_PYTHON, os.X_OK):
        return f"needs {SYSTEM_PYTHON}"
    probe = subprocess.run(
        CAPLESS
        + [
            SYSTEM_PYTHON,
            "-I",
            "-S",
            "-c",
            "import ctypes, sys\nsys.exit(ctypes.CDLL(None, use_errno=True).unshare(0x10000000 | 0x40000000))",
        ],
        env={},
        capture_output=True,
        check=False,
    )
    return None if probe.returncode == 0 else "user namespaces are not allowed to root without CAP_SYS_ADMIN here"


DRIVER = r"""
import json, sys
sys.path.insert(0, ".")
import verifier

spec = json.loads(sys.argv[1])
status = open("/proc/self/status").read()
cap_eff = int(status.split("CapEff:")[1].split()[0], 16)
problem = json.load(open("problem.json"))
result = {"euid": __import__("os").geteuid(), "cap_eff": cap_eff}
for name, completion in spec["completions"].items():
    outcome = verifier.verify(problem, completion, verifier.Limits(timeout=15))
    result[name] = [outcome.passed, outcome.reason, outcome.detail, outcome.stderr_tail]
for name, program in spec["programs"].items():
    run = verifier.run_program(program, verifier.Limits(timeout=15))
    result[name] = [run.returncode, run.stderr_tail]
print(json.dumps(result))
"""

PRIVILEGES = r"""
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this process
data = (ctypes.c_uint32 * 6)()
if libc.capget(header, data) != 0:
    sys.exit('capget failed')
if any(data):
    sys.exit('capabilities left: %s' % list(data))
if os.getuid() == 0 or os.geteuid() == 0:
    sys.exit('uid 0 inside the sandbox')
os.mkdir('/tmp/jail')
try:
    os.chroot('/tmp/jail')
except OSError:
    pass
else:
    sys.exit('chroot allowed (a way out of the sandbox root)')
try:
    os.chmod('/dev/null', 0o666)  # its current mode: harmless even if it were allowed
except OSError:
    pass
else:
    sys.exit("chmod of the host's /dev/null allowed")
for path in ('/proc/sysrq-trigger', '/proc/sys/kernel/core_pattern'):
    try:
        os.close(os.open(path, os.O_WRONLY))  # opened, never written
    except OSError:
        pass
    else:
        sys.exit('opened %s for writing' % path)
"""

# At most 40 processes, each ending within 5 s: RLIMIT_NPROC (32) must refuse a fork before that.
NPROC = r"""
import os, sys, time
count = 0
try:
    for count in range(40):
        if os.fork() == 0:
            time.sleep(5)
            os._exit(0)
except OSError:
    sys.exit(0)
sys.exit('forked %d processes: RLIMIT_NPROC did not hold' % (count + 1))
"""


@pytest.fixture(scope="module")
def capless_run(tmp_path_factory):
    """One verifier process, root without CAP_SYS_ADMIN, running every case; the host-side observations."""
    reason = _capless_reason()
    if reason:
        pytest.skip(reason)
    folder = tmp_path_factory.mktemp("capless")
    shutil.copy(VERIFIER, folder / "verifier.py")
    problem = next(p for p in tasks.load_humaneval() if p["task_id"] == "HumanEval/0")
    (folder / "problem.json").write_text(json.dumps(dict(problem, kind="humaneval")))
    token = uuid.uuid4().hex
    written = [Path(d) / f"polarstack-capless-{token}" for d in ("/tmp", "/var/tmp", "/dev/shm")]
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.settimeout(0.5)
    port = listener.getsockname()[1]
    spec = {
        "completions": {
            "correct": problem["canonical_solution"],
            "wrong": "    return None\n",
            "os_exit_hack": "    return None\nimport os\nos._exit(0)\n",
        },
        "programs": {
            "network": (
                f"import socket, sys\ntry:\n    socket.create_connection(('127.0.0.1', {port}), timeout=2)\n"
                "except OSError:\n    sys.exit(0)\nsys.exit('connected to the host loopback')\n"
            ),
            "tmp": (
                f"for path in {[str(p) for p in written]!r}:\n    open(path, 'w').write('x')\n"
                f"assert open({str(written[0])!r}).read() == 'x'\n"
            ),
            "privileges": PRIVILEGES,
            "nproc": NPROC,
            "no_creation": NO_CREATION,
        },
    }
    try:
        proc = subprocess.run(
            CAPLESS + [SYSTEM_PYTHON, "-I", "-c", DRIVER, json.dumps(spec)],
            cwd=folder,
            capture_output=True,
            text=True,
            timeout=240,
            env={"PATH": "/usr/bin:/bin:/usr/sbin:/sbin", "HOME": str(folder)},
        )
        try:
            listener.accept()[0].close()
            reached = True
        except socket.timeout:
            reached = False
    finally:
        listener.close()
    persisted = [str(p) for p in written if p.exists()]
    for path in written:
        path.unlink(missing_ok=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return dict(json.loads(proc.stdout), listener_reached=reached, persisted=persisted)


def test_the_verifier_really_ran_as_root_without_cap_sys_admin(capless_run):
    assert capless_run["euid"] == 0
    assert not capless_run["cap_eff"] & (1 << CAP_SYS_ADMIN)


def test_correct_solution_passes_isolated_and_wrong_ones_fail(capless_run):
    passed, reason, detail, tail = capless_run["correct"]
    assert (passed, reason) == (True, "passed"), (detail, tail)  # a pass requires the status "isolated"
    assert capless_run["wrong"][:2] == [False, "failed"]
    assert capless_run["os_exit_hack"][:2] == [False, "failed"]


def test_no_network_even_to_a_loopback_listener(capless_run):
    assert capless_run["network"][0] == 0, capless_run["network"][1]
    assert capless_run["listener_reached"] is False


def test_files_written_to_tmp_do_not_persist(capless_run):
    assert capless_run["tmp"][0] == 0, capless_run["tmp"][1]  # they were written, inside
    assert capless_run["persisted"] == []


def test_candidate_has_no_privilege_left(capless_run):
    assert capless_run["privileges"][0] == 0, capless_run["privileges"][1]


def test_rlimit_nproc_holds(capless_run):
    # Since issue 32 the first fork is refused by the seccomp filter: the program sees the OSError all the same.
    assert capless_run["nproc"][0] == 0, capless_run["nproc"][1]


def test_no_process_thread_or_namespace_can_be_made(capless_run):
    assert capless_run["no_creation"][0] == 0, capless_run["no_creation"][1]


# --- when the user namespace is refused as well: fail closed --------------------------------------------

# Installs a seccomp filter that makes unshare(2) fail with EPERM (as a container's profile may), then runs argv.
DENY_UNSHARE = r"""
import ctypes, os, struct, sys
arch, nr = {"x86_64": (0xC000003E, 272), "aarch64": (0xC00000B7, 97)}[os.uname().machine]
def op(code, jt, jf, k):
    return struct.pack("HBBI", code, jt, jf, k)
program = b"".join([op(0x20, 0, 0, 4), op(0x15, 0, 3, arch), op(0x20, 0, 0, 0), op(0x15, 0, 1, nr),
                    op(0x06, 0, 0, 0x00050000 | 1), op(0x06, 0, 0, 0x7FFF0000)])
buffer = ctypes.create_string_buffer(program)
fprog = struct.pack("HxxxxxxP", len(program) // 8, ctypes.addressof(buffer))
libc = ctypes.CDLL(None, use_errno=True)
if libc.prctl(38, 1, 0, 0, 0) != 0 or libc.prctl(22, 2, ctypes.c_char_p(fprog), 0, 0) != 0:
    sys.exit("cannot install the seccomp filter")
os.execv(sys.argv[1], sys.argv[1:])
"""


@pytest.mark.parametrize("case", ["user namespaces refused", "no CAP_SETUID", "root-only user namespace"])
def test_fails_closed_with_one_sentence(tmp_path, case):
    """unshare(2) denied by seccomp (as a container's profile may) on top of the missing CAP_SYS_ADMIN; root without
    CAP_SETUID and CAP_SETGID as well, which cannot map a sandbox uid (its program would run as the host's root, which
    RLIMIT_NPROC does not bind). Root inside a user namespace that maps uid 0 alone (`unshare --map-root-user`)
    refused on f6ba232 and verifies now (issue 32): its canonical answer prints PASSED."""
    reason = _capless_reason()
    if not reason and case == "user namespaces refused" and platform.machine() not in ("x86_64", "aarch64"):
        reason = f"the seccomp filter knows unshare's number on x86_64 and aarch64 only, not {platform.machine()}"
    if not reason and case == "root-only user namespace" and not shutil.which("unshare"):
        reason = "needs util-linux's unshare"
    if reason:
        pytest.skip(reason)
    shutil.copy(VERIFIER, tmp_path / "verifier.py")
    problem = next(p for p in tasks.load_humaneval() if p["task_id"] == "HumanEval/0")
    (tmp_path / "problem.json").write_text(json.dumps(dict(problem, kind="humaneval")))
    (tmp_path / "solution.py").write_text(problem["prompt"] + problem["canonical_solution"])
    command = [
        SYSTEM_PYTHON,
        "-I",
        "verifier.py",
        "--problem",
        "problem.json",
        "--solution",
        "solution.py",
        "--name",
        "t",
    ]
    if case == "user namespaces refused":
        command, expected = CAPLESS + [SYSTEM_PYTHON, "-I", "-c", DENY_UNSHARE] + command, "Operation not permitted"
    elif case == "no CAP_SETUID":
        drop = "-sys_admin,-setuid,-setgid"
        command, expected = ["setpriv", f"--inh-caps={drop}", f"--bounding-set={drop}", "--"] + command, "CAP_SETUID"
    else:
        command, expected = ["unshare", "--user", "--map-root-user", "--"] + command, None
    proc = subprocess.run(
        command, cwd=tmp_path, capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin"}
    )
    if expected is None:  # the one-uid shape: isolated with uid 0, a real verdict
        assert (proc.returncode, proc.stdout) == (0, "PASSED t\n"), (proc.stdout, proc.stderr)
        return
    assert proc.returncode == 8, (proc.stdout, proc.stderr)
    assert proc.stdout.strip() == "FAILED t (not verified)"
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0], proc.stderr
    # The fix, never the opt-out: Polar's test_command does not carry the trainer's environment (issue 32, point 4).
    assert ISOLATION_ENV not in lines[0] and "CAP_SYS_ADMIN" in lines[0], lines[0]
