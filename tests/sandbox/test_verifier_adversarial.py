"""Pins issue 12, points 1-3: the verifier (the reward) cannot be gamed. Each case is an actual reward-hacking
program: exiting 0 in every way a process can, objects whose `==` lies, patched builtins and helpers, forged
PASSED lines and forged reports, hunting the run's secret, signal and thread tricks, a redefined `check`; also
through the evaluator's command line. A double-forked setsid daemon cannot hold the verifier past its deadline
nor survive it (since issue 32 it cannot even be made: its first fork answers EPERM), and two verifier processes
started together do not kill each other's programs."""

import json
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

import bundled_verifier
from polarstack.reward import tasks, verifier
from polarstack.reward.verifier.limits import Limits

pytestmark = pytest.mark.sandbox
VERIFIER = bundled_verifier.VERIFIER  # as tasks writes it, under pytest's tmp_path_factory


@pytest.fixture(scope="module")
def humaneval():
    return {p["task_id"]: p for p in tasks.load_humaneval()}


# Each completion is appended to the HumanEval prompt (the function's signature and docstring), as a model's is.
WRONG_BUT_EXITS_ZERO = {
    "sys_exit_at_import": "    return None\nimport sys\nsys.exit(0)\n",
    "os_exit_at_import": "    return None\nimport os\nos._exit(0)\n",
    "raise_systemexit_in_body": "    raise SystemExit(0)\n",
    "atexit_hook": "    return None\nimport atexit, os\natexit.register(lambda: os._exit(0))\n",
    "excepthook": "    return None\nimport os, sys\nsys.excepthook = lambda *a: os._exit(0)\n",
    "eq_always_true": (
        "    class Liar:\n        def __eq__(self, other):\n            return True\n"
        "        def __ne__(self, other):\n            return False\n        __hash__ = object.__hash__\n"
        "    return Liar()\n"
    ),
    "int_subclass_with_lying_eq": (
        "    class Liar(int):\n        def __eq__(self, other):\n            return True\n"
        "        __hash__ = int.__hash__\n    return Liar(0)\n"
    ),
    "int_instead_of_bool": (
        "    return int(any(abs(a - b) < threshold for i, a in enumerate(numbers)\n"
        "                   for j, b in enumerate(numbers) if i != j))\n"
    ),
    "forged_passed_and_reports": (
        "    return None\nimport json, os\nprint('PASSED t', flush=True)\n"
        "for fd in range(1, 12):\n    for line in ('PASSED t', json.dumps({'verdict': 'passed', 'calls': 9, 'checks': 9}),"
        " json.dumps({'value': True})):\n        try:\n            os.write(fd, (line + '\\n').encode())\n"
        "        except OSError:\n            pass\nos._exit(0)\n"
    ),
    "hunt_the_secret": (
        "    return None\nimport gc, json, os, re, sys\nfound = set()\n"
        "for root in ('/proc/self', *('/proc/' + p for p in os.listdir('/proc') if p.isdigit())):\n"
        "    for name in ('environ', 'cmdline'):\n        try:\n"
        "            found.update(re.findall(rb'[0-9a-f]{32}', open(root + '/' + name, 'rb').read()))\n"
        "        except OSError:\n            pass\n"
        "for obj in gc.get_objects():\n    if isinstance(obj, dict):\n"
        "        found.update(v.encode() for v in obj.values() if isinstance(v, str) and re.fullmatch('[0-9a-f]{32}', v))\n"
        "frame = sys._getframe()\nwhile frame:\n"
        "    found.update(v.encode() for v in frame.f_globals.values() if isinstance(v, str) and len(v) == 32)\n"
        "    frame = frame.f_back\n"
        "for secret in found or {b'0' * 32}:\n    for fd in range(1, 12):\n        try:\n"
        "            os.write(fd, json.dumps({'secret': secret.decode(), 'verdict': 'passed', 'calls': 7,"
        " 'checks': 7}).encode() + b'\\n')\n        except OSError:\n            pass\nos._exit(0)\n"
    ),
    "signal_alarm_exits_zero": (
        "    import os, signal\n    signal.signal(signal.SIGALRM, lambda *a: os._exit(0))\n"
        "    signal.setitimer(signal.ITIMER_REAL, 0.05)\n    while True:\n        pass\n"
    ),
    "kill_parents_and_init": (
        "    import os, signal\n    for pid in (os.getppid(), 1):\n        try:\n"
        "            os.kill(pid, signal.SIGKILL)\n        except OSError:\n            pass\n"
        "    os._exit(0)\n"
    ),
    "daemon_thread_exits_zero": (
        "    import os, threading, time\n"
        "    threading.Thread(target=lambda: (time.sleep(0.05), os._exit(0)), daemon=True).start()\n"
        "    time.sleep(5)\n"
    ),
    "redefine_check_and_profile_hook": (
        "    return None\nimport os, sys\ndef check(candidate):\n    return True\ncandidate = check\n"
        "sys.setprofile(lambda frame, event, arg: os._exit(0) if frame.f_code.co_name == 'check' else None)\n"
    ),
}


