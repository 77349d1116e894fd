"""Sandboxed code verifier: run a task's hidden tests against a completion and return the reward (1.0 or 0.0).

Standard library only: `polarstack tasks prepare` writes this package as one self-contained file, eval/verifier.py
(polarstack.reward.verifier.bundle), and Polar's `test_on_output` evaluator runs it on its own. docs/tasks.md ("The
verifier's sandbox") states what holds where; in short:

Two processes per verification, and the reward never depends on anything the solution controls:
- the *candidate* process runs the solution's code only (never the tests), inside the sandbox below, and
  answers calls `name(*args)` over a pipe with the returned value, encoded as plain data of exact builtin
  types (`enc`); anything else (an object with a lying `__eq__`, a subclass, a generator) cannot be encoded;
- the *supervisor* (trusted, outside the sandbox) forks the sandbox side first, from a memory holding only the
  candidate's own source, then reads the tests and a per-run secret from an unlinked file, runs the tests with
  every call to the solution forwarded to the candidate and every answer decoded into fresh builtin values,
  every `assert` rewritten to a counted check and every `==` in an assert to a strict comparison
  (`strict_eq`), a failure recorded rather than raised so that the calls never depend on the answers (no oracle),
  tears the sandbox down and reports, with the secret, on a pipe only it holds;
- this process passes a solution only on that report: verdict "passed", the secret, at least one call and one
  check, and the sandbox's own status ("isolated" unless isolation is opted out) written before the candidate
  started. Exit codes, stdout and stderr of the candidate count for nothing.

The sandbox (default `namespaces`): new PID, network, mount, IPC and UTS namespaces (plus a user namespace
when not root, or root without CAP_SYS_ADMIN: then a helper outside maps the sandbox uid into it); a chroot into
a fresh tmpfs holding read-only binds of /usr, /etc and the interpreter's prefix, a private /tmp, /var/tmp and
/dev/shm, a minimal /dev of read-only device binds and its own /proc (or none); as root a uid per concurrent run,
locked across processes with flock, where the user namespace maps them; uid 0 of a namespace mapping root alone
(an Apptainer session of the trainer) keeps that uid for the candidate, with no /proc (host.py one_uid_shape);
rlimits (CPU, memory, file size, open files, processes); every capability dropped (bounding set, ambient, locked
securebits, capset); no_new_privs; a fresh session keyring and a seccomp filter (seccomp.py: keyrings and other
kernel state that outlives a run, and every way to make a process, a thread or a namespace); limits on the sandbox's total, by a cgroup v2 per run or the supervisor's watchdog (cgroup.py,
watchdog.py), named in every verdict. The process tree dies with the namespace's init, which the supervisor has killed at the deadline.
When the namespaces cannot be set up the verification is refused (IsolationUnavailable, a sentence naming the
fix) unless the user opts out with POLARSTACK_VERIFIER_ISOLATION=none (or `--isolation none`) in the verifier's
own environment or command line.

Usable as slime's `--custom-rm-path polarstack.reward.verifier.reward_func` (async `(args, sample, **kwargs)`,
see slime/rollout/rm_hub/__init__.py) and from Polar's `test_on_output` evaluator (`main()`).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import os
import re
import secrets
import select
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Iterable

# Also the names polarstack.reward.verifier had as one module (callers and tests use them from here).
from polarstack.reward.verifier.candidate import _RUNNER
from polarstack.reward.verifier.cgroup import cgroup_parent, create_cgroup, describe_limits, remove_cgroup
from polarstack.reward.verifier.host import (
    _CAP_CHOWN,
    _CAP_SETGID,
    _CAP_SETUID,
    _NEWUSER,
    _binds,
    _cap_last_cap,
    _kill_uid,
    _maps_sandbox_uids,
    _root_with,
    _sandbox_uid,
    _system_python,
    _unshare_flags,
    one_uid_shape,
)
from polarstack.reward.verifier.limits import (
    _GRACE,
    DEFAULT_TIMEOUT,
    ISOLATION_ENV,
    ISOLATION_MODES,
    IsolationUnavailable,
    Limits,
    Outcome,
    Run,
    isolation_mode,
)
from polarstack.reward.verifier.supervisor import _SUPERVISOR
from polarstack.reward.verifier.verdict import (
    failed_line,
    limits_note,
    passed_line,
    refusal_line,
    refusal_note,
)

# --- running: one supervisor per run, every wait bounded by the deadline ---------------------

TMPFS_MB = 256  # the sandbox's root, a fresh tmpfs (its files count against the memory budget too)
# The largest solution the verifier reads or sends into the sandbox, in bytes. A HumanEval or MBPP solution is a
# few KiB (the largest canonical HumanEval one with its prompt: under 3 KiB); 1 MiB leaves a model's longest
# completion room, stays far below the sandbox's 256 MiB tmpfs (so the candidate's files cannot fill it at
# set-up) and keeps the verifier's own copies of it (the text, its JSON in the sandbox's configuration) a few MiB.
SOLUTION_LIMIT = 1 << 20


class SolutionRefused(ValueError):
    """The solution file is not one the verifier reads: a symbolic link, not a regular file, or over the bound."""


def read_solution(path: str | os.PathLike[str], limit: int | None = None) -> str:
    """The text of the solution file at `path`, read without following a symbolic link (an agent's patch may
    make solution.py one, to /dev/zero or a host file), without blocking (a FIFO), only from a regular file, and
    at most `limit` bytes; SolutionRefused (one clause saying why) or OSError otherwise. O_NOFOLLOW concerns the
    last component only: the evaluator passes `solution.py`, a name in its working directory."""
    limit = SOLUTION_LIMIT if limit is None else limit
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise SolutionRefused("it is a symbolic link") from None
        raise
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            kind = next(
                (
                    name
                    for test, name in (
                        (stat.S_ISDIR, "a directory"),
                        (stat.S_ISFIFO, "a FIFO"),
                        (stat.S_ISCHR, "a character device"),
                        (stat.S_ISBLK, "a block device"),
                        (stat.S_ISSOCK, "a socket"),
                    )
                    if test(info.st_mode)
                ),
                "not a regular file",
            )
            raise SolutionRefused(f"it is {kind}, not a regular file")
        too_big = SolutionRefused(f"it is larger than the verifier's bound of {limit} bytes")
        if info.st_size > limit:
            raise too_big
        chunks, size = [], 0
        while size <= limit:  # the size may grow after fstat: never more than limit + 1 bytes
            chunk = os.read(fd, limit + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > limit:
            raise too_big
    finally:
        os.close(fd)
    try:
        return b"".join(chunks).decode("utf-8")
    except UnicodeDecodeError:
        raise SolutionRefused("it is not UTF-8 text") from None


def _tail(handle: Any) -> str:
    handle.seek(0, os.SEEK_END)
    size = handle.tell()
    handle.seek(max(0, size - 600))
    return handle.read().decode("utf-8", "replace")[-600:]


def _read_until_eof(fd: int, deadline: float) -> tuple[bytes, bool]:
    """What a pipe carries until its writers close it or `deadline` passes; (data, reached end-of-file)."""
    chunks = []
    while (left := deadline - time.monotonic()) > 0:
        if select.select([fd], [], [], left)[0]:
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                return b"".join(chunks), True
            chunks.append(chunk)
    return b"".join(chunks), False


def _supervise(
    files: dict[str, str], argv_tail: list[str], limits: Limits, task: dict[str, Any] | None
) -> tuple[dict[str, Any], str, float, str]:
    """Run one supervisor (sandbox + judge when `task` is given); every wait is bounded. Returns its report (empty
    when it gave none carrying this run's secret), the tail of the program's and supervisor's stderr, seconds, and
    which mechanism bounded the sandbox's total (describe_limits)."""
    isolate = isolation_mode(limits.isolation) == "namespaces"
    started = time.monotonic()
    secret = secrets.token_hex(16)
    flags, one_uid, by_helper, wanted = _sandbox_shape(isolate)
    parent = cgroup_parent()
    with _sandbox_uid(wanted) as uid, _sandbox_cgroup(parent, limits) as cgroup:
        python = _system_python()
        workdir = None if isolate else tempfile.mkdtemp(prefix="polarstack-verify-")
        why = _fill_workdir(workdir, files, uid) if workdir else None
        if why is not None:  # the candidate's files (isolation off): a wrong answer, as inside
            detail = f"the sandbox cannot hold the solution's files ({why})"
            report = {"verdict": "failed", "detail": detail, "status": "files " + why}
            mechanism = describe_limits(cgroup, limits.memory_mb, limits.cpu_seconds, limits.nproc)
            return report, "", time.monotonic() - started, mechanism
        report_r, report_w = os.pipe()
        sandbox = _sandbox_config(
            isolate, flags, by_helper, one_uid, python, files, uid, workdir, limits, argv_tail, task, report_w, cgroup
        )
        head = json.dumps(sandbox).encode()
        stderr = tempfile.TemporaryFile()
        process = _start_supervisor(head, task, secret, report_w, stderr)
        try:
            report = _await_report(process, report_r, limits, secret)
        finally:
            os.close(report_r)
            if workdir:
                _remove_workdir(workdir, uid)
        tail = _tail(stderr)
        stderr.close()
    report = _checked_status(report, isolate)
    mechanism = describe_limits(cgroup, limits.memory_mb, limits.cpu_seconds, limits.nproc)
    return report, tail, time.monotonic() - started, mechanism


def _sandbox_shape(isolate: bool) -> tuple[int, bool, bool, bool]:
    """How this process can set up the sandbox: (unshare flags, one-uid shape, uid mapped by a helper, switch the
    program to a sandbox uid); IsolationUnavailable when root without CAP_SYS_ADMIN also lacks what the helper needs."""
    flags = _unshare_flags()
    # uid 0 of a user namespace without the sandbox uids (an Apptainer session of the trainer): no uid to switch
    # to, so the candidate stays that uid 0, without capabilities, /proc or processes of its own (host.py).
    one_uid = isolate and one_uid_shape()
    # Root without CAP_SYS_ADMIN: a user namespace into which a helper maps the sandbox uid (needs CAP_SETUID and
    # CAP_SETGID; without them the program would run as the host's root, which RLIMIT_NPROC does not bind).
    by_helper = bool(isolate and flags & _NEWUSER and os.geteuid() == 0 and not one_uid)
    if by_helper and not _root_with(_CAP_SETUID, _CAP_SETGID):
        raise IsolationUnavailable(
            "the verifier's sandbox cannot be set up here (root without CAP_SYS_ADMIN needs CAP_SETUID and CAP_SETGID "
            "to run the program as a sandbox uid); grant the verifier's process CAP_SYS_ADMIN, or CAP_SETUID and "
            "CAP_SETGID (see docs/tasks.md)"
        )
    # Root switches the program to a sandbox uid when it can: isolated, always (directly or through the helper's
    # map) unless no sandbox uid is mapped; with isolation off, when it holds the capabilities to chown, setgid and
    # setuid.
    if isolate:
        wanted = (by_helper or not flags & _NEWUSER) and not one_uid
    else:
        wanted = _root_with(_CAP_SETUID, _CAP_SETGID, _CAP_CHOWN) and _maps_sandbox_uids()
    return flags, one_uid, by_helper, wanted


def _fill_workdir(workdir: str, files: dict[str, str], uid: int) -> str | None:
    """Isolation off: the candidate's files written into `workdir` and given to `uid` (when one is switched to).
    Returns why they do not fit (the directory removed), None when they do."""
    try:
        for name, text in files.items():
            Path(workdir, name).write_text(text, encoding="utf-8")
    except (OSError, ValueError) as exc:
        shutil.rmtree(workdir, ignore_errors=True)
        return f"{exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__}"
    if uid >= 0:
        for path in (workdir, *(Path(workdir, name) for name in files)):
            os.chown(path, uid, uid)
    return None


def _sandbox_config(
    isolate: bool,
    flags: int,
    by_helper: bool,
    one_uid: bool,
    python: str,
    files: dict[str, str],
    uid: int,
    workdir: str | None,
    limits: Limits,
    argv_tail: list[str],
    task: dict[str, Any] | None,
    report_w: int,
    cgroup: Path | None,
) -> dict[str, Any]:
    """The sandbox side's configuration, the head of the supervisor's stdin."""
    return {
        "isolate": isolate,
        "unshare_flags": flags,
        "map_by_helper": by_helper,
        "one_uid": one_uid,
        "cap_last_cap": _cap_last_cap(),
        "binds": _binds(python),
        "files": files,
        "uid": uid,
        "workdir": workdir,
        "tmpfs_mb": TMPFS_MB,
        "cpu": limits.cpu_seconds,
        "memory_mb": limits.memory_mb,
        "file_size_mb": limits.file_size_mb,
        "nproc": limits.nproc,
        "open_files": limits.open_files,
        "argv": [python, "-I", *argv_tail],
        "judge": task is not None,
        "timeout": limits.timeout,
        "report": report_w,
        "cgroup": str(cgroup) if cgroup else None,
        "watchdog": cgroup is None,
        "env": {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "LANG": "C.UTF-8",
            "HOME": workdir or "/sandbox",
            "PYTHONDONTWRITEBYTECODE": "1",
            # One thread: the seccomp filter refuses clone and clone3 (seccomp.py), so libraries must not try.
            "OMP_NUM_THREADS": "1",
            "OPENBLAS_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1",
        },
    }


def _start_supervisor(
    head: bytes, task: dict[str, Any] | None, secret: str, report_w: int, stderr: Any
) -> subprocess.Popen:
    """The supervisor started in a session of its own, its stdin the sandbox's configuration then the judge's task
    with the secret, its output into `stderr`; `report_w` (the report pipe's write end) is closed here either way."""
    try:
        with tempfile.TemporaryFile() as stdin:
            stdin.write(b"%012d" % len(head) + head + json.dumps(dict(task or {}, secret=secret)).encode())
            stdin.seek(0)
            return subprocess.Popen(
                [sys.executable, "-I", "-S", "-c", _SUPERVISOR],
                stdin=stdin,
                stdout=stderr,
                stderr=stderr,
                env={},
                pass_fds=(report_w,),
                start_new_session=True,
            )
    finally:
        os.close(report_w)


def _await_report(process: subprocess.Popen, report_r: int, limits: Limits, secret: str) -> dict[str, Any]:
    """The supervisor's report (parse_report: empty unless it carries `secret`), once it exited."""
    # The report pipe reaches end-of-file when the supervisor exits; wait for that, never past the backstop.
    data, ended = _read_until_eof(report_r, time.monotonic() + limits.timeout + 3 * _GRACE)
    if not ended:  # backstop: its own deadline did not hold; its sandbox dies with it (pdeathsig)
        process.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=_GRACE)
    return parse_report(data, secret)


