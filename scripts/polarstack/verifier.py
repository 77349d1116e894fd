"""Sandboxed code verifier: run a task's hidden tests against a completion and return the reward (1.0 or 0.0).

Standard library only and self-contained: `polarstack tasks prepare` copies this file to eval/verifier.py and
Polar's `test_on_output` evaluator runs it on its own. docs/tasks.md ("The verifier's sandbox") states what
holds where; in short:

Two processes per verification, and the reward never depends on anything the solution controls:
- the *candidate* process runs the solution's code only (never the tests), inside the sandbox below, and
  answers calls `name(*args)` over a pipe with the returned value, encoded as plain data of exact builtin
  types (`enc`); anything else (an object with a lying `__eq__`, a subclass, a generator) cannot be encoded;
- the *supervisor* (trusted, outside the sandbox) forks the sandbox side first, from a memory holding only the
  candidate's own source, then reads the tests and a per-run secret from an unlinked file, runs the tests with
  every call to the solution forwarded to the candidate and every answer decoded into fresh builtin values,
  every `assert` rewritten to a counted check and every `==` in an assert to a strict comparison
  (`strict_eq`), tears the sandbox down and reports, with the secret, on a pipe only it holds;
- this process passes a solution only on that report: verdict "passed", the secret, at least one call and one
  check, and the sandbox's own status ("isolated" unless isolation is opted out) written before the candidate
  started. Exit codes, stdout and stderr of the candidate count for nothing.

The sandbox (default `namespaces`): new PID, network, mount, IPC and UTS namespaces (plus a user namespace
when not root, or root without CAP_SYS_ADMIN: then a helper outside maps the sandbox uid into it); a chroot into
a fresh tmpfs holding read-only binds of /usr, /etc and the interpreter's prefix, a private /tmp, /var/tmp and
/dev/shm, a minimal /dev and its own /proc (or none); as root a uid per concurrent run, locked across
processes with flock; rlimits (CPU, memory, file size, open files, processes);
no_new_privs. The process tree dies with the namespace's init, which the supervisor has killed at the deadline.
When the namespaces cannot be set up the verification is refused (IsolationUnavailable) unless the user opts
out with POLARSTACK_VERIFIER_ISOLATION=none (or `--isolation none`).

Usable as slime's `--custom-rm-path polarstack.verifier.reward_func` (async `(args, sample, **kwargs)`,
see slime/rollout/rm_hub/__init__.py) and from Polar's `test_on_output` evaluator (`main()`).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import random
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

VERIFIER_UID_BASE = 61000  # slots 61000..61999: unused by Debian's system and regular users
SLOTS = 1000
DEFAULT_TIMEOUT = 10.0
DEFAULT_MEMORY_MB = 1024
DEFAULT_NPROC = 32
ISOLATION_ENV = "POLARSTACK_VERIFIER_ISOLATION"
ISOLATION_MODES = ("namespaces", "none")
_GRACE = 2.0  # seconds allowed for tearing a sandbox down after its deadline


class IsolationUnavailable(RuntimeError):
    """The sandbox's namespaces could not be set up here; verifying without them needs an explicit opt-out."""


@dataclass
class Limits:
    timeout: float = DEFAULT_TIMEOUT  # wall clock, seconds
    cpu_seconds: int = 10
    memory_mb: int = DEFAULT_MEMORY_MB
    nproc: int = DEFAULT_NPROC
    file_size_mb: int = 16
    open_files: int = 64
    isolation: str | None = None  # "namespaces" or "none"; None: $POLARSTACK_VERIFIER_ISOLATION, else namespaces


@dataclass
class Outcome:
    """A verification: passed only on the judge's authenticated report."""
    passed: bool
    reason: str  # "passed", "failed", "timeout", "error"
    seconds: float
    detail: str = ""
    stderr_tail: str = ""
    calls: int = 0
    checks: int = 0

    @property
    def reward(self) -> float:
        return 1.0 if self.passed else 0.0


@dataclass
class Run:
    """A raw program's run in the sandbox (for probing the sandbox itself; never a reward)."""
    returncode: int | None
    timed_out: bool
    seconds: float
    stderr_tail: str = ""


def isolation_mode(value: str | None = None) -> str:
    mode = (value or os.environ.get(ISOLATION_ENV) or "namespaces").strip().lower()
    if mode not in ISOLATION_MODES:
        raise ValueError(f"unknown verifier isolation {mode!r}; use one of {', '.join(ISOLATION_MODES)}")
    return mode


# --- plain-data codec, shared by the candidate's runner and the judge (exact builtin types only) -----------

