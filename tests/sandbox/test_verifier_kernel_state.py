"""Pins issue 20, findings 1 and 2, and the survey of kernel state namespaces do not isolate (docs/tasks.md, "What
the sandbox isolates"): no kernel object that outlives a verifier run or belongs to the launcher is reachable from
the candidate. Keyrings: the keyring system calls are refused (through libc's syscall(), the x32 number and the
i386 `int 0x80` entry), a key one run stores is not found by the next, a keyring oracle run again and again never
earns the reward, and a launcher that has its own session keyring (as runc gives every container one) keeps its
key unread and intact. The other blocked calls answer EPERM (System V creation of every kind, socketpair, socket()
but for AF_INET and AF_INET6: issue 25's red-team); what IPC remains (POSIX message queues) and the host's System V
objects are the sandbox's own or unseen; an abstract unix socket of the host is unreachable (no unix socket can be
made); 8 sandboxes side by side share nothing; and (issue 32) no process, thread or namespace can be made in
the shape this host gives the verifier (creation_probe.py)."""

import ctypes
import errno
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from creation_probe import NO_CREATION

from polarstack.reward import tasks, verifier
from polarstack.reward.verifier.limits import Limits, Run

pytestmark = pytest.mark.sandbox
X86_64 = platform.machine() == "x86_64"
EPERM = 1

# Raw keyring calls through libc's syscall(): x86_64 numbers (arch/x86/entry/syscalls/syscall_64.tbl).
KEYS = r"""
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
ADD_KEY, KEYCTL = 248, 250
GET_KEYRING_ID, JOIN, UPDATE, SETPERM, CLEAR, SEARCH, READ, INVALIDATE = 0, 1, 2, 5, 7, 10, 11, 21
SESSION, USER = -3, -4


def sc(*args):
    ctypes.set_errno(0)
    result = libc.syscall(*[ctypes.c_long(a) if isinstance(a, int) else a for a in args])
    return result, ctypes.get_errno() if result < 0 else 0


def add_key(description, payload, ring):
    return sc(ADD_KEY, ctypes.c_char_p(b"user"), ctypes.c_char_p(description), ctypes.c_char_p(payload),
              len(payload), ring)


def keyctl(*args):
    return sc(KEYCTL, *args)


def read_key(serial):
    buffer = ctypes.create_string_buffer(4096)
    size, err = keyctl(READ, serial, buffer, 4096)
    return buffer.raw[:size] if size >= 0 else None


def proc_keys(description):
    try:
        lines = open("/proc/keys").read().splitlines()
    except OSError:
        return []
    return [int(line.split()[0], 16) for line in lines if (description.decode() + ":") in line.split()]
"""


@pytest.fixture(scope="module")
def humaneval():
    return {p["task_id"]: p for p in tasks.load_humaneval()}


def _run(program: str, timeout: float = 10) -> Run:
    return verifier.run_program(program, Limits(timeout=timeout))


# --- the keyring calls are refused on every entry point --------------------------------------------------

# i386 keyctl(KEYCTL_GET_KEYRING_ID, KEY_SPEC_SESSION_KEYRING) through `int 0x80` (i386 number 288):
# push rbx; mov eax, 288; xor ebx, ebx; mov ecx, -3; xor edx, edx; int 0x80; pop rbx; ret
I386_KEYCTL = "53b82001000031dbb9fdffffff31d2cd805bc3"

ENTRY_POINTS = (
    KEYS
    + r"""
import json
found = {}
found["syscall"] = keyctl(GET_KEYRING_ID, SESSION, 0)
found["add_key"] = add_key(b"probe", b"x", USER)
found["x32"] = sc(KEYCTL | 0x40000000, GET_KEYRING_ID, SESSION, 0)
print(json.dumps(found), file=sys.stderr)
"""
)
# A run of its own (the candidate can make no child to risk it in, issue 32): the i386 entry kills the process.
I386_ENTRY = r"""
import ctypes, mmap, os
code = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
code.write(bytes.fromhex("I386_CODE"))
serial = ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.addressof(ctypes.c_char.from_buffer(code)))()
os._exit(0 if serial > 0 else 1)
""".replace("I386_CODE", I386_KEYCTL)