def _remove_workdir(workdir: str, uid: int) -> None:
    """Isolation off: the sandbox uid's processes killed, then the working directory removed."""
    if uid >= 0:
        _kill_uid(uid)
    shutil.rmtree(workdir, ignore_errors=True)


def _checked_status(report: dict[str, Any], isolate: bool) -> dict[str, Any]:
    """The report, failed when the candidate's own files did not fit (write_files); IsolationUnavailable (isolated)
    or RuntimeError when the sandbox could not be set up."""
    status = str(report.get("status", ""))
    if status.startswith("files "):  # the candidate's own files did not fit (write_files): a wrong answer
        return dict(report, verdict="failed", detail=f"the sandbox cannot hold the solution's files ({status[6:]})")
    if status.startswith("error "):
        if isolate:
            raise IsolationUnavailable(
                f"the verifier's sandbox cannot be set up here ({status[6:]}); run it as root with CAP_SYS_ADMIN, or "
                f"where user namespaces are allowed (see docs/tasks.md)"
            )
        raise RuntimeError(f"the sandbox could not start: {status[6:]}")
    return report


@contextlib.contextmanager
def _sandbox_cgroup(parent: Path | None, limits: Limits):
    """The run's own cgroup under `parent`, removed with the run; None (the watchdog bounds it) without one."""
    if parent is None:
        yield None
        return
    cgroup = create_cgroup(parent, limits.memory_mb, limits.nproc)
    try:
        yield cgroup
    finally:
        remove_cgroup(cgroup)