_CODEC = r'''
def enc(x, depth=0):
    if depth > 200:
        raise ValueError("value nested too deeply to cross the sandbox boundary")
    t = type(x)
    if x is None or t is bool or t is str or t is float:
        return x
    if t is int:
        return x if -(1 << 62) < x < (1 << 62) else {"I": format(x, "x")}
    if t is list:
        return [enc(v, depth + 1) for v in x]
    if t is tuple:
        return {"T": [enc(v, depth + 1) for v in x]}
    if t is dict:
        return {"D": [[enc(k, depth + 1), enc(v, depth + 1)] for k, v in x.items()]}
    if t is set or t is frozenset:
        return {"S" if t is set else "Z": [enc(v, depth + 1) for v in x]}
    if t is bytes:
        return {"B": x.hex()}
    if t is complex:
        return {"C": [x.real, x.imag]}
    raise TypeError("a %s cannot cross the sandbox boundary (plain data only)" % t.__name__)


def dec(j, depth=0):
    if depth > 200:
        raise ValueError("value nested too deeply")
    t = type(j)
    if j is None or t is bool or t is int or t is float or t is str:
        return j
    if t is list:
        return [dec(v, depth + 1) for v in j]
    if t is dict and len(j) == 1:
        (tag, body), = j.items()
        if tag == "I" and type(body) is str:
            return int(body, 16)
        if tag == "B" and type(body) is str:
            return bytes.fromhex(body)
        if tag == "C" and type(body) is list and len(body) == 2 and all(type(v) is float for v in body):
            return complex(body[0], body[1])
        if type(body) is list:
            items = [dec(v, depth + 1) for v in body] if tag != "D" else None
            if tag == "T":
                return tuple(items)
            if tag == "S":
                return set(items)
            if tag == "Z":
                return frozenset(items)
            if tag == "D" and all(type(p) is list and len(p) == 2 for p in body):
                return {dec(k, depth + 1): dec(v, depth + 1) for k, v in body}
    raise ValueError("malformed value from the sandbox")
'''

# --- the candidate's side: load the solution, then answer calls; it never sees the tests -------------------

_RUNNER = r'''
import json, os
''' + _CODEC + r'''

def _send(obj):
    data = (json.dumps(obj) + "\n").encode()
    while data:
        data = data[os.write(4, data):]


def _describe(exc):
    try:
        return ("%s: %s" % (type(exc).__name__, exc))[:300]
    except BaseException:
        return type(exc).__name__


def _main():
    namespace = {"__name__": "solution", "__builtins__": __builtins__}
    try:
        with open("solution.py", encoding="utf-8") as handle:
            source = handle.read()
        exec(compile(source, "solution.py", "exec"), namespace)
    except BaseException as exc:
        _send({"load_error": _describe(exc)})
        return
    _send({"ready": True})
    for line in os.fdopen(3, "rb"):
        try:
            request = json.loads(line)
            value = namespace[request["call"]](*dec(request["args"]), **dec(request["kwargs"]))
            answer = {"value": enc(value)}
        except BaseException as exc:
            answer = {"raised": type(exc).__name__, "message": _describe(exc)}
        _send(answer)


_main()
'''

# --- the supervisor: one trusted process per run, outside the sandbox. It forks the sandbox side first (from a
# memory that holds only the candidate's own files), then reads the tests and the secret, judges, tears the
# sandbox down and reports on a pipe only it holds. ----------------------------------------------------------

