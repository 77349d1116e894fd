"""Pins issue 33, finding 1: a starved watchdog no longer lets a candidate hold memory over its budget.

On f6ba232, on the watchdog path (no writable cgroup v2: this machine, and the trainer as composed), processes that
each make tens of thousands of small mappings and spin made every look of the watchdog cost O(mappings)
(smaps_rollup walks them all), the watchdog shared a session (a scheduling group under the kernel's autogroup) with
them, and nothing failed closed when looks stopped arriving: children that called setsid and faulted in memory held
5-11 GiB against a 1 GiB budget until the deadline. Scaled to this machine: SPINNERS processes of MAPPINGS mappings
each, spinning on mmap/munmap (which also takes their mmap lock for writing, so that a walk of their mappings waits),
then HOGS children that setsid and fault in HOG_MIB each, against a 256 MiB budget; the solution answers right after
HOLD seconds. Now each look reads per-process counters (O(1)), the sandbox runs in its own session at nice 5, and a
look finding more than LATE_CPU s of the sandbox's CPU since the previous one kills it: the candidate must be killed
(memory over budget, or the watchdog outrun) at most EXCESS_BOUND_MIB over its budget, and well before the deadline.
On f6ba232 it was killed at 815 MiB (all four hogs' 800 MiB held), 559 MiB over.

A right answer must still pass with the machine at load 8: eight spinning processes, each in a session of its own
(so that each is a scheduling group of its own where autogroup applies), started and stopped by their pids.

Marker `slow` (not in `make test`'s fast tier; `make test-slow`, which .ci/run runs): about 60 s in all. The
starving candidate runs inside a memory cgroup of its own (CAP_MIB), so that nothing it does can hurt this machine;
where no memory cgroup can be made here the test skips, saying so."""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from polarstack.processes import stop_pid
from polarstack.reward import tasks, verifier

pytestmark = [pytest.mark.sandbox, pytest.mark.slow]

SPINNERS, MAPPINGS, HOGS, HOG_MIB, HOLD = 6, 45_000, 4, 200, 4.0
BUDGET_MIB = 256
EXCESS_BOUND_MIB = 128  # over the budget at the kill: measured 4-43 MiB (5 runs), 559 MiB on f6ba232
ENDED_BOUND = 6.0  # seconds from the hogs' start to the end of the run (teardown of the mappings included)
CAP_MIB = 2048  # the memory cgroup the starving candidate runs in

STARVING = r"""
import ctypes, os, sys, time
libc = ctypes.CDLL(None)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long)
libc.munmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
ready_r, ready_w = os.pipe()


def fork():
    try:
        return os.fork()
    except PermissionError:  # a filter refusing process creation: the sandbox is one process, under RLIMIT_AS
        os.write(2, b"NOFORK\n")
        os._exit(0)


for _ in range(SPINNERS):
    if fork() == 0:
        for i in range(MAPPINGS):  # alternate protections: no two neighbours merge into one mapping
            libc.mmap(None, 4096, 1 if i % 2 else 3, 0x22, -1, 0)
        os.write(ready_w, b"s")
        while True:
            libc.munmap(libc.mmap(None, 4096, 3, 0x22, -1, 0), 4096)
ready = 0
while ready < SPINNERS:
    ready += len(os.read(ready_r, 64))
os.write(2, b"HOGS %.3f\n" % time.monotonic())
for _ in range(HOGS):
    if fork() == 0:
        os.setsid()
        block = b"\x01" * (HOG_MIB << 20)  # written, so resident
        time.sleep(60)
        os._exit(0)


def f(x):
    time.sleep(HOLD)
    return x + 1
"""


def _candidate() -> str:
    values = dict(SPINNERS=SPINNERS, MAPPINGS=MAPPINGS, HOGS=HOGS, HOG_MIB=HOG_MIB, HOLD=HOLD)
    return "".join(f"{name} = {value!r}\n" for name, value in values.items()) + STARVING


@contextlib.contextmanager
def _memory_cgroup(limit_mib: int):
    """A memory cgroup of this test's own (v1 or v2, under this process's), removed after; skips where none."""
    own = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        own[controllers] = path
    candidates = []
    for controllers, path in own.items():
        if "memory" in controllers.split(","):
            candidates.append((Path("/sys/fs/cgroup/memory") / path.lstrip("/"), "memory.limit_in_bytes"))
    if "" in own:
        candidates.append((Path("/sys/fs/cgroup") / own[""].lstrip("/"), "memory.max"))
    for parent, limit_file in candidates:
        group = parent / f"polarstack-test-{secrets.token_hex(4)}"
        try:
            group.mkdir()
        except OSError:
            continue
        try:
            (group / limit_file).write_text(str(limit_mib << 20))
            with contextlib.suppress(OSError):
                (group / "memory.memsw.limit_in_bytes").write_text(str(limit_mib << 20))
            yield group
            return
        except OSError:
            pass
        finally:
            for _ in range(100):
                try:
                    group.rmdir()
                    break
                except OSError:
                    time.sleep(0.05)
    pytest.skip("no memory cgroup can be made here to cap the starving candidate (needs a writable memory controller)")