@pytest.mark.skipif(not X86_64, reason="the raw keyring numbers and the i386 machine code are x86_64's")
def test_keyring_calls_are_refused_through_syscall_x32_and_i386():
    run = _run(ENTRY_POINTS)
    assert run.returncode == 0, run
    found = json.loads(run.stderr_tail.strip().splitlines()[-1])
    assert found["syscall"] == [-1, EPERM], found  # EPERM: refused by the filter, as Docker's profile answers
    assert found["add_key"] == [-1, EPERM], found
    assert found["x32"] == [-1, EPERM], found  # the x32 entry reports AUDIT_ARCH_X86_64: refused by number
    run = _run(I386_ENTRY)
    assert run.returncode == 128 + signal.SIGSYS, run  # another architecture: the process is killed (0: answered)


# --- finding 1: nothing a run stores in a keyring reaches a later run --------------------------------------


def _store(description: bytes) -> str:
    return KEYS + (
        f"serial, err = add_key({description!r}, b'guesses: True False True', USER)\n"
        "if serial > 0:\n    keyctl(SETPERM, serial, 0x3F3F3F3F)\n    sys.exit('stored key %d' % serial)\n"
        "sys.exit(0 if err == 1 else 'add_key: errno %d' % err)\n"
    )


def _find(description: bytes) -> str:
    return KEYS + (
        f"seen = proc_keys({description!r})\n"
        f"searched, _ = keyctl(SEARCH, USER, ctypes.c_char_p(b'user'), ctypes.c_char_p({description!r}), 0)\n"
        "if seen or searched > 0:\n    sys.exit('found the earlier run key: %s %s' % (seen, searched))\n"
    )


@pytest.mark.skipif(not X86_64, reason="the raw keyring numbers are x86_64's")
def test_a_key_one_run_stores_is_not_found_by_the_next():
    description = f"polarstack-{uuid.uuid4().hex}".encode()
    first = _run(_store(description))
    later = [_run(_find(description)) for _ in range(3)]  # sandbox uids are drawn at random: several runs
    assert first.returncode == 0, first
    assert all(run.returncode == 0 for run in later), later
    assert description.decode() not in Path("/proc/keys").read_text()


# A candidate for HumanEval/0 that keeps, across runs, a table of guesses in a key any uid may read and update
# (found through /proc/keys): an answer followed by another call held; the last one not followed is flipped next
# run. Before issue 20 it failed three runs and then passed about every second one, never implementing the task.
ORACLE = (
    "    return _oracle((tuple(numbers), threshold))\n"
    + KEYS
    + r"""
import atexit, json
DESCRIPTION = b"%s"
found = proc_keys(DESCRIPTION)
SERIAL = found[0] if found else None
TABLE = json.loads(read_key(SERIAL) or b'{"guess": {}, "last": null}') if SERIAL else {"guess": {}, "last": None}
if TABLE["last"] is not None:  # last run's final answer was not followed by a call: flip it
    TABLE["guess"][TABLE["last"]] = not TABLE["guess"].get(TABLE["last"], True)
TABLE["last"] = None


def _save():
    global SERIAL
    data = json.dumps(TABLE).encode()
    if SERIAL is None:
        SERIAL, _ = add_key(DESCRIPTION, data, USER)
        if SERIAL > 0:
            keyctl(SETPERM, SERIAL, 0x3F3F3F3F)
        else:
            SERIAL = None
    else:
        sc(KEYCTL, UPDATE, SERIAL, ctypes.c_char_p(data), len(data))


def _oracle(key):
    key = repr(key)
    answer = TABLE["guess"].setdefault(key, True)
    TABLE["last"] = key
    _save()
    return answer
"""
)