_SANDBOX_SIDE = r'''
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 1, 2, 4, 8, 32
MS_BIND, MS_REC, MS_PRIVATE, MS_RELATIME = 4096, 16384, 1 << 18, 1 << 21
NEWUSER = 0x10000000
libc = ctypes.CDLL(None, use_errno=True)
libc.mount.argtypes = (ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p)
STATUS = -1


def fail(message):
    os.write(STATUS, ("error " + message + "\n").encode())
    os._exit(125)


def check(result, what):
    if result != 0:
        fail("%s: %s" % (what, os.strerror(ctypes.get_errno())))


def mount(source, target, fstype, flags, data=None):
    enc = lambda s: s.encode() if s is not None else None
    check(libc.mount(enc(source), enc(target), enc(fstype), flags, enc(data)), "mount %s" % target)


def remount_readonly(target):
    """Every mount at or under target becomes read-only, nosuid and nodev (keeping the flags it has)."""
    with open("/proc/self/mountinfo") as handle:
        points = [line.split()[4].encode().decode("unicode_escape") for line in handle]
    for point in points:
        if point == target or point.startswith(target + "/"):
            current = os.statvfs(point).f_flag
            flags = current & (MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC | 1024 | 2048)
            flags |= MS_RELATIME if current & 4096 else 0
            mount(None, point, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | flags)


def build_root(cfg, root):
    """A fresh tmpfs as /, read-only binds of the system directories, private /tmp /var/tmp /dev/shm, its /proc."""
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "size=%dm,nr_inodes=16384,mode=755" % cfg["tmpfs_mb"])
    for path in cfg["binds"]:
        os.makedirs(root + path, exist_ok=True)
        mount(path, root + path, None, MS_BIND | MS_REC)
        remount_readonly(root + path)
    for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        if os.path.islink("/" + name):
            os.symlink(os.readlink("/" + name), root + "/" + name)
        elif os.path.isdir("/" + name) and "/" + name not in cfg["binds"]:
            os.makedirs(root + "/" + name)
            mount("/" + name, root + "/" + name, None, MS_BIND | MS_REC)
            remount_readonly(root + "/" + name)
    os.makedirs(root + "/dev")
    for device in ("null", "zero", "full", "random", "urandom"):
        open(root + "/dev/" + device, "w").close()
        mount("/dev/" + device, root + "/dev/" + device, None, MS_BIND)
    for link, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
                         ("stderr", "/proc/self/fd/2")):
        os.symlink(target, root + "/dev/" + link)
    for path in ("/tmp", "/var/tmp", "/dev/shm"):
        os.makedirs(root + path)
        os.chmod(root + path, 0o1777)
    os.makedirs(root + "/proc")
    # Its own /proc; where the kernel refuses one to a user namespace (a masked /proc, as in a default Docker
    # container: "mount_too_revealing"), none at all: the program then sees no process, not even itself.
    if libc.mount(b"proc", (root + "/proc").encode(), b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None) != 0:
        if ctypes.get_errno() not in (errno.EPERM, errno.EACCES) or not cfg["unshare_flags"] & NEWUSER:
            fail("mount %s/proc: %s" % (root, os.strerror(ctypes.get_errno())))
    os.makedirs(root + "/sandbox", mode=0o700)
    write_files(cfg, root + "/sandbox")
    os.chroot(root)
    os.chdir("/sandbox")
    libc.sethostname(b"sandbox", 7)


def write_files(cfg, directory):
    for name, text in cfg["files"].items():
        with open(os.path.join(directory, name), "w", encoding="utf-8") as handle:
            handle.write(text)
        if cfg["uid"] >= 0:
            os.chown(os.path.join(directory, name), cfg["uid"], cfg["uid"])
    if cfg["uid"] >= 0:
        os.chown(directory, cfg["uid"], cfg["uid"])


def exit_code(status):
    return os.waitstatus_to_exitcode(status) & 0xFF if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)


def worker(cfg, channel):
    """Limits, the sandbox uid, the channel on fds 3 and 4, the status, then exec the program."""
    global STATUS
    # Move the status and channel fds above 10 first, so that placing the channel on 3 and 4 overwrites neither.
    STATUS, *channel = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10) for fd in [STATUS, *channel]]
    null = os.open("/dev/null", os.O_RDWR)
    # stdin and stdout: /dev/null (prints cost nothing and prove nothing); stderr: the verifier's diagnostics.
    for target, fd in zip((0, 1, 3, 4), [null, null, *(channel or [null, null])]):
        os.dup2(fd, target)
    mb = 1024 * 1024
    resource.setrlimit(resource.RLIMIT_CPU, (cfg["cpu"], cfg["cpu"] + 1))
    resource.setrlimit(resource.RLIMIT_AS, (cfg["memory_mb"] * mb, cfg["memory_mb"] * mb))
    resource.setrlimit(resource.RLIMIT_FSIZE, (cfg["file_size_mb"] * mb, cfg["file_size_mb"] * mb))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if cfg["uid"] >= 0:
        try:
            os.setgroups([])
            os.setgid(cfg["uid"])
            os.setuid(cfg["uid"])
        except OSError as exc:
            fail("cannot switch to the sandbox uid %d (%s)" % (cfg["uid"], exc.strerror))
    resource.setrlimit(resource.RLIMIT_NPROC, (cfg["nproc"], cfg["nproc"]))
    check(libc.prctl(38, 1, 0, 0, 0), "no_new_privs")
    check(libc.prctl(1, signal.SIGKILL, 0, 0, 0), "pdeathsig")  # cleared by the uid switch; dies with its parent
    os.write(STATUS, b"isolated\n" if cfg["isolate"] else b"unisolated\n")
    os.closerange(5, STATUS)
    os.closerange(STATUS + 1, 1 << 16)
    resource.setrlimit(resource.RLIMIT_NOFILE, (cfg["open_files"], cfg["open_files"]))
    try:
        os.execve(cfg["argv"][0], cfg["argv"], cfg["env"])
    except OSError as exc:
        os.write(2, ("polarstack-verifier: cannot run %s (%s)\n" % (cfg["argv"][0], exc.strerror)).encode())
        os._exit(127)


def init(cfg, channel):
    """PID 1 of the sandbox: build its root, start the program, reap; when it exits the kernel kills the rest."""
    check(libc.prctl(1, signal.SIGKILL, 0, 0, 0), "pdeathsig")
    libc.prctl(4, 0, 0, 0, 0)  # not dumpable: the program cannot read this process's memory through /proc
    build_root(cfg, "/tmp")
    program = os.fork()
    if program == 0:
        worker(cfg, channel)
    while True:
        pid, status = os.waitpid(-1, 0)
        if pid == program:
            os._exit(exit_code(status))


def unshare_mapped_by_helper(cfg):
    """Root without CAP_SYS_ADMIN: unshare with a user namespace, whose uid and gid maps a helper left in the parent
    namespace writes (a process inside may map only its own uid; one outside holding CAP_SETUID and CAP_SETGID may
    map more): 0 -> the host's root (the namespace's init) and the sandbox uid -> itself (the program). So the
    program runs as the sandbox uid, as on the direct path: never as the host's root, which RLIMIT_NPROC exempts
    (kernel/fork.c copy_process: `real_cred->user != INIT_USER`) and /proc/sys and /proc/sysrq-trigger obey."""
    go_r, go_w = os.pipe()
    done_r, done_w = os.pipe()
    parent = os.getpid()
    helper = os.fork()
    if helper == 0:
        answer, name = b"ok", "uid_map"
        try:
            os.close(go_w)
            os.close(done_r)
            if os.read(go_r, 1) != b"u":  # the parent could not unshare (or died): nothing to map
                os._exit(0)
            for name, outside in (("uid_map", os.geteuid()), ("gid_map", os.getegid())):
                with open("/proc/%d/%s" % (parent, name), "w") as handle:
                    handle.write("0 %d 1\n%d %d 1\n" % (outside, cfg["uid"], cfg["uid"]))
        except OSError as exc:
            answer = ("%s: %s" % (name, exc.strerror)).encode()
        except BaseException as exc:
            answer = repr(exc).encode()
        finally:
            try:
                os.write(done_w, answer)
            finally:
                os._exit(0)
    os.close(go_r)
    os.close(done_w)
    check(libc.unshare(cfg["unshare_flags"]), "unshare")
    os.write(go_w, b"u")
    answer = os.read(done_r, 300)
    os.waitpid(helper, 0)
    os.close(go_w)
    os.close(done_r)
    if answer != b"ok":
        fail("mapping the sandbox uid into the user namespace (%s)" % answer.decode("utf-8", "replace"))


def sandbox_side(cfg, channel, status):
    """The forked child: unshare, then the namespace's init (or, isolation off, the program in its own session);
    it forwards the program's exit code, and SIGTERM makes it kill the init (everything) or the process group."""
    global STATUS
    STATUS = status
    try:
        check(libc.prctl(1, signal.SIGKILL, 0, 0, 0), "pdeathsig")  # dies with the supervisor
        if cfg["isolate"] and cfg["map_by_helper"]:
            unshare_mapped_by_helper(cfg)
        elif cfg["isolate"]:
            check(libc.unshare(cfg["unshare_flags"]), "unshare")
            if cfg["unshare_flags"] & NEWUSER:  # a user: only its own uid and gid (the kernel allows that)
                for name, text in (("setgroups", "deny"), ("uid_map", "%d %d 1" % (os.getuid(), os.getuid())),
                                   ("gid_map", "%d %d 1" % (os.getgid(), os.getgid()))):
                    with open("/proc/self/" + name, "w") as handle:
                        handle.write(text)
        libc.prctl(4, 0, 0, 0, 0)  # not dumpable (after the maps: it makes /proc/self root's)
        child = os.fork()
        if child == 0:
            if cfg["isolate"]:
                init(cfg, channel)
            os.setsid()
            os.chdir(cfg["workdir"])
            worker(cfg, channel)
    except OSError as exc:
        fail("%s (%s)" % (exc.strerror, exc.filename))
    except BaseException as exc:
        fail(repr(exc))
    kill = (lambda *_: os.kill(child, 9)) if cfg["isolate"] else (lambda *_: os.killpg(child, 9))
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, kill)
    _, status = os.waitpid(child, 0)
    try:
        kill()
    except OSError:
        pass
    os._exit(exit_code(status))
'''

