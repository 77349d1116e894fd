"""Pins issue 32, points 1 and 2: the verifier gives real verdicts in the namespace shape Polar's sessions run in on
the node. The trainer runs as root without CAP_SYS_ADMIN, so apptainer runs each session in a user namespace that maps
uid 0 alone (`0 0 1`), with every capability inside it and a mount namespace (configs/upstream/apptainer-userns.json);
`unshare --user --map-root-user --mount --fork` makes the same shape here. In it, with isolation on (no
POLARSTACK_VERIFIER_ISOLATION), the bundled eval/verifier.py run by the task template's own test_command and the
package API both pass HumanEval/0's canonical answer and fail a wrong one; the candidate runs as that uid 0 (the
kernel's global root) with no capability in any set (read from outside, /proc/PID/status, and inside, capget), no
/proc, read-only device binds and no way to make a process, a thread or a namespace; and the project's reward hacks
(forged verdict lines and reports, a lying `==`, exits, a thread, a fork bomb, a /proc/sys write, chmod of /dev/null,
state kept for the next run) earn nothing there. On f6ba232 the verifier refused in this shape (exit 8)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from test_verifier_adversarial import WRONG_BUT_EXITS_ZERO

import polarstack
from polar_grading import reward
from polarstack.reward import tasks
from polarstack.reward.verifier import bundle

pytestmark = pytest.mark.sandbox
SYSTEM_PYTHON = "/usr/bin/python3"
SHAPE = ["unshare", "--user", "--map-root-user", "--mount", "--fork", "--"]
TEST_NAME = "humaneval_verifier"


def shape_reason() -> str | None:
    """Why the node's shape cannot be reproduced here, or None when it can."""
    if os.geteuid() != 0:
        return "needs root: the node's shape is root's (a user namespace mapping uid 0 to the host's root)"
    if not shutil.which("unshare"):
        return "needs util-linux's unshare"
    if not os.access(SYSTEM_PYTHON, os.X_OK):
        return f"needs {SYSTEM_PYTHON}, the interpreter the test_command's `python3` names"
    probe = subprocess.run(SHAPE + ["cat", "/proc/self/uid_map"], capture_output=True, text=True, check=False)
    if probe.returncode != 0:
        return f"user namespaces are not available here: {probe.stderr.strip()[-200:]}"
    if probe.stdout.split() != ["0", "0", "1"]:
        return f"unshare --map-root-user gave the uid map {probe.stdout.split()}, not 0 0 1"
    return None


# What the candidate finds in the sandbox, printed as one JSON line on stderr (the run's stderr tail). Each probe
# records what the kernel answered; the test decides what that must be.
PROBES = r"""
import ctypes, errno, json, os, sys, threading
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
found = {"uid": os.geteuid(), "proc": os.path.exists("/proc/self")}
header = (ctypes.c_uint32 * 2)(0x20080522, 0)
data = (ctypes.c_uint32 * 6)()
found["capget"] = list(data) if libc.capget(header, data) == 0 else "capget failed"
found["bounding"] = [cap for cap in range(64) if libc.prctl(23, cap, 0, 0, 0) == 1]
found["securebits"] = libc.prctl(27, 0, 0, 0, 0)
def errno_of(action):
    try:
        action()
    except OSError as exc:
        return errno.errorcode.get(exc.errno, exc.errno)
    return "allowed"
def call(result):
    return "allowed" if result >= 0 else errno.errorcode.get(ctypes.get_errno(), ctypes.get_errno())
def fork():
    if os.fork() == 0:
        os._exit(0)
found["fork"] = errno_of(fork)
found["posix_spawn"] = errno_of(lambda: os.posix_spawn("/bin/true", ["true"], {}))
try:
    threading.Thread(target=lambda: None).start()
    found["thread"] = "started"
except RuntimeError:
    found["thread"] = "RuntimeError"
found["unshare"] = call(libc.unshare(0x20000))  # CLONE_NEWNS
found["setns"] = call(libc.setns(-1, 0))  # the kernel would answer EBADF, the filter EPERM
if os.uname().machine == "x86_64":
    found["clone3"] = call(libc.syscall(435, None, 0))  # the kernel would answer EINVAL (size 0)
def write_dev_null():
    with open("/dev/null", "w") as handle:
        handle.write("x" * 100)
found["write_dev_null"] = errno_of(write_dev_null)
found["read_urandom"] = errno_of(lambda: open("/dev/urandom", "rb").read(8))
found["chmod_dev_null"] = errno_of(lambda: os.chmod("/dev/null", 0o666))  # its current mode
found["utime_dev_null"] = errno_of(lambda: os.utime("/dev/null"))
found["chmod_etc"] = errno_of(lambda: os.chmod("/etc", 0o755))
found["write_etc"] = errno_of(lambda: open("/etc/polarstack-probe", "w").close())
found["sysctl"] = errno_of(lambda: open("/proc/sys/vm/drop_caches", "w").close())  # opened, never written
os.makedirs("/tmp/p", exist_ok=True)
found["mount_proc"] = call(libc.mount(b"proc", b"/tmp/p", b"proc", 0, None))
found["chroot"] = errno_of(lambda: os.chroot("/tmp"))
found["setuid"] = errno_of(lambda: os.setuid(1))
found["nice"] = errno_of(lambda: os.nice(-5))  # CAP_SYS_NICE
found["sethostname"] = call(libc.sethostname(b"x", 1))  # CAP_SYS_ADMIN
found["threads_env"] = [os.environ.get(k) for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")]
print(json.dumps(found, separators=(",", ":")), file=sys.stderr)
"""