@pytest.mark.skipif(not X86_64, reason="the raw keyring numbers are x86_64's")
def test_a_keyring_oracle_run_again_and_again_never_earns_the_reward(humaneval):
    completion = ORACLE % f"polarstack-oracle-{uuid.uuid4().hex}".encode().decode()
    outcomes = [verifier.verify(humaneval["HumanEval/0"], completion, Limits(timeout=10)) for _ in range(10)]
    assert [o.reason for o in outcomes if o.passed] == [], [(o.reason, o.detail) for o in outcomes]
    assert all(o.calls == 7 for o in outcomes), [o.calls for o in outcomes]  # every input, every run


# --- finding 2: the launcher's session keyring is neither read nor damaged ---------------------------------

LAUNCHER = (
    KEYS
    + r"""
import json
from polarstack.reward import verifier
token = sys.argv[1]
ring, err = keyctl(JOIN, ctypes.c_char_p(("polarstack-launcher-" + token).encode()))  # as runc does per container
assert ring > 0, err
serial, err = add_key(("launcher-secret-" + token).encode(), b"s3cret", SESSION)
assert serial > 0, err
keyctl(SETPERM, serial, 0x3F3F3F3F)  # the worst case: every right for everyone
keyctl(SETPERM, ring, 0x3F3F3F3F)
run = verifier.run_program(sys.argv[2], verifier.Limits(timeout=10))
print(json.dumps({"returncode": run.returncode, "tail": run.stderr_tail,
                  "key": (read_key(serial) or b"").decode(), "ring": keyctl(GET_KEYRING_ID, SESSION, 0)[0] == ring}))
"""
)

RAID = (
    KEYS
    + r"""
token = sys.argv[1] if len(sys.argv) > 1 else "%s"
description = ("launcher-secret-" + token).encode()
harm = []
serials = proc_keys(description) + proc_keys(("polarstack-launcher-" + token).encode())
if serials:
    harm.append("saw the launcher's keys in /proc/keys")
searched, _ = keyctl(SEARCH, SESSION, ctypes.c_char_p(b"user"), ctypes.c_char_p(description), 0)
for serial in serials + ([searched] if searched > 0 else []):
    if read_key(serial):
        harm.append("read key %%d" %% serial)
    if keyctl(INVALIDATE, serial)[0] == 0:
        harm.append("invalidated key %%d" %% serial)
if keyctl(CLEAR, SESSION)[0] == 0 and searched > 0:
    harm.append("cleared the session keyring")
if harm:
    sys.exit("; ".join(harm))
"""
)