_JUDGE_SIDE = r'''
MAX_MESSAGE = 8 << 20  # one answer; HumanEval's and MBPP's are a few bytes
STDLIB = getattr(sys, "stdlib_module_names", ("math", "re", "string", "collections", "itertools", "heapq"))
state = {"calls": 0, "checks": 0}


class Verdict(Exception):
    """Ends the judging: verdict ("failed", "timeout") and a detail."""


class Channel:
    def __init__(self, out_fd, in_fd, deadline):
        self.out_fd, self.in_fd, self.deadline, self.buffer = out_fd, in_fd, deadline, bytearray()
        os.set_blocking(out_fd, False)  # never block past the deadline: select, then read or write what is ready
        os.set_blocking(in_fd, False)

    def wait(self, fd, writing):
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise Verdict("timeout", "the solution did not answer before the deadline")
        select.select([] if writing else [fd], [fd] if writing else [], [], left)

    def send(self, obj):
        data = (json.dumps(obj) + "\n").encode()
        while data:
            try:
                data = data[os.write(self.out_fd, data):]
            except BlockingIOError:
                self.wait(self.out_fd, True)
            except OSError:
                raise Verdict("failed", "the solution's process is gone") from None

    def recv(self):
        while b"\n" not in self.buffer:
            self.wait(self.in_fd, False)
            try:
                chunk = os.read(self.in_fd, 1 << 16)
            except BlockingIOError:
                continue
            if not chunk:
                raise Verdict("failed", "the solution's process ended or closed its channel before answering")
            self.buffer.extend(chunk)
            if len(self.buffer) > MAX_MESSAGE:
                raise Verdict("failed", "the solution sent an oversized answer")
        line, _, rest = bytes(self.buffer).partition(b"\n")
        self.buffer[:] = rest
        message = json.loads(line)
        if type(message) is not dict:
            raise Verdict("failed", "the solution sent a malformed answer")
        return message


class CandidateRaised(RuntimeError):
    pass


class Proxy:
    """Stands for a function of the solution: the call runs in the sandbox, the answer comes back as plain data."""

    def __init__(self, channel, name):
        self.channel, self.name = channel, name

    def __call__(self, *args, **kwargs):
        self.channel.send({"call": self.name, "args": enc(list(args)), "kwargs": enc(dict(kwargs))})
        answer = self.channel.recv()
        state["calls"] += 1
        if set(answer) == {"value"}:
            return dec(answer["value"])
        if set(answer) == {"raised", "message"} and type(answer["raised"]) is str:
            kind = getattr(builtins, answer["raised"], None)
            if isinstance(kind, type) and issubclass(kind, Exception) and not issubclass(kind, Warning):
                raise kind(str(answer["message"]))
            raise CandidateRaised(str(answer["message"]))
        raise Verdict("failed", "the solution sent a malformed answer")


def _category(x):
    t = type(x)
    if t is bool:
        return "bool"
    if t in (int, float, complex):
        return "number"
    for kind in (str, bytes, list, tuple, dict, type(None)):
        if isinstance(x, kind):
            return kind.__name__
    if isinstance(x, (set, frozenset)):
        return "set"
    return "other"


def strict_eq(a, b):
    """== with types: bool equals only bool, numbers compare by value, containers by kind and element."""
    kind = _category(a)
    if kind != _category(b):
        return False
    if kind in ("list", "tuple"):
        return len(a) == len(b) and all(strict_eq(x, y) for x, y in zip(a, b))
    if kind == "dict":
        return a.keys() == b.keys() and all(strict_eq(a[k], b[k]) for k in a)
    return bool(a == b)


def checked(value, where):
    if not value:
        raise AssertionError("assert at %s failed" % where)
    state["checks"] += 1


class Strict(ast.NodeTransformer):
    """assert T, M  ->  __ps_checked(T, where), and `a == b` in T -> __ps_eq(a, b); immune to python -O."""

    def visit_Assert(self, node):
        test = node.test
        if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq):
            test = ast.Call(ast.Name("__ps_eq", ast.Load()), [test.left, test.comparators[0]], [])
        where = ast.Constant("line %d" % node.lineno)
        call = ast.Call(ast.Name("__ps_checked", ast.Load()), [test, where], [])
        return ast.copy_location(ast.Expr(call), node)


def load(channel, source, name, namespace, prelude=None):
    """Compile test code with strict asserts; bind its free names: stdlib modules, else the solution's functions.
    `prelude` (HumanEval's prompt: helpers such as `poly`) runs first when the tests use a name it may define."""
    tree = ast.fix_missing_locations(Strict().visit(ast.parse(source, name)))
    stored = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load)}
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            stored.add(node.name)
        elif isinstance(node, ast.arg):
            stored.add(node.arg)
        elif isinstance(node, ast.alias):
            stored.add((node.asname or node.name).split(".")[0])
    free = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    free = {n for n in free - stored if n not in namespace and not hasattr(builtins, n)}
    if prelude and free - set(STDLIB):
        saved = dict(namespace)
        exec(compile(prelude, "prompt.py", "exec"), namespace)
        namespace.update(saved)  # the proxies stay: the prompt's stub of the entry point is not the solution
    for free_name in sorted(free):
        if free_name not in namespace:
            # A module the solution imported (MBPP asserts may use it): the judge imports its own copy.
            namespace[free_name] = __import__(free_name) if free_name in STDLIB else Proxy(channel, free_name)
    return compile(tree, name, "exec")


def judge(task, channel):
    """Run the task's tests against the solution behind `channel`; returns normally only if every check held."""
    hello = channel.recv()
    if "load_error" in hello:
        raise Verdict("failed", "the solution does not load: %s" % hello["load_error"])
    if hello != {"ready": True}:
        raise Verdict("failed", "the solution sent a malformed greeting")
    namespace = {"__name__": "__judge__", "__ps_eq": strict_eq, "__ps_checked": checked}
    if task["kind"] == "humaneval":
        namespace[task["entry_point"]] = Proxy(channel, task["entry_point"])  # tests may call it by name
        exec(load(channel, task["test"], "test.py", namespace, prelude=task["prompt"]), namespace)
        namespace["check"](Proxy(channel, task["entry_point"]))
    else:
        exec(compile(task["setup"], "setup.py", "exec"), namespace)
        for number, line in enumerate(task["tests"], 1):
            exec(load(channel, line, "test_%d.py" % number, namespace), namespace)
    if state["calls"] == 0 or state["checks"] == 0:
        raise Verdict("failed", "the tests made no call to the solution or checked nothing")
'''