# Run 1 leaves a token wherever it can write; run 2 looks for it there.
STATE_PATHS = ["/tmp", "/var/tmp", "/dev/shm", "/sandbox", "/", "/etc", "/usr"]
LEAVE = "import os\nfor d in %r:\n    try:\n        open(d + '/polarstack-state', 'w').write('TOKEN')\n" % (
    STATE_PATHS,
) + ("    except OSError:\n        pass\n")
FIND = (
    "import os, sys\nfound = [d for d in %r if os.path.exists(d + '/polarstack-state')]\n"
    "sys.exit('found %%s' %% found if found else 0)\n" % (STATE_PATHS,)
)

# The package API, run in the shape by the project's interpreter: every case, and the candidate's /proc/PID/status
# read from outside the sandbox (the sandbox itself has no /proc).
DRIVER = r"""
import json, os, sys, threading, time
spec = json.loads(sys.argv[1])
if spec.get("path"):  # the checkout under test (`-I` leaves PYTHONPATH out)
    sys.path.insert(0, spec["path"])
from polarstack.reward import verifier

result = {"uid_map": open("/proc/self/uid_map").read().split(), "isolation_env": os.environ.get(verifier.ISOLATION_ENV)}
problem = spec["problem"]
for name, completion in spec["completions"].items():
    outcome = verifier.verify(problem, completion, verifier.Limits(timeout=8))
    result[name] = [outcome.passed, outcome.reason, outcome.detail[:200], outcome.limits[:40]]
for name, program in spec["programs"].items():
    run = verifier.run_program(program, verifier.Limits(timeout=8))
    result[name] = [run.returncode, run.stderr_tail]


def descendants():
    children = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                text = open("/proc/%s/stat" % entry).read()
            except OSError:
                continue
            children.setdefault(int(text[text.rindex(")") + 2:].split()[1]), []).append(int(entry))
    todo, seen = [os.getpid()], []
    while todo:
        pid = todo.pop()
        seen.append(pid)
        todo.extend(children.get(pid, []))
    return seen[1:]


status = {}
runner = threading.Thread(target=lambda: verifier.run_program("import time\ntime.sleep(3)\n", verifier.Limits(timeout=8)))
runner.start()
deadline = time.monotonic() + 6
while not status and time.monotonic() < deadline:
    for pid in descendants():
        try:
            if b"program.py" in open("/proc/%d/cmdline" % pid, "rb").read():
                fields = dict(line.split(":", 1) for line in open("/proc/%d/status" % pid).read().splitlines())
                status = {k: fields[k].split() for k in ("Uid", "CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb",
                                                         "NoNewPrivs", "Seccomp", "Threads") if k in fields}
        except OSError:
            pass
    time.sleep(0.05)
runner.join()
result["status"] = status
print(json.dumps(result))
"""


def _humaneval_0() -> dict:
    return next(p for p in tasks.load_humaneval() if p["task_id"] == "HumanEval/0")