# Runs one verification in a process of its own inside the cgroup (its pid joins first), prints the outcome.
VERIFY_IN_CGROUP = r"""
import json, sys, time
group, candidate = sys.argv[1], sys.stdin.read()
with open(group + "/cgroup.procs", "w") as handle:
    handle.write(str(__import__("os").getpid()))
from polarstack.reward import verifier
problem = {"kind": "mbpp", "task_id": "starving", "test_list": ["assert f(1) == 2"], "test_setup_code": ""}
started = time.monotonic()
outcome = verifier.verify(problem, candidate, verifier.Limits(timeout=20, memory_mb=BUDGET_MIB))
print(json.dumps({"started": started, "ended": time.monotonic(), "passed": outcome.passed, "reason": outcome.reason,
                  "detail": outcome.detail, "tail": outcome.stderr_tail, "limits": outcome.limits}))
"""


def test_a_starving_candidate_is_killed_within_the_bound():
    with _memory_cgroup(CAP_MIB) as group:
        proc = subprocess.run(
            [sys.executable, "-c", VERIFY_IN_CGROUP.replace("BUDGET_MIB", str(BUDGET_MIB)), str(group)],
            input=_candidate(),
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["limits"].startswith("watchdog"), result  # the path this pins
    if "NOFORK" in result["tail"]:
        # The sandbox refuses process creation (issue 32's filter): the candidate of several processes dies at its
        # first fork, earns nothing and ends at once; one process under RLIMIT_AS is all a candidate has, and
        # test_a_single_starving_process_is_killed_within_the_bound pins the watchdog against that one.
        assert not result["passed"], result
        assert result["ended"] - result["started"] < ENDED_BOUND, result
        return
    hogs = re.findall(r"HOGS (\d+\.\d+)", result["tail"])
    assert hogs, result  # the candidate got as far as starting its hogs
    ended = result["ended"] - float(hogs[-1])
    print(f"starving candidate: {result['detail']!r}; ended {ended:.2f} s after its hogs started")
    assert not result["passed"], result
    killed = re.match(r"memory: the sandbox used (\d+) MiB, over its budget of 256 MiB|late: ", result["detail"])
    assert killed, result
    if killed.group(1):
        assert int(killed.group(1)) - BUDGET_MIB < EXCESS_BOUND_MIB, result
    assert ended < ENDED_BOUND, result


# One process (all a candidate has where process creation is refused): MAPPINGS small mappings (each look of the
# old watchdog walked them all), then files in its tmpfs and anonymous memory faulted in while it keeps mapping and
# unmapping, so that its process memory stays under RLIMIT_AS (the budget) while process + tmpfs pass the budget:
# only the watchdog's look can see that total.
SINGLE = r"""
import ctypes, os, time
libc = ctypes.CDLL(None)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long)
libc.munmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
for i in range(MAPPINGS):
    libc.mmap(None, 4096, 1 if i % 2 else 3, 0x22, -1, 0)
for n in range(FILES):
    with open("/tmp/fill-%d" % n, "wb") as handle:
        handle.write(b"\x02" * (15 << 20))
os.write(2, b"HOGS %.3f\n" % time.monotonic())
blocks = []
for _ in range(ANON_MIB):
    blocks.append(b"\x01" * (1 << 20))
    libc.munmap(libc.mmap(None, 4096, 3, 0x22, -1, 0), 4096)
time.sleep(HOLD)


def f(x):
    return x + 1
"""


def test_a_single_starving_process_is_killed_within_the_bound():
    # 10,000 mappings (39 MiB of address space), 120 MiB of files, 150 MiB anonymous: under RLIMIT_AS, over the budget.
    values = dict(MAPPINGS=10_000, FILES=8, ANON_MIB=150, HOLD=HOLD)
    candidate = "".join(f"{name} = {value!r}\n" for name, value in values.items()) + SINGLE
    with _memory_cgroup(CAP_MIB) as group:
        proc = subprocess.run(
            [sys.executable, "-c", VERIFY_IN_CGROUP.replace("BUDGET_MIB", str(BUDGET_MIB)), str(group)],
            input=candidate,
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["limits"].startswith("watchdog"), result
    assert not result["passed"], result
    hogs = re.findall(r"HOGS (\d+\.\d+)", result["tail"])
    assert hogs, result  # its files were written: the total went past the budget only through memory it then faulted
    killed = re.match(r"memory: the sandbox used (\d+) MiB, over its budget of 256 MiB|late: ", result["detail"])
    assert killed, result  # the watchdog, not the deadline or RLIMIT_AS, ended it
    if killed.group(1):
        assert int(killed.group(1)) - BUDGET_MIB < EXCESS_BOUND_MIB, result
    assert result["ended"] - float(hogs[-1]) < ENDED_BOUND, result


@contextlib.contextmanager
def _load(count: int):
    """`count` spinning processes, each in a session of its own, stopped by their pids."""
    spinners = [
        subprocess.Popen([sys.executable, "-S", "-c", "while True: pass"], start_new_session=True) for _ in range(count)
    ]
    try:
        time.sleep(1.0)
        yield
    finally:
        for process in spinners:
            stop_pid(process.pid, process, timeout=5)


def test_right_answers_pass_with_the_machine_at_load_8():
    problems = [
        p for p in tasks.load_humaneval() if p["task_id"] in {f"HumanEval/{n}" for n in (0, 2, 10, 32, 53, 129)}
    ]
    with _load(8):
        load_seen = os.getloadavg()[0]
        with ThreadPoolExecutor(max_workers=2) as pool:
            outcomes = list(pool.map(lambda p: verifier.verify(p, p["prompt"] + p["canonical_solution"]), problems))
    print(f"load average during the runs: {load_seen:.1f}; seconds: {[round(o.seconds, 2) for o in outcomes]}")
    for problem, outcome in zip(problems, outcomes, strict=True):
        assert outcome.passed, (problem["task_id"], outcome.reason, outcome.detail)