_SUPERVISOR = r'''
import ast, builtins, ctypes, errno, fcntl, json, os, resource, select, signal, sys, time
''' + _CODEC + _SANDBOX_SIDE + _JUDGE_SIDE + r'''

def read_exactly(count):
    data = b""
    while len(data) < count:
        chunk = os.read(0, count - len(data))
        if not chunk:
            raise SystemExit("polarstack-verifier: truncated configuration")
        data += chunk
    return data


def wait_exit(pid, deadline):
    """The exit code of child `pid` if it ends before `deadline`, else None."""
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return exit_code(status)
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.005)


def read_status(fd, deadline):
    data = b""
    while not data.endswith(b"\n") and time.monotonic() < deadline:
        if select.select([fd], [], [], max(0.0, deadline - time.monotonic()))[0]:
            chunk = os.read(fd, 4096)
            if not chunk:
                break
            data += chunk
    return data.decode("utf-8", "replace").strip()


def main():
    started = time.monotonic()
    libc_ = ctypes.CDLL(None)
    libc_.prctl(1, signal.SIGKILL, 0, 0, 0)  # dies with the verifier thread that started it
    sandbox = json.loads(read_exactly(int(read_exactly(12))))  # the candidate's files and the limits only
    deadline = started + sandbox["timeout"]
    req_r, req_w = os.pipe()
    resp_r, resp_w = os.pipe()
    status_r, status_w = os.pipe()
    child = os.fork()
    if child == 0:
        for fd in (req_w, resp_r, status_r, sandbox["report"]):
            os.close(fd)
        os.dup2(os.open("/dev/null", os.O_RDONLY), 0)  # the configuration file (tests, secret) stays up here
        sandbox_side(sandbox, [req_r, resp_w] if sandbox["judge"] else [], status_w)
    for fd in (req_r, resp_w, status_w):
        os.close(fd)
    # The answers it decodes come from the solution: bound this process's memory too (2 GiB of address space).
    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))
    rest = json.loads(read_exactly(os.fstat(0).st_size - os.lseek(0, 0, os.SEEK_CUR)))  # tests and the secret
    report = {"secret": rest.pop("secret"), "status": read_status(status_r, deadline)}
    returncode = None
    if report["status"] in ("isolated", "unisolated"):
        if sandbox["judge"]:
            try:
                judge(rest, Channel(req_w, resp_r, deadline))
                report["verdict"], report["detail"] = "passed", ""
            except Verdict as verdict:
                report["verdict"], report["detail"] = verdict.args
            except BaseException as exc:
                try:
                    report["verdict"], report["detail"] = "failed", ("%s: %s" % (type(exc).__name__, exc))[:400]
                except BaseException:
                    report["verdict"], report["detail"] = "failed", type(exc).__name__
        else:
            returncode = wait_exit(child, deadline)
            report["verdict"] = "timeout" if returncode is None else "exited"
    os.close(req_w)  # the program reads end-of-file and ends; its namespace goes with it
    for signum in (None, signal.SIGTERM, signal.SIGKILL) if returncode is None else ():
        if signum is not None:
            try:
                os.kill(child, signum)
            except OSError:
                pass
        grace = 2.0 if signum is not None else 0.0 if report.get("verdict") == "timeout" else 0.5
        code = wait_exit(child, time.monotonic() + grace)
        if code is not None:
            if not sandbox["judge"]:
                returncode = code
            break
    report.update(state, returncode=returncode)
    os.write(sandbox["report"], (json.dumps(report) + "\n").encode())


main()
'''


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