@pytest.fixture(scope="module")
def shape():
    reason = shape_reason()
    if reason:
        pytest.skip(reason)


def cli_solutions(problem: dict) -> dict[str, str]:
    """solution.py for the test_command: the canonical answer, a wrong one, and one that forges PASSED lines."""
    forged = WRONG_BUT_EXITS_ZERO["forged_passed_and_reports"].replace("'PASSED t'", repr(f"PASSED {TEST_NAME}"))
    return {
        "good": problem["prompt"] + problem["canonical_solution"],
        "wrong": problem["prompt"] + "    return False\n",
        "forged": problem["prompt"] + forged,
    }


def api_spec() -> dict:
    """What DRIVER runs through the package API: completions for verify(), programs for run_program()."""
    problem = dict(_humaneval_0(), kind="humaneval")
    completions = {"correct": problem["canonical_solution"], "wrong": "    return None\n"}
    completions.update(WRONG_BUT_EXITS_ZERO)
    completions["thread_answers"] = (  # a right answer computed in a thread: no thread starts, so no reward
        "    import threading\n    box = []\n    t = threading.Thread(target=lambda: box.append("
        "any(abs(a - b) < threshold for i, a in enumerate(numbers) for j, b in enumerate(numbers) if i != j)))\n"
        "    t.start()\n    t.join()\n    return box[0]\n"
    )
    completions["fork_answers"] = (  # a right answer computed in a child: no child is made
        "    import os\n    if os.fork() == 0:\n        os._exit(0)\n"
        "    return any(abs(a - b) < threshold for i, a in enumerate(numbers) for j, b in enumerate(numbers) if i != j)\n"
    )
    return {
        "problem": problem,
        "completions": completions,
        "programs": {
            "probes": PROBES,
            "fork_bomb": "import os\nwhile True:\n    os.fork()\n",
            "leave_state": LEAVE,
            "find_state": FIND,
        },
    }


@pytest.fixture(scope="module")
def cli_runs(shape, tmp_path_factory):
    """The task template's test_command in the shape, as Polar's evaluator runs it: good, wrong and forged."""
    folder = tmp_path_factory.mktemp("one-uid-cli")
    workdir, evaldir = folder / "workspace", folder / "eval"
    workdir.mkdir()
    evaldir.mkdir()
    bundle.write(evaldir / "verifier.py")
    problem = _humaneval_0()
    (evaldir / "problem.json").write_text(json.dumps(tasks.verifier_problem_of("humaneval", problem)))
    command = tasks.task_template("humaneval")["evaluator"]["config"]["test_command"]
    command = command.replace(tasks.EVALDIR, str(evaldir)).replace(tasks.WORKDIR, str(workdir))
    solutions = cli_solutions(problem)
    runs = {}
    for name, source in solutions.items():
        (workdir / "solution.py").write_text(source)
        proc = subprocess.run(
            SHAPE + ["/bin/sh", "-c", command],
            env={"PATH": "/usr/bin:/bin"},
            capture_output=True,
            text=True,
            timeout=120,
        )
        runs[name] = proc
    return runs


def test_the_bundled_verifier_passes_the_canonical_answer_in_the_nodes_shape(cli_runs):
    proc = cli_runs["good"]
    assert (proc.returncode, proc.stdout) == (0, f"PASSED {TEST_NAME}\n"), (proc.stdout, proc.stderr)
    assert reward(proc.stdout, proc.stderr, {TEST_NAME: "PASSED"}) == 1.0
    assert "limits:" in proc.stderr and "not verified" not in proc.stdout + proc.stderr, proc.stderr


@pytest.mark.parametrize("name", ["wrong", "forged"])
def test_the_bundled_verifier_fails_a_wrong_or_forging_answer_in_the_nodes_shape(cli_runs, name):
    proc = cli_runs[name]
    assert proc.returncode == 1 and f"FAILED {TEST_NAME} (failed" in proc.stdout, (proc.stdout, proc.stderr)
    assert reward(proc.stdout, proc.stderr, {TEST_NAME: "PASSED"}) == 0.0