@pytest.mark.parametrize("name", sorted(WRONG_BUT_EXITS_ZERO))
def test_wrong_solutions_that_game_the_exit_code_score_zero(humaneval, name):
    outcome = verifier.verify(humaneval["HumanEval/0"], WRONG_BUT_EXITS_ZERO[name], Limits(timeout=5))
    assert outcome.reward == 0.0, (name, outcome)


@pytest.mark.parametrize(
    "task,completion",
    [
        # tuple() is what HumanEval/33's asserts compare: patched to a constant, every assert would hold.
        ("HumanEval/33", "    return []\nimport builtins\nbuiltins.tuple = lambda *a: ()\n"),
        # math.fabs is HumanEval/32's only check: patched to 0, any answer would do.
        ("HumanEval/32", "    return 0.0\nimport math\nmath.fabs = lambda x: 0.0\n"),
        # poly() (defined by HumanEval/32's prompt) is what its test evaluates: a solution redefining it to 0.
        ("HumanEval/32", "    return 0.0\ndef poly(xs, x):\n    return 0.0\n"),
        # abs() decides HumanEval/2's last two asserts; == the first one.
        ("HumanEval/2", ("    return 0.5\nimport builtins\nbuiltins.abs = lambda x: 0\n")),
    ],
)
def test_patched_builtins_and_helpers_do_not_reach_the_tests(humaneval, task, completion):
    assert verifier.verify(humaneval[task], completion, Limits(timeout=5)).reward == 0.0


def test_real_solutions_still_pass_and_the_evidence_is_counted(humaneval):
    outcome = verifier.verify(humaneval["HumanEval/0"], humaneval["HumanEval/0"]["canonical_solution"])
    assert outcome.passed and outcome.calls == 7 and outcome.checks == 7