def run_program(program: str, limits: Limits | None = None) -> Run:
    """Run `program` (Python source, as program.py in the sandbox's working directory); its exit code is reported
    for probing the sandbox, never used as a reward."""
    limits = limits or Limits()
    report, tail, seconds, mechanism = _supervise({"program.py": program}, ["program.py"], limits, None)
    timed_out = report.get("verdict") == "timeout"
    return Run(None if timed_out else report.get("returncode"), timed_out, seconds, tail, mechanism)


def probe_sandbox(limits: Limits | None = None) -> None:
    """Raise IsolationUnavailable (or ValueError for an unknown mode) unless a program can run in the sandbox."""
    limits = limits or Limits()
    run = run_program("pass\n", Limits(timeout=max(limits.timeout, 5.0), isolation=limits.isolation))
    if run.returncode != 0:
        raise RuntimeError(
            f"a program that does nothing failed in the sandbox (exit {run.returncode}): {run.stderr_tail[-200:]}"
        )


# --- task data: what the candidate gets (never the tests) and what the judge gets --------------------------

_FENCE = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)```", re.S)


def extract_code(completion: str) -> str:
    """The code of a chat completion: the last fenced block that looks like code, else the text itself."""
    blocks = _FENCE.findall(completion or "")
    return blocks[-1] if blocks else (completion or "")


def _is_mbpp(problem: dict[str, Any]) -> bool:
    return problem.get("kind") == "mbpp" or "test_list" in problem


def solution_source(problem: dict[str, Any], completion: str) -> str:
    """The candidate's module: HumanEval prompt + completion (or the completion alone when it defines the entry
    point); MBPP setup code + completion. The tests are not part of it."""
    code = extract_code(completion)
    if _is_mbpp(problem):
        return f"{problem.get('test_setup_code') or ''}\n{code}\n"
    if re.search(rf"^\s*def\s+{re.escape(problem['entry_point'])}\s*\(", code, re.M):
        return code
    return problem["prompt"] + code


def _judge_task(problem: dict[str, Any]) -> dict[str, Any]:
    if _is_mbpp(problem):
        return {"kind": "mbpp", "setup": problem.get("test_setup_code") or "", "tests": list(problem["test_list"])}
    return {
        "kind": "humaneval",
        "prompt": problem["prompt"],
        "test": problem["test"],
        "entry_point": problem["entry_point"],
    }


def verify(problem: dict[str, Any], completion: str, limits: Limits | None = None, seed: int | None = None) -> Outcome:
    """Run the problem's tests against the completion; raises IsolationUnavailable (fail closed). `seed`: the
    tests' random inputs (a fresh one per run unless given, as tests comparing two runs do)."""
    limits = limits or Limits()
    task = dict(_judge_task(problem), seed=secrets.randbits(64) if seed is None else seed)
    source = solution_source(problem, completion)
    size = len(source.encode("utf-8", "surrogatepass"))
    if size > SOLUTION_LIMIT:  # never sent into the sandbox: it could fill its disk at set-up (a wrong answer)
        detail = f"the solution is {size} bytes, over the verifier's bound of {SOLUTION_LIMIT} bytes"
        return Outcome(
            False,
            "failed",
            0.0,
            detail,
            limits=describe_limits(None, limits.memory_mb, limits.cpu_seconds, limits.nproc),
        )
    report, tail, seconds, mechanism = _supervise({"solution.py": source}, ["-c", _RUNNER], limits, task)
    verdict, detail = report.get("verdict"), str(report.get("detail", ""))
    calls, checks = int(report.get("calls") or 0), int(report.get("checks") or 0)
    if verdict == "timeout" or (not report and seconds >= limits.timeout):
        return Outcome(False, "timeout", seconds, detail or "deadline passed", tail, calls, checks, mechanism)
    if not report:
        return Outcome(False, "error", seconds, "the supervisor gave no valid report", tail, limits=mechanism)
    wanted = "isolated" if isolation_mode(limits.isolation) == "namespaces" else "unisolated"
    if verdict == "passed" and report.get("status") == wanted and calls > 0 and checks > 0:
        return Outcome(True, "passed", seconds, "", tail, calls, checks, mechanism)
    detail = detail or f"sandbox status {report.get('status')!r}"
    return Outcome(False, "failed", seconds, detail, tail, calls, checks, mechanism)


def parse_report(data: bytes, secret: str) -> dict[str, Any]:
    """The judge's single report line, if it carries this run's secret; else nothing."""
    lines = data.splitlines()
    if len(lines) != 1:
        return {}
    try:
        report = json.loads(lines[0])
    except ValueError:
        return {}
    if not isinstance(report, dict) or not secrets.compare_digest(str(report.get("secret", "")), secret):
        return {}
    return report


def verify_many(
    items: Iterable[tuple[dict[str, Any], str]],
    limits: Limits | None = None,
    workers: int | None = None,
    on_outcome: Callable[[Outcome], None] | None = None,
) -> list[Outcome]:
    """Each (problem, solution) verified in parallel sandboxes, outcomes in the items' order; `on_outcome` is called
    with each outcome as it is collected (in order), e.g. to advance a progress bar."""
    items = list(items)
    outcomes: list[Outcome] = []
    with ThreadPoolExecutor(max_workers=workers or max(2, os.cpu_count() or 2)) as pool:
        for outcome in pool.map(lambda pair: verify(pair[0], pair[1], limits), items):
            outcomes.append(outcome)
            if on_outcome is not None:
                on_outcome(outcome)
    return outcomes


# --- slime's custom reward hook --------------------------------------------------------------------------


async def reward_func(args: Any, sample: Any, **kwargs: Any) -> float:
    """slime `--custom-rm-path polarstack.reward.verifier.reward_func`: 1.0 when the sample's code passes its tests.

    The problem travels in `sample.metadata["problem"]` (written by `polarstack tasks prepare`); the
    completion is `sample.response`. Missing task data or a sandbox that cannot be set up gives 0.0 with the
    reason in sample.metadata["verifier_error"].
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
    try:
        outcome = await asyncio.to_thread(verify, problem, getattr(sample, "response", "") or "", limits)
    except (IsolationUnavailable, RuntimeError, ValueError) as exc:
        metadata["verifier_error"] = str(exc)
        return 0.0
    metadata["verifier_reason"] = outcome.reason
    metadata["verifier_limits"] = outcome.limits  # which mechanism bounded the sandbox's total
    return outcome.reward


# --- command line: Polar's test_on_output evaluator runs this file on its own -----------------------------


def main(argv: list[str] | None = None) -> int:
    """`python3 verifier.py --problem problem.json --solution solution.py --name NAME`: prints `PASSED NAME`
    only on the judge's authenticated report; exit 0 passed, 1 failed, 8 sandbox unavailable (one sentence)."""
    import argparse

    parser = argparse.ArgumentParser(description="Run a task's hidden tests against a solution file, sandboxed.")
    parser.add_argument("--problem", required=True, help="problem.json written by polarstack tasks prepare")
    parser.add_argument("--solution", required=True, help="the agent's solution file")
    parser.add_argument("--name", default="verifier", help="test name printed with PASSED/FAILED")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, help="wall-clock seconds")
    parser.add_argument(
        "--isolation",
        choices=ISOLATION_MODES,
        default=None,
        help=f"namespaces (default) or none: opt out of the sandbox's namespaces (also {ISOLATION_ENV})",
    )
    args = parser.parse_args(argv)
    try:
        problem = json.loads(Path(args.problem).read_text(encoding="utf-8"))  # written by prepare: trusted
    except (OSError, ValueError) as exc:
        print(failed_line(args.name, "cannot read the task files", exc))
        return 1
    try:  # written by the agent's patch: a symbolic link, a FIFO, a device or a huge file is a wrong answer
        completion = read_solution(args.solution)
    except (OSError, ValueError) as exc:
        reason = exc if isinstance(exc, SolutionRefused) else exc.strerror or type(exc).__name__
        print(failed_line(args.name, "failed", f"the solution file {args.solution} is not read: {reason}"))
        return 1
    try:
        outcome = verify(problem, completion, Limits(timeout=args.timeout, isolation=args.isolation))
    except (IsolationUnavailable, RuntimeError, ValueError) as exc:
        print(refusal_line(args.name))
        print(refusal_note(exc), file=sys.stderr)
        return 8
    except Exception as exc:  # a crash after the candidate ran: still one FAILED line, never a traceback
        print(failed_line(args.name, "error", f"the verifier failed: {type(exc).__name__}"))
        return 1
    print(limits_note(outcome.limits), file=sys.stderr)  # the in-trainer probe reports it
    if outcome.passed:
        print(passed_line(args.name))
        return 0
    print(failed_line(args.name, outcome.reason, outcome.detail))
    return 1