def _maps_sandbox_uids() -> bool:
    """Whether this process's user namespace has the uids and gids VERIFIER_UID_BASE.. (one per slot): not when it
    maps root alone, as `unshare --user --map-root-user` does. True where the maps cannot be read."""
    for name in ("uid_map", "gid_map"):
        try:
            numbers = [int(n) for n in Path("/proc/self", name).read_text().split()]
        except (OSError, ValueError):
            return True
        extents = [numbers[i:i + 3] for i in range(0, len(numbers) - 2, 3)]
        if not any(first <= VERIFIER_UID_BASE and VERIFIER_UID_BASE + SLOTS <= first + count
                   for first, _, count in extents):
            return False
    return True


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
        if text[text.rindex(")") + 2:].split()[0] != "Z":
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
        subprocess.run([_system_python(), "-I", "-S", "-c", "import os\ntry:\n    os.kill(-1, 9)\nexcept OSError:\n    pass"],
                       user=uid, group=uid, extra_groups=[], env={}, stdin=subprocess.DEVNULL,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False, timeout=10)
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
    raise RuntimeError("no Python interpreter the sandbox uid can execute; set POLARSTACK_VERIFIER_PYTHON to one, "
                       "for example /usr/bin/python3")


def _binds(python: str) -> list[str]:
    """Read-only binds of the sandbox's root: /usr, /etc and the interpreter's installation prefix."""
    binds = ["/usr", "/etc"]
    prefix = str(Path(os.path.realpath(python)).parent.parent)
    if prefix != "/" and not any(prefix == b or prefix.startswith(b + "/") for b in binds):
        binds.append(prefix)
    return binds