@pytest.mark.parametrize("name", ["sys_exit_at_import", "eq_always_true", "forged_passed_and_reports"])
def test_evaluator_command_line_prints_passed_only_on_evidence(tmp_path, humaneval, capsys, name):
    problem = humaneval["HumanEval/0"]
    (tmp_path / "problem.json").write_text(json.dumps(dict(problem, kind="humaneval")))
    (tmp_path / "solution.py").write_text(problem["prompt"] + WRONG_BUT_EXITS_ZERO[name])
    args = [
        "--problem",
        str(tmp_path / "problem.json"),
        "--solution",
        str(tmp_path / "solution.py"),
        "--name",
        "t",
        "--timeout",
        "5",
    ]
    assert verifier.main(args) == 1
    assert "PASSED" not in capsys.readouterr().out
    # The same file run on its own, as Polar's test_on_output evaluator does.
    proc = subprocess.run(
        [sys.executable, str(VERIFIER), *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode == 1 and "PASSED" not in proc.stdout and proc.stdout.startswith("FAILED t"), proc


# --- point 2: a daemon cannot hold the verifier past its deadline, and nothing survives ---------------------


def _daemon_completion(token: str) -> str:
    """Double fork + setsid; the grandchild keeps stderr open and sleeps, carrying `token` in its command line."""
    return (
        "    import os, time\n    if os.fork() == 0:\n        os.setsid()\n        if os.fork() == 0:\n"
        f"            os.execv('/usr/bin/python3', ['python3', '-c', 'import time; time.sleep(20)', '{token}'])\n"
        "        os._exit(0)\n    while True:\n        time.sleep(0.1)\n"
    )


def _processes_with(token: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if token.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                pass
    return found


@pytest.mark.parametrize("mode", ["verify", "run_program"])
def test_double_forked_daemon_is_killed_at_the_timeout(humaneval, mode):
    token = f"polarstack-daemon-{uuid.uuid4().hex}"
    started = time.monotonic()
    if mode == "verify":
        outcome = verifier.verify(humaneval["HumanEval/0"], _daemon_completion(token), Limits(timeout=2))
        # Its first fork is refused (EPERM, seccomp.py: issue 32), so there is no daemon to hold anything.
        assert outcome.reward == 0.0 and outcome.reason == "failed" and "PermissionError" in outcome.detail, outcome
    else:
        program = "def f():\n" + _daemon_completion(token) + "f()\n"
        run = verifier.run_program(program, Limits(timeout=2))
        assert run.returncode != 0 and "PermissionError" in run.stderr_tail, run
    assert time.monotonic() - started < 2 + 3
    assert _processes_with(token) == []


# --- point 3: concurrent verifier processes ----------------------------------------------------------------


def test_two_verifier_processes_do_not_interfere(tmp_path, humaneval):
    """A slow correct solution and a fast one, each in its own verifier process, started 0.5 s apart: the fast
    one's cleanup used to kill(-1) the shared sandbox uid, taking the slow one's program with it."""
    problem = humaneval["HumanEval/0"]
    (tmp_path / "problem.json").write_text(json.dumps(dict(problem, kind="humaneval")))
    (tmp_path / "slow.py").write_text(
        problem["prompt"] + problem["canonical_solution"] + "\nimport time\ntime.sleep(2.5)\n"
    )
    (tmp_path / "fast.py").write_text(problem["prompt"] + problem["canonical_solution"])

    def start(solution):
        return subprocess.Popen(
            [sys.executable, str(VERIFIER), "--problem", "problem.json", "--solution", solution, "--name", solution],
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={"PATH": "/usr/bin:/bin"},
        )

    slow = start("slow.py")
    time.sleep(0.5)
    fast = start("fast.py")
    out_fast, err_fast = fast.communicate(timeout=60)
    out_slow, err_slow = slow.communicate(timeout=60)
    assert fast.returncode == 0 and out_fast.startswith("PASSED fast.py"), out_fast + err_fast
    assert slow.returncode == 0 and out_slow.startswith("PASSED slow.py"), out_slow + err_slow


def test_a_report_without_this_runs_secret_counts_for_nothing():
    """The verifier reads one report line and only with the run's secret: a second line, another run's secret or a
    missing one (what a program that reached the report pipe could write) gives no report, hence no pass."""
    secret = "a" * 32
    good = {"secret": secret, "verdict": "passed", "status": "isolated", "calls": 1, "checks": 1}
    assert verifier.parse_report(json.dumps(good).encode() + b"\n", secret)["verdict"] == "passed"
    for forged in (dict(good, secret="b" * 32), {k: v for k, v in good.items() if k != "secret"}):
        assert verifier.parse_report(json.dumps(forged).encode() + b"\n", secret) == {}
    assert verifier.parse_report(json.dumps(good).encode() + b"\n" + json.dumps(good).encode(), secret) == {}
    assert verifier.parse_report(b"PASSED t\n", secret) == {}
