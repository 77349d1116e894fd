"""The sandbox's host side: what this machine allows (capabilities, uid maps, unshare flags), the sandbox uids
(one per concurrent run, locked with flock) and the interpreter and binds the sandbox gets."""

from __future__ import annotations

import contextlib
import fcntl
import os
import random
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from polarstack.reward.verifier.limits import SLOTS, VERIFIER_UID_BASE

_NEWNS, _NEWUTS, _NEWIPC, _NEWUSER, _NEWPID, _NEWNET = 0x20000, 0x4000000, 0x8000000, 0x10000000, 0x20000000, 0x40000000


_CAP_CHOWN, _CAP_SETGID, _CAP_SETUID, _CAP_SYS_ADMIN = 0, 6, 7, 21  # bits of CapEff (linux/capability.h)


def _effective_capabilities() -> int:
    """This process's effective capability set (CapEff in /proc/self/status); none where it cannot be read."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("CapEff:"):
                return int(line.split()[1], 16)
    return 0


def _root_with(*capabilities: int) -> bool:
    """Effective uid 0 holding every one of `capabilities` (root in a Docker container lacks CAP_SYS_ADMIN)."""
    held = _effective_capabilities() if os.geteuid() == 0 else 0
    return os.geteuid() == 0 and all(held >> cap & 1 for cap in capabilities)


def map_holds_sandbox_uids(text: str) -> bool:
    """Whether a uid_map or gid_map (`first outside count` lines) has the ids VERIFIER_UID_BASE.. (one per slot)."""
    numbers = [int(n) for n in text.split()]
    extents = [numbers[i : i + 3] for i in range(0, len(numbers) - 2, 3)]
    return any(first <= VERIFIER_UID_BASE and VERIFIER_UID_BASE + SLOTS <= first + count for first, _, count in extents)


def _maps_sandbox_uids() -> bool:
    """Whether this process's user namespace has the uids and gids VERIFIER_UID_BASE.. (one per slot): not when it
    maps root alone, as `unshare --user --map-root-user` does. True where the maps cannot be read."""
    for name in ("uid_map", "gid_map"):
        try:
            if not map_holds_sandbox_uids(Path("/proc/self", name).read_text()):
                return False
        except (OSError, ValueError):
            continue
    return True


def one_uid_shape(euid: int | None = None, maps_sandbox_uids: bool | None = None) -> bool:
    """uid 0 of a user namespace that does not map the sandbox uids (`0 0 1`, as apptainer gives root without
    CAP_SYS_ADMIN, configs/upstream/apptainer-userns.json): the candidate then runs as that uid 0, with every
    capability dropped, no /proc and no way to make a process (seccomp.py); there is no other uid to switch to.
    This process's own euid and maps unless given (verify-offline classes the recorded map with them)."""
    euid = os.geteuid() if euid is None else euid
    return euid == 0 and not (_maps_sandbox_uids() if maps_sandbox_uids is None else maps_sandbox_uids)


def _cap_last_cap() -> int:
    """The highest capability this kernel knows (/proc/sys/kernel/cap_last_cap); 63 where it cannot be read (the
    sandbox side then drops every one the kernel accepts)."""
    with contextlib.suppress(OSError, ValueError):
        return int(Path("/proc/sys/kernel/cap_last_cap").read_text())
    return 63


def _unshare_flags() -> int:
    """Root that may create the namespaces and switch to a sandbox uid does so directly; anyone else (a user, or
    root without CAP_SYS_ADMIN) creates a user namespace first, which needs no capability."""
    flags = _NEWNS | _NEWUTS | _NEWIPC | _NEWPID | _NEWNET
    return flags if _root_with(_CAP_SYS_ADMIN, _CAP_SETUID, _CAP_SETGID, _CAP_CHOWN) else flags | _NEWUSER


# --- sandbox uids (root only): one per concurrent run across every verifier process ----------------------


def _pids_of_uid(uid: int) -> list[int]:
    """Live (non-zombie) processes owned by `uid`."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if entry.stat().st_uid != uid:
                continue
            text = (entry / "stat").read_text()
        except OSError:
            continue
        if text[text.rindex(")") + 2 :].split()[0] != "Z":
            pids.append(int(entry.name))
    return pids


def _lock_dir() -> Path:
    for base in ("/run", tempfile.gettempdir()):
        folder = Path(base) / "polarstack-verifier-slots"
        with contextlib.suppress(OSError):
            folder.mkdir(mode=0o700, exist_ok=True)
            info = os.lstat(folder)
            if stat.S_ISDIR(info.st_mode) and info.st_uid == os.geteuid() and not info.st_mode & 0o077:
                return folder
    raise RuntimeError("no private directory for the sandbox uid locks (/run or the temporary directory)")


@contextlib.contextmanager
def _sandbox_uid(wanted: bool):
    """A uid no other run (in any process) holds: flock on <lock dir>/<slot>.lock, released with the fd; -1 (no
    uid switch, no lock) unless `wanted`."""
    if not wanted:
        yield -1
        return
    folder = _lock_dir()
    start = random.randrange(SLOTS)
    for offset in range(SLOTS):
        slot = (start + offset) % SLOTS
        fd = os.open(folder / f"{slot}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        if _pids_of_uid(VERIFIER_UID_BASE + slot):  # left by a run that was killed with isolation off
            os.close(fd)
            continue
        try:
            yield VERIFIER_UID_BASE + slot
        finally:
            os.close(fd)
        return
    raise RuntimeError(f"all {SLOTS} sandbox uids are busy")


def _kill_uid(uid: int) -> None:
    """SIGKILL every process of `uid` (isolation off only): kill(-1) sent as that uid, which no other run holds."""
    for _ in range(100):
        if not _pids_of_uid(uid):
            return
        subprocess.run(
            [_system_python(), "-I", "-S", "-c", "import os\ntry:\n    os.kill(-1, 9)\nexcept OSError:\n    pass"],
            user=uid,
            group=uid,
            extra_groups=[],
            env={},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            check=False,
            timeout=10,
        )
        time.sleep(0.01)


def _world_executable(path: Path) -> bool:
    try:
        real = path.resolve(strict=True)
    except OSError:
        return False
    return all(parent.stat().st_mode & 0o001 for parent in real.parents) and bool(real.stat().st_mode & 0o001)


def _system_python() -> str:
    """The candidate's interpreter: POLARSTACK_VERIFIER_PYTHON, else one any uid can execute."""
    chosen = os.environ.get("POLARSTACK_VERIFIER_PYTHON")
    if chosen:
        return chosen
    for candidate in (Path("/usr/bin/python3"), Path("/usr/local/bin/python3"), Path(sys.executable)):
        if _world_executable(candidate):
            return str(candidate)
    raise RuntimeError(
        "no Python interpreter the sandbox uid can execute; set POLARSTACK_VERIFIER_PYTHON to one, "
        "for example /usr/bin/python3"
    )


def _binds(python: str) -> list[str]:
    """Read-only binds of the sandbox's root: /usr, /etc and the interpreter's installation prefix."""
    binds = ["/usr", "/etc"]
    prefix = str(Path(os.path.realpath(python)).parent.parent)
    if prefix != "/" and not any(prefix == b or prefix.startswith(b + "/") for b in binds):
        binds.append(prefix)
    return binds