@pytest.fixture(scope="module")
def api_run(shape):
    """The package API in the shape: every case in one process (the project's interpreter, isolation on)."""
    spec = dict(api_spec(), path=str(Path(polarstack.__file__).resolve().parents[1]))
    env = {"PATH": "/usr/bin:/bin", "HOME": tempfile.gettempdir()}
    proc = subprocess.run(
        SHAPE + [sys.executable, "-I", "-c", DRIVER, json.dumps(spec)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tempfile.gettempdir(),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def test_the_api_ran_in_the_shape_with_isolation_on(api_run):
    assert api_run["uid_map"] == ["0", "0", "1"] and api_run["isolation_env"] is None


def test_the_api_passes_the_canonical_answer_and_fails_a_wrong_one(api_run):
    assert api_run["correct"][:2] == [True, "passed"], api_run["correct"]  # a pass requires the status "isolated"
    assert api_run["wrong"][:2] == [False, "failed"], api_run["wrong"]


@pytest.mark.parametrize("name", sorted(WRONG_BUT_EXITS_ZERO) + ["thread_answers", "fork_answers"])
def test_reward_hacks_earn_nothing_in_the_shape(api_run, name):
    assert api_run[name][0] is False, (name, api_run[name])


def test_the_candidate_holds_no_capability_read_from_outside(api_run):
    status = api_run["status"]
    assert status, "the candidate's process was not found from outside"
    assert status["Uid"] == ["0"] * 4, status  # the one mapped uid: this is the shape that needs the rest
    for field in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
        assert int(status[field][0], 16) == 0, (field, status)
    assert status["NoNewPrivs"] == ["1"] and status["Seccomp"] == ["2"] and status["Threads"] == ["1"], status


def probes_of(api_run: dict) -> dict:
    code, tail = api_run["probes"]
    assert code == 0, tail
    return json.loads(tail.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def probes(api_run):
    return probes_of(api_run)


def test_the_candidate_is_uid_0_without_capabilities_or_proc(probes):
    assert probes["uid"] == 0 and probes["proc"] is False, probes
    assert probes["capget"] == [0] * 6 and probes["bounding"] == [], probes
    assert probes["securebits"] & 0x2F == 0x2F, probes  # NOROOT, NO_SETUID_FIXUP, their locks, KEEP_CAPS_LOCKED


def test_no_process_thread_or_namespace_can_be_made(probes):
    assert probes["fork"] == "EPERM" and probes["posix_spawn"] == "EPERM", probes
    assert probes["thread"] == "RuntimeError", probes
    assert probes["unshare"] == "EPERM" and probes["setns"] == "EPERM", probes
    assert probes.get("clone3", "EPERM") == "EPERM", probes
    assert probes["threads_env"] == ["1", "1", "1"], probes


def test_shared_inodes_and_kernel_settings_are_out_of_reach(probes):
    assert probes["write_dev_null"] == "allowed" and probes["read_urandom"] == "allowed", probes
    assert probes["chmod_dev_null"] == "EROFS" and probes["utime_dev_null"] == "EROFS", probes
    assert probes["chmod_etc"] == "EROFS" and probes["write_etc"] == "EROFS", probes
    assert probes["sysctl"] == "ENOENT" and probes["mount_proc"] == "EPERM", probes  # no /proc, none to mount
    assert probes["chroot"] == "EPERM" and probes["nice"] == "EPERM" and probes["sethostname"] == "EPERM", probes
    assert probes["setuid"] in ("EPERM", "EINVAL"), probes  # EINVAL: no uid but 0 is mapped to switch to


def test_a_fork_bomb_ends_at_its_first_fork(api_run):
    code, tail = api_run["fork_bomb"]
    assert code not in (0, None) and "PermissionError" in tail, (code, tail)


def test_nothing_one_run_writes_reaches_the_next(api_run):
    assert api_run["leave_state"][0] == 0, api_run["leave_state"]
    assert api_run["find_state"][0] == 0, api_run["find_state"]


def test_the_reproduced_shape_is_the_recorded_one():
    """The namespace these tests make is the one configs/upstream/apptainer-userns.json records for the node."""
    record = json.loads((Path(__file__).resolve().parents[2] / "configs/upstream/apptainer-userns.json").read_text())
    assert SHAPE[:-1] == record["reproduced_by"] and record["uid_map_for_root"] == "0 0 1"