# --- running: one supervisor per run, every wait bounded by the deadline ---------------------


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


def _supervise(files: dict[str, str], argv_tail: list[str], limits: Limits,
               task: dict[str, Any] | None) -> tuple[dict[str, Any], str, float]:
    """Run one supervisor (sandbox + judge when `task` is given); every wait is bounded. Returns its report (empty
    when it gave none carrying this run's secret), the tail of the program's and supervisor's stderr, seconds."""
    isolate = isolation_mode(limits.isolation) == "namespaces"
    started = time.monotonic()
    secret = secrets.token_hex(16)
    flags = _unshare_flags()
    # Root without CAP_SYS_ADMIN: a user namespace into which a helper maps the sandbox uid (needs CAP_SETUID and
    # CAP_SETGID; without them the program would run as the host's root, which RLIMIT_NPROC does not bind).
    by_helper = bool(isolate and flags & _NEWUSER and os.geteuid() == 0)
    if by_helper and not _root_with(_CAP_SETUID, _CAP_SETGID):
        raise IsolationUnavailable(
            f"the verifier's sandbox cannot be set up here (root without CAP_SYS_ADMIN needs CAP_SETUID and CAP_SETGID "
            f"to run the program as a sandbox uid); grant them or opt out of isolation with {ISOLATION_ENV}=none "
            f"(see docs/tasks.md)")
    # Root switches the program to a sandbox uid when it can: isolated, always (directly or through the helper's
    # map); with isolation off, when it holds the capabilities to chown, setgid and setuid.
    if isolate:
        wanted = by_helper or not flags & _NEWUSER
        if wanted and not _maps_sandbox_uids():
            raise IsolationUnavailable(
                f"the verifier's sandbox cannot be set up here (root in a user namespace that does not map the sandbox "
                f"uids {VERIFIER_UID_BASE}-{VERIFIER_UID_BASE + SLOTS - 1}); map them into it or opt out of isolation "
                f"with {ISOLATION_ENV}=none (see docs/tasks.md)")
    else:
        wanted = _root_with(_CAP_SETUID, _CAP_SETGID, _CAP_CHOWN) and _maps_sandbox_uids()
    with _sandbox_uid(wanted) as uid:
        python = _system_python()
        workdir = None if isolate else tempfile.mkdtemp(prefix="polarstack-verify-")
        if workdir:
            for name, text in files.items():
                Path(workdir, name).write_text(text, encoding="utf-8")
            if uid >= 0:
                for path in (workdir, *(Path(workdir, name) for name in files)):
                    os.chown(path, uid, uid)
        report_r, report_w = os.pipe()
        sandbox = {"isolate": isolate, "unshare_flags": flags, "map_by_helper": by_helper, "binds": _binds(python),
                   "files": files, "uid": uid, "workdir": workdir, "tmpfs_mb": 256, "cpu": limits.cpu_seconds,
                   "memory_mb": limits.memory_mb, "file_size_mb": limits.file_size_mb, "nproc": limits.nproc,
                   "open_files": limits.open_files, "argv": [python, "-I", *argv_tail], "judge": task is not None,
                   "timeout": limits.timeout, "report": report_w,
                   "env": {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": workdir or "/sandbox",
                           "PYTHONDONTWRITEBYTECODE": "1"}}
        head = json.dumps(sandbox).encode()
        stderr = tempfile.TemporaryFile()
        try:
            with tempfile.TemporaryFile() as stdin:
                stdin.write(b"%012d" % len(head) + head + json.dumps(dict(task or {}, secret=secret)).encode())
                stdin.seek(0)
                process = subprocess.Popen([sys.executable, "-I", "-S", "-c", _SUPERVISOR], stdin=stdin,
                                           stdout=stderr, stderr=stderr, env={}, pass_fds=(report_w,),
                                           start_new_session=True)
        finally:
            os.close(report_w)
        try:
            # The report pipe reaches end-of-file when the supervisor exits; wait for that, never past the backstop.
            data, ended = _read_until_eof(report_r, time.monotonic() + limits.timeout + 3 * _GRACE)
            if not ended:  # backstop: its own deadline did not hold; its sandbox dies with it (pdeathsig)
                process.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=_GRACE)
            report = _parse_report(data, secret)
        finally:
            os.close(report_r)
            if workdir:
                if uid >= 0:
                    _kill_uid(uid)
                shutil.rmtree(workdir, ignore_errors=True)
        tail = _tail(stderr)
        stderr.close()
    status = str(report.get("status", ""))
    if status.startswith("error "):
        if isolate:
            raise IsolationUnavailable(
                f"the verifier's sandbox cannot be set up here ({status[6:]}); run as root with CAP_SYS_ADMIN or where "
                f"user namespaces are allowed, or opt out of isolation with {ISOLATION_ENV}=none (see docs/tasks.md)")
        raise RuntimeError(f"the sandbox could not start: {status[6:]}")
    return report, tail, time.monotonic() - started


