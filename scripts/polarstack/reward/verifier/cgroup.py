"""Limits per sandbox, not per process: a cgroup v2 per verification where a writable one exists, else the
supervisor's watchdog (watchdog.py). Either way one sandbox's total memory, CPU time and process count is bounded,
not each of its processes' (RLIMIT_AS, RLIMIT_CPU and RLIMIT_NPROC stay as a second line, per process / per uid).

The cgroup: a child `polarstack-<random>` of $POLARSTACK_VERIFIER_CGROUP (a delegated cgroup v2 directory), or of
this process's own cgroup on a cgroup2 mount, used only if memory, pids and cpu are enabled in (or can be enabled
in) the parent's cgroup.subtree_control. It gets memory.max (the sandbox's memory, tmpfs pages included: shmem is
charged to the cgroup that writes it), memory.swap.max 0, memory.oom.group 1 (an out-of-memory kill takes the
whole sandbox), pids.max and cpu.max (one CPU); the sandbox's first process joins it before it unshares, and the
cgroup is killed (cgroup.kill) and removed with the run. See docs/tasks.md ("Limits per sandbox") for the grant the
trainer needs on the node.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import time
from pathlib import Path

CGROUP_ENV = "POLARSTACK_VERIFIER_CGROUP"
CONTROLLERS = ("memory", "pids", "cpu")
CPU_PERIOD_US = 100_000


def _cgroup2_dirs() -> list[Path]:
    """This process's own cgroup directory on every cgroup2 mount (/proc/self/cgroup's `0::` line)."""
    try:
        own = next(
            line.split("::", 1)[1]
            for line in Path("/proc/self/cgroup").read_text().splitlines()
            if line.startswith("0::")
        )
        mounts = [line.split() for line in Path("/proc/self/mountinfo").read_text().splitlines()]
    except (OSError, StopIteration):
        return []
    found = []
    for fields in mounts:
        dash = fields.index("-") if "-" in fields else -1
        if dash > 0 and fields[dash + 1] == "cgroup2":
            root, point = fields[3], fields[4]
            relative = own[len(root) :] if own.startswith(root) else own
            found.append(Path(point) / relative.lstrip("/"))
    return found


def _usable(parent: Path) -> bool:
    """memory, pids and cpu available to children of `parent` (enabled in its subtree_control, or enabled now)."""
    try:
        if not os.access(parent, os.W_OK | os.X_OK):
            return False
        available = set((parent / "cgroup.controllers").read_text().split())
        if not set(CONTROLLERS) <= available:
            return False
        enabled = set((parent / "cgroup.subtree_control").read_text().split())
        missing = [c for c in CONTROLLERS if c not in enabled]
        if missing:  # fails (EBUSY) where the parent holds processes itself: cgroup v2's no-internal-process rule
            (parent / "cgroup.subtree_control").write_text(" ".join("+" + c for c in missing))
        return True
    except OSError:
        return False


def cgroup_parent() -> Path | None:
    """The cgroup v2 directory under which each verification gets its own cgroup; None where there is none."""
    chosen = os.environ.get(CGROUP_ENV)
    for parent in [Path(chosen)] if chosen else _cgroup2_dirs():
        if _usable(parent):
            return parent
    return None


def create_cgroup(parent: Path, memory_mb: int, nproc: int) -> Path:
    """A fresh cgroup for one sandbox, its limits written; RuntimeError (one sentence) when it cannot be made."""
    path = parent / f"polarstack-{secrets.token_hex(6)}"
    try:
        path.mkdir(mode=0o755)
        (path / "memory.max").write_text(str(memory_mb << 20))
        for name, value in (("memory.swap.max", "0"), ("memory.oom.group", "1")):
            if (path / name).exists():  # absent without swap accounting, or on an older kernel
                (path / name).write_text(value)
        (path / "pids.max").write_text(str(nproc))
        (path / "cpu.max").write_text(f"{CPU_PERIOD_US} {CPU_PERIOD_US}")
    except OSError as exc:
        remove_cgroup(path)
        raise RuntimeError(
            f"cannot create the sandbox's cgroup under {parent} ({exc.strerror}); fix the delegation or unset "
            f"{CGROUP_ENV} (see docs/tasks.md, 'Limits per sandbox')"
        ) from None
    return path


def remove_cgroup(path: Path) -> None:
    """Kill whatever is left in the cgroup and remove it (retrying while the kernel still reaps its processes)."""
    if not path.is_dir():
        return
    with contextlib.suppress(OSError):
        if (path / "cgroup.kill").exists():
            (path / "cgroup.kill").write_text("1")
    for _ in range(200):
        try:
            path.rmdir()
            return
        except OSError as exc:
            if exc.errno == errno.ENOTEMPTY:  # not a cgroupfs (the tests' fake one): plain files to remove first
                for entry in path.iterdir():
                    with contextlib.suppress(OSError):
                        entry.unlink()
            elif exc.errno != errno.EBUSY:
                return
        time.sleep(0.01)


def describe_limits(cgroup: Path | None, memory_mb: int, cpu_seconds: int, nproc: int) -> str:
    """Which mechanism bounds the sandbox's total, as the verdict's details and the probe report it."""
    if cgroup is not None:
        return f"cgroup v2 {cgroup} (memory.max {memory_mb} MiB, pids.max {nproc}, cpu.max 1 CPU)"
    return (
        f"watchdog (no writable cgroup v2: the supervisor sums the sandbox's memory, tmpfs included, CPU time and "
        f"processes and kills the whole sandbox past {memory_mb} MiB, {cpu_seconds} s, {nproc} processes)"
    )
