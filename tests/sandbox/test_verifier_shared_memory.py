"""Pins issue 25, finding 3: on the fallback path (no writable cgroup v2: the supervisor's watchdog) memory counts
whatever kind it is. Four children each hold 48 MiB (together 192 MiB, over the 128 MiB budget) of shared anonymous memory,
a memfd, a System V segment, a POSIX shm object (`/dev/shm`) or a tmpfs file mapped shared; each program exits 0
only if all four held theirs for 1.5 s. Shared anonymous mappings and mapped tmpfs files are counted (since issue 33
the kernel's per-process counters, a shared page once per process that maps it) and the sandbox is killed; memfd_create and shmget are refused at creation (EPERM, exit 7), since
their memory can live without any mapping or file the watchdog sees. On b5354d1 the first three held their 192 MiB
(the watchdog counted resident memory less all shared pages); the shm and tmpfs cases held there too (the tmpfs'
size was counted) and are pinned here. Since issue 32 no child can be made: the parent holds every share itself,
within its own RLIMIT_AS, and the same budget holds."""

import pytest

from polarstack.reward import verifier
from polarstack.reward.verifier.limits import Limits, Run

pytestmark = pytest.mark.sandbox

HOLD = r"""
import ctypes, errno, mmap, os, sys, time
SIZE, CHUNK = 48 << 20, 8 << 20
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p


def refused():
    os._exit(7)


def hold(kind, index):
    # SIZE bytes of `kind`, written, in 8 MiB objects (each file under RLIMIT_FSIZE, 16 MiB).
    regions = []
    for part in range(SIZE // CHUNK):
        if kind == "shared_anonymous":
            region = mmap.mmap(-1, CHUNK, flags=mmap.MAP_SHARED | mmap.MAP_ANONYMOUS)
        elif kind == "sysv":
            shm = libc.shmget(0, CHUNK, 0o1000 | 0o600)  # IPC_PRIVATE, IPC_CREAT
            if shm < 0:
                refused() if ctypes.get_errno() == errno.EPERM else os._exit(9)
            address = libc.shmat(shm, None, 0)
            libc.shmctl(shm, 0, None)  # IPC_RMID: freed once detached, as a careful program does
            region = (ctypes.c_char * CHUNK).from_address(address)
            for offset in range(0, CHUNK, 4096):
                region[offset] = b"\x01"
            regions.append(region)
            continue
        else:
            if kind == "memfd":
                try:
                    fd = os.memfd_create("hold")
                except OSError as exc:
                    refused() if exc.errno == errno.EPERM else os._exit(9)
            else:  # a POSIX shm object (shm_open is an open() under /dev/shm), or a tmpfs file, mapped shared
                folder = "/dev/shm" if kind == "posix_shm" else "/tmp"
                fd = os.open("%s/hold-%d-%d" % (folder, index, part), os.O_RDWR | os.O_CREAT, 0o600)
            os.ftruncate(fd, CHUNK)
            region = mmap.mmap(fd, CHUNK, flags=mmap.MAP_SHARED)
            os.close(fd)
        for offset in range(0, CHUNK, 4096):
            region[offset] = 1
        regions.append(region)
    return regions


children, kept = [], hold(KIND, 0)  # the parent's own share first: memfd and System V are refused here (exit 7)
for index in range(1, 4):
    try:
        pid = os.fork()
    except PermissionError:  # no child (issue 32): the parent holds the share itself, within its own RLIMIT_AS
        kept += hold(KIND, index)
        continue
    if pid == 0:
        keep = hold(KIND, index)
        time.sleep(1.5)
        os._exit(0)
    children.append(pid)
time.sleep(1.5)
codes = [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in children]
sys.exit(7 if 7 in codes else 0 if codes == [0] * len(children) else 3)
"""


def _hold(kind: str) -> Run:
    return verifier.run_program(f"KIND = {kind!r}\n" + HOLD, Limits(timeout=15, memory_mb=128))


@pytest.mark.parametrize("kind", ["shared_anonymous", "posix_shm", "tmpfs_mapped_shared"])
def test_shared_memory_counts_against_the_sandboxs_budget(kind):
    run = _hold(kind)
    assert run.returncode not in (0, 3, 7, 9, None), run  # killed before the four children held their 192 MiB
    assert run.limits.startswith(("cgroup v2", "watchdog")), run.limits


@pytest.mark.parametrize("kind", ["memfd", "sysv"])
def test_memory_without_a_mapping_is_refused_at_creation(kind):
    run = _hold(kind)
    assert run.returncode == 7, run  # EPERM from the seccomp filter, with or without a cgroup
    assert run.limits.startswith(("cgroup v2", "watchdog")), run.limits


def test_a_shared_region_cannot_be_mapped_for_children():
    # Before issue 32, 48 MiB a parent shared with its children counted once per process that mapped it (issue 33's
    # per-process counters: with one child 96 MiB, held under 128 MiB; with three 192 MiB, killed). Now no child can
    # be made (EPERM at the first fork, seccomp.py): the region stays one process's, inside its own RLIMIT_AS.
    program = (
        "import mmap, os, sys\nregion = mmap.mmap(-1, 48 << 20, flags=mmap.MAP_SHARED | mmap.MAP_ANONYMOUS)\n"
        "for offset in range(0, 48 << 20, 4096):\n    region[offset] = 1\ntry:\n    pid = os.fork()\n"
        "except PermissionError:\n    sys.exit(5)\nif pid == 0:\n    os._exit(0)\nsys.exit(3)\n"
    )
    run = verifier.run_program(program, Limits(timeout=15, memory_mb=128))
    assert run.returncode == 5, run