def run_program(program: str, limits: Limits | None = None) -> Run:
    """Run `program` (Python source, as program.py in the sandbox's working directory); its exit code is reported
    for probing the sandbox, never used as a reward."""
    limits = limits or Limits()
    report, tail, seconds = _supervise({"program.py": program}, ["program.py"], limits, None)
    timed_out = report.get("verdict") == "timeout"
    return Run(None if timed_out else report.get("returncode"), timed_out, seconds, tail)


def probe_sandbox(limits: Limits | None = None) -> None:
    """Raise IsolationUnavailable (or ValueError for an unknown mode) unless a program can run in the sandbox."""
    limits = limits or Limits()
    run = run_program("pass\n", Limits(timeout=max(limits.timeout, 5.0), isolation=limits.isolation))
    if run.returncode != 0:
        raise RuntimeError(f"a program that does nothing failed in the sandbox (exit {run.returncode}): "
                           f"{run.stderr_tail[-200:]}")


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
    return {"kind": "humaneval", "prompt": problem["prompt"], "test": problem["test"],
            "entry_point": problem["entry_point"]}


def verify(problem: dict[str, Any], completion: str, limits: Limits | None = None) -> Outcome:
    """Run the problem's tests against the completion; raises IsolationUnavailable (fail closed)."""
    limits = limits or Limits()
    report, tail, seconds = _supervise({"solution.py": solution_source(problem, completion)}, ["-c", _RUNNER],
                                       limits, _judge_task(problem))
    verdict, detail = report.get("verdict"), str(report.get("detail", ""))
    calls, checks = int(report.get("calls") or 0), int(report.get("checks") or 0)
    if verdict == "timeout" or (not report and seconds >= limits.timeout):
        return Outcome(False, "timeout", seconds, detail or "deadline passed", tail, calls, checks)
    if not report:
        return Outcome(False, "error", seconds, "the supervisor gave no valid report", tail)
    wanted = "isolated" if isolation_mode(limits.isolation) == "namespaces" else "unisolated"
    if verdict == "passed" and report.get("status") == wanted and calls > 0 and checks > 0:
        return Outcome(True, "passed", seconds, "", tail, calls, checks)
    return Outcome(False, "failed", seconds, detail or f"sandbox status {report.get('status')!r}", tail, calls, checks)


def _parse_report(data: bytes, secret: str) -> dict[str, Any]:
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


def verify_many(items: Iterable[tuple[dict[str, Any], str]], limits: Limits | None = None,
                workers: int | None = None, on_outcome: Callable[[Outcome], None] | None = None) -> list[Outcome]:
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
    """slime `--custom-rm-path polarstack.verifier.reward_func`: 1.0 when the sample's code passes its tests.

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
    parser.add_argument("--isolation", choices=ISOLATION_MODES, default=None,
                        help=f"namespaces (default) or none: opt out of the sandbox's namespaces (also {ISOLATION_ENV})")
    args = parser.parse_args(argv)
    try:
        problem = json.loads(Path(args.problem).read_text(encoding="utf-8"))
        completion = Path(args.solution).read_text(encoding="utf-8")
    except (OSError, ValueError) as exc:
        print(f"FAILED {args.name} (cannot read the task files: {exc})")
        return 1
    try:
        outcome = verify(problem, completion, Limits(timeout=args.timeout, isolation=args.isolation))
    except (IsolationUnavailable, RuntimeError, ValueError) as exc:
        print(f"FAILED {args.name} (not verified)")
        print(f"polarstack-verifier: {exc}", file=sys.stderr)
        return 8
    if outcome.passed:
        print(f"PASSED {args.name}")
        return 0
    print(f"FAILED {args.name} ({outcome.reason}: {outcome.detail[:200]})")
    return 1


if __name__ == "__main__":
    sys.exit(main())
