"""The supervisor program (one trusted process per run, outside the sandbox), assembled from the codec, the
sandbox side and the judge side: it forks the sandbox, judges, tears the sandbox down and reports."""

from __future__ import annotations

from polarstack.reward.verifier.candidate import _CODEC
from polarstack.reward.verifier.judge_side import _JUDGE_SIDE
from polarstack.reward.verifier.sandbox_side import _SANDBOX_SIDE
from polarstack.reward.verifier.seccomp import _SECCOMP
from polarstack.reward.verifier.watchdog import _WATCHDOG

_SUPERVISOR = (
    r"""
import ast, builtins, ctypes, errno, fcntl, json, os, random, resource, select, signal, sys, threading, time
"""
    + _CODEC
    + _SANDBOX_SIDE
    + _SECCOMP
    + _JUDGE_SIDE
    + _WATCHDOG
    + r'''

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
    if sandbox["watchdog"]:  # no cgroup bounds the sandbox: this thread bounds its total (watchdog.py)
        # A pidfd, so that neither the look nor the kill can reach another process once the child is reaped.
        try:
            pidfd = os.pidfd_open(child)
            stop = lambda: signal.pidfd_send_signal(pidfd, signal.SIGTERM)  # the sandbox side kills its init
        except OSError:  # Linux before 5.3: by pid, looked up before each kill
            pidfd, stop = None, lambda: os.kill(child, signal.SIGTERM)
        threading.Thread(target=watchdog, args=(child, pidfd, sandbox, stop), daemon=True).start()
    # The answers it decodes come from the solution: bound this process's memory too (2 GiB of address space).
    # Under a lower hard limit (a verifier run inside a cap of its own), that limit: setrlimit cannot raise it.
    hard = resource.getrlimit(resource.RLIMIT_AS)[1]
    cap = 2 << 30 if hard == resource.RLIM_INFINITY else min(2 << 30, hard)
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
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
    if state.get("over_budget") and report.get("verdict") != "timeout":
        report["verdict"], report["detail"] = "failed", state["over_budget"]
    os.write(sandbox["report"], (json.dumps(report) + "\n").encode())


main()
'''
)