@pytest.mark.skipif(not X86_64, reason="the raw keyring numbers are x86_64's")
def test_a_launcher_with_a_session_keyring_keeps_its_key_unread_and_intact():
    token = uuid.uuid4().hex
    proc = subprocess.run(
        [sys.executable, "-c", LAUNCHER, token, RAID % token],
        capture_output=True,
        text=True,
        timeout=60,
        env=dict(os.environ),
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["returncode"] == 0, result["tail"]
    assert result["key"] == "s3cret" and result["ring"], result  # the launcher still reads its key


# --- the rest of the survey: blocked calls, the sandbox's own IPC and abstract sockets --------------------

BLOCKED_X86_64 = {
    "inotify_init1": 294,
    "fanotify_init": 300,
    "perf_event_open": 298,
    "bpf": 321,
    "userfaultfd": 323,
    "io_uring_setup": 425,
    "ptrace": 101,
    "shmget": 29,  # issue 25: memory without a mapping (System V segments, memfds) is refused at creation
    "memfd_create": 319,
    "memfd_secret": 447,
    "semget": 64,  # issue 25's red-team: semaphore sets and message queues are unaccounted kernel memory
    "msgget": 68,
    "socketpair": 53,  # and unix-domain socket buffers; socket() is refused by family (below)
}
SOCKET_FAMILIES = {"AF_UNIX": 1, "AF_NETLINK": 16, "AF_PACKET": 17, "AF_INET": 2, "AF_INET6": 10}


@pytest.mark.skipif(not X86_64, reason="the raw numbers are x86_64's")
def test_the_other_surveyed_calls_answer_eperm():
    program = KEYS + (
        f"numbers = {BLOCKED_X86_64!r}\n"
        # arguments that would make each call succeed or fail for its own reason (EINVAL, EFAULT), never EPERM
        "got = {name: sc(nr, 0, 0, 0, 0, 0) for name, nr in numbers.items()}\n"
        # socket(family, SOCK_DGRAM, 0) through the raw number 41, each fd closed again
        f"got.update({{name: sc(41, family, 2, 0) for name, family in {SOCKET_FAMILIES!r}.items()}})\n"
        "print(__import__('json').dumps(got), file=sys.stderr)\n"
    )
    run = _run(program)
    assert run.returncode == 0, run
    got = {name: tuple(value) for name, value in json.loads(run.stderr_tail.strip().splitlines()[-1]).items()}
    refused = [*BLOCKED_X86_64, "AF_UNIX", "AF_NETLINK", "AF_PACKET"]
    assert {name: got[name] for name in refused} == {name: (-1, EPERM) for name in refused}
    assert got["AF_INET"][0] >= 0 and got["AF_INET6"][0] >= 0, got  # inet stays, in the empty network namespace


SYSV = r"""
import ctypes, json, os, sys
libc = ctypes.CDLL(None, use_errno=True)
key = %d
got = {}
for name, args in (("shmget", (key, 4096, 0o1000 | 0o600)), ("semget", (key, 1, 0o1000 | 0o600)),
                   ("msgget", (key, 0o1000 | 0o600))):  # IPC_CREAT: every System V creation is refused
    got[name] = [getattr(libc, name)(*args), ctypes.get_errno()]
got["host_sem_listed"] = any(line.split()[:1] == [str(key)] for line in open("/proc/sysvipc/sem"))
# POSIX message queues remain (bounded by RLIMIT_MSGQUEUE): the host's queue is not found, and one made here is
# gone with the run's IPC namespace
libc.mq_open.restype = ctypes.c_int
ctypes.set_errno(0)
got["host_mq"] = [libc.mq_open(b"/polarstack-%d", os.O_RDWR), ctypes.get_errno()]
got["own_mq"] = libc.mq_open(b"/polarstack-own-%d", os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600, None)
print(json.dumps(got), file=sys.stderr)
"""


def test_system_v_ipc_is_refused_and_what_ipc_remains_is_the_sandboxs_own():
    key = int.from_bytes(os.urandom(3), "big") + 1
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mq_open.restype = ctypes.c_int
    sem = libc.semget(key, 1, 0o1000 | 0o2000 | 0o600)  # the host's own set and queue (IPC_CREAT | IPC_EXCL)
    queue = libc.mq_open(f"/polarstack-{key}".encode(), os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600, None)
    assert sem >= 0 and queue >= 0, ctypes.get_errno()
    try:
        run = _run(SYSV % (key, key, key))
    finally:
        libc.semctl(sem, 0, 0)  # IPC_RMID
        os.close(queue)
        libc.mq_unlink(f"/polarstack-{key}".encode())
    assert run.returncode == 0, run
    got = json.loads(run.stderr_tail.strip().splitlines()[-1])
    assert {name: got[name] for name in ("shmget", "semget", "msgget")} == {
        name: [-1, EPERM] for name in ("shmget", "semget", "msgget")
    }, got
    assert got["host_sem_listed"] is False and got["host_mq"] == [-1, errno.ENOENT], got
    assert got["own_mq"] >= 0, got  # (a queue can be made: the lookup above is a real one)
    host = ctypes.CDLL(None, use_errno=True)
    host.mq_open.restype = ctypes.c_int
    assert host.mq_open(f"/polarstack-own-{key}".encode(), os.O_RDWR) == -1  # gone with the run
    assert ctypes.get_errno() == errno.ENOENT


def test_no_unix_socket_can_be_made_so_the_hosts_abstract_names_are_unreachable():
    name = f"\0polarstack-{uuid.uuid4().hex}"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(name)
    listener.listen(1)
    program = (
        "import errno, socket, sys\ngot = []\n"
        "for make in (lambda: socket.socket(socket.AF_UNIX, socket.SOCK_STREAM), socket.socketpair):\n"
        "    try:\n        made = make()\n    except PermissionError:\n        got.append('refused')\n"
        "        continue\n    got.append('made')\n"
        f"    try:\n        made.connect({name!r})\n        got.append('connected')\n"
        "    except (OSError, AttributeError):\n        pass\n"
        "print(' '.join(got), file=sys.stderr)\n"
    )
    try:
        run = _run(program)
    finally:
        listener.close()
    assert run.returncode == 0, run
    assert run.stderr_tail.strip().splitlines()[-1] == "refused refused", run


# --- point 4: eight verifications side by side share nothing ----------------------------------------------

NEIGHBOUR = r"""
import ctypes, glob, os, socket, sys, time
token, key = sys.argv[1], int(sys.argv[2])
libc = ctypes.CDLL(None, use_errno=True)
for folder in ("/tmp", "/var/tmp", "/dev/shm", "/sandbox"):
    open(os.path.join(folder, "mark-" + token), "w").write(token)
libc.mq_open.restype = ctypes.c_int
queue = libc.mq_open(b"/polarstack-neighbour", os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600, None)  # same name
sem = libc.semget(0x5053, 1, 0o1000 | 0o2000 | 0o666)  # the same key in every sandbox, IPC_EXCL: refused
sem_errno = ctypes.get_errno()
try:
    socket.socket(socket.AF_UNIX, socket.SOCK_STREAM).bind("\0polarstack-neighbour")  # refused too
    sys.exit("made a unix socket")
except PermissionError:
    pass
time.sleep(1.0)  # all eight are up now
others = [p for f in ("/tmp", "/var/tmp", "/dev/shm", "/sandbox") for p in glob.glob(f + "/mark-*")
          if not p.endswith(token)]
if others:
    sys.exit("sees a neighbour's files: %s" % others)
if queue < 0:  # a neighbour's queue of the same name would make O_EXCL fail: the IPC namespaces are apart
    sys.exit("mq_open: %d" % ctypes.get_errno())
if sem != -1 or sem_errno != 1:
    sys.exit("semget: %d %d" % (sem, sem_errno))
print("uid %d queue %d" % (os.getuid(), queue), file=sys.stderr)
"""


def test_eight_verifications_side_by_side_share_nothing(humaneval):
    tokens = [uuid.uuid4().hex for _ in range(8)]

    def one(token):
        program = f"import sys\nsys.argv = ['p', {token!r}, '0']\n" + NEIGHBOUR
        return verifier.run_program(program, Limits(timeout=20))

    with ThreadPoolExecutor(max_workers=8) as pool:
        runs = list(pool.map(one, tokens))
        problem = humaneval["HumanEval/0"]
        outcomes = list(pool.map(lambda _: verifier.verify(problem, problem["canonical_solution"]), range(8)))
    assert [r.returncode for r in runs] == [0] * 8, [r.stderr_tail for r in runs]
    if os.geteuid() == 0:  # as root each sandbox has a uid of its own
        uids = {r.stderr_tail.split()[1] for r in runs}
        assert len(uids) == 8, uids
    assert all(o.passed for o in outcomes), [(o.reason, o.detail) for o in outcomes]


def test_no_process_thread_or_namespace_can_be_made():
    """Issue 32: clone, clone3, fork, vfork, unshare and setns answer EPERM in the shape this host runs the verifier
    in (here as it is run; the other shapes: test_verifier_capless, test_verifier_isolation, test_verifier_one_uid)."""
    run = _run(NO_CREATION)
    assert run.returncode == 0, run
