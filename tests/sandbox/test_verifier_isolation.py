"""Pins issue 12, point 4: what a candidate program can reach from inside the verifier's sandbox. No network (a
listener the test opens on 127.0.0.1 stays unreachable), a private /tmp, /var/tmp and /dev/shm (nothing written
there persists or shows on the host, nothing of the host's shows inside), none of the host's files beyond the
system directories (the checkout with its task data, a HOME with an .ssh key), and, run by an unprivileged user
(the case of Polar's Apptainer sessions), not the parent's environment either. When the namespaces cannot be set
up the verifier refuses (one sentence; reward 0 with the reason; exit code 8 on its command line) unless the user
opts out with POLARSTACK_VERIFIER_ISOLATION=none."""

import asyncio
import json
import os
import shutil
import socket
import subprocess
import tempfile
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest
from creation_probe import NO_CREATION

import bundled_verifier
from polarstack.cli.main import main as cli_main
from polarstack.errors import ExitCode
from polarstack.reward import tasks, verifier
from polarstack.reward.verifier.limits import ISOLATION_ENV, IsolationUnavailable, Limits

pytestmark = pytest.mark.sandbox
VERIFIER = bundled_verifier.VERIFIER  # as tasks writes it, under pytest's tmp_path_factory
REPO = Path(__file__).resolve().parents[2]
SYSTEM_PYTHON = "/usr/bin/python3"


@pytest.fixture(scope="module")
def humaneval():
    return {p["task_id"]: p for p in tasks.load_humaneval()}


@pytest.fixture
def open_dir():
    """A temporary directory any uid can traverse (as a user's home or a checkout is), removed afterwards."""
    folder = Path(tempfile.mkdtemp(prefix="polarstack-isolation-"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def test_no_network_even_to_loopback():
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.settimeout(0.5)
    port = listener.getsockname()[1]
    program = (
        f"import socket, sys\ntry:\n    socket.create_connection(('127.0.0.1', {port}), timeout=2)\n"
        "except OSError as exc:\n    print('refused:', exc, file=sys.stderr)\n    sys.exit(0)\nsys.exit(3)\n"
    )
    try:
        run = verifier.run_program(program, Limits(timeout=10))
        with pytest.raises(socket.timeout):
            listener.accept()
    finally:
        listener.close()
    assert run.returncode == 0, run


def test_private_tmp_and_nothing_of_the_hosts_files(open_dir):
    token = uuid.uuid4().hex
    host_file = open_dir / "visible-to-all.txt"
    host_file.write_text("host data")
    host_file.chmod(0o644)
    written = [Path(d) / f"polarstack-{token}" for d in ("/tmp", "/var/tmp", "/dev/shm")]
    program = (
        "import os, sys\n"
        f"for path in {[str(p) for p in written]!r}:\n"
        "    open(path, 'w').write('x')\n"  # must succeed: each is writable inside
        f"for hidden in ({str(host_file)!r}, {str(REPO)!r}, '/root', '/home', '/run', '/sys'):\n"
        "    if os.path.exists(hidden):\n        sys.exit('visible: ' + hidden)\n"
        "try:\n    os.mkdir('/usr/polarstack-probe')\nexcept OSError:\n    pass\n"
        "else:\n    sys.exit('/usr is writable')\n"
        # a user namespace would give back the capabilities to leave the chroot (the kernel refuses it)
        "import ctypes\nif ctypes.CDLL(None).unshare(0x10000000) == 0:\n    sys.exit('unshared a user namespace')\n"
    )
    run = verifier.run_program(program, Limits(timeout=10))
    assert run.returncode == 0, run
    assert [p for p in written if p.exists()] == []
    assert not Path("/usr/polarstack-probe").exists()


def test_home_ssh_key_is_not_visible(open_dir, monkeypatch):
    home = open_dir / "home"
    (home / ".ssh").mkdir(parents=True)
    key = home / ".ssh" / "id_ed25519"
    key.write_text("-----BEGIN OPENSSH PRIVATE KEY----- fake\n")
    for path in (home, home / ".ssh"):
        path.chmod(0o755)
    key.chmod(0o644)  # readable by any uid: only the sandbox's own root can hide it
    monkeypatch.setenv("HOME", str(home))
    program = (
        f"import sys\ntry:\n    open({str(key)!r}).read()\nexcept FileNotFoundError:\n    sys.exit(0)\n"
        "except OSError as exc:\n    sys.exit('not hidden, only refused: %s' % exc)\nsys.exit('read the key')\n"
    )
    run = verifier.run_program(program, Limits(timeout=10))
    assert run.returncode == 0, run


# --- as an unprivileged user: user namespaces instead of a sandbox uid ------------------------------------


def _unprivileged_userns() -> str | None:
    """Why the unprivileged-user case cannot run here, or None when it can."""
    if os.geteuid() != 0:
        return "needs root to start the verifier as the unprivileged user 65534"
    if not os.access(SYSTEM_PYTHON, os.X_OK):
        return f"needs {SYSTEM_PYTHON}"
    probe = subprocess.run(
        [
            SYSTEM_PYTHON,
            "-I",
            "-S",
            "-c",
            "import ctypes, sys\nsys.exit(ctypes.CDLL(None, use_errno=True).unshare(0x10000000 | 0x40000000))",
        ],
        user=65534,
        group=65534,
        extra_groups=[],
        env={},
        capture_output=True,
        check=False,
    )
    return None if probe.returncode == 0 else "unprivileged user namespaces are not allowed on this kernel"


# As root: a private mount namespace whose /proc has a file masked (as Docker masks /proc/kcore and others), then
# the unprivileged user. The kernel refuses a new /proc to that user's namespace ("mount_too_revealing").
MASKED_PROC = [
    "unshare",
    "--mount",
    "--propagation",
    "private",
    "sh",
    "-c",
    'mount --bind /dev/null /proc/timer_list && exec setpriv --reuid 65534 --regid 65534 --clear-groups "$@"',
    "sh",
]


@pytest.mark.parametrize("proc", ["own /proc", "masked /proc"])
def test_unprivileged_user_cannot_read_the_parents_environment_or_ssh_key(open_dir, humaneval, proc):
    reason = _unprivileged_userns()
    if not reason and proc == "masked /proc" and not all(shutil.which(t) for t in ("unshare", "setpriv", "mount")):
        reason = "needs util-linux's unshare, setpriv and mount to mask /proc"
    if reason:
        pytest.skip(reason)
    token = uuid.uuid4().hex
    shutil.copy(VERIFIER, open_dir / "verifier.py")
    home = open_dir / "home"
    (home / ".ssh").mkdir(parents=True)
    key = home / ".ssh" / "id_ed25519"
    key.write_text("-----BEGIN OPENSSH PRIVATE KEY----- fake\n")
    key.chmod(0o600)
    for path in (home, home / ".ssh", key):
        os.chown(path, 65534, 65534)
    probe = (
        f"import os, sys\nfound = []\n"
        "for pid in os.listdir('/proc'):\n    for name in ('environ', 'cmdline'):\n        try:\n"
        f"            if {token!r}.encode() in open('/proc/%s/%s' % (pid, name), 'rb').read():\n"
        "                found.append(pid)\n        except OSError:\n            pass\n"
        "if found:\n    sys.exit('read the parent environment of %s' % found)\n"
        f"try:\n    open({str(key)!r}).read()\nexcept OSError:\n    pass\nelse:\n    sys.exit('read the key')\n"
        f"if os.path.exists({str(open_dir)!r}):\n    sys.exit('sees the host file system')\n"
    ) + NO_CREATION  # issue 32: nor a process, a thread or a namespace, in this shape too
    problem = humaneval["HumanEval/0"]
    (open_dir / "problem.json").write_text(json.dumps(dict(problem, kind="humaneval")))
    (open_dir / "problem.json").chmod(0o644)
    driver = (
        "import json, sys\nsys.path.insert(0, '.')\nimport verifier\n"
        "run = verifier.run_program(sys.argv[1], verifier.Limits(timeout=10))\n"
        "problem = json.load(open('problem.json'))\n"
        "good = verifier.verify(problem, problem['canonical_solution'])\n"
        "bad = verifier.verify(problem, '    return None\\nimport sys\\nsys.exit(0)\\n')\n"
        "print(json.dumps([run.returncode, run.stderr_tail, good.passed, getattr(good, 'detail', ''), bad.passed]))\n"
    )
    command = [SYSTEM_PYTHON, "-I", "-c", driver, probe]
    as_nobody = {"user": 65534, "group": 65534, "extra_groups": []} if proc == "own /proc" else {}
    proc_run = subprocess.run(
        command if as_nobody else MASKED_PROC + command,
        cwd=open_dir,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin:/usr/sbin:/sbin", "HOME": str(home), "PARENT_SECRET": token},
        **as_nobody,
    )
    assert proc_run.returncode == 0, proc_run.stderr
    returncode, tail, good, detail, bad = json.loads(proc_run.stdout)
    assert returncode == 0, tail
    assert good is True, detail
    assert bad is False


# --- fail closed, and the explicit opt-out ----------------------------------------------------------------


@pytest.fixture
def namespaces_refused(monkeypatch):
    """Simulates a kernel or container that refuses the namespaces: unshare(2) gets flags it rejects (EINVAL)."""
    monkeypatch.delenv(ISOLATION_ENV, raising=False)
    monkeypatch.setattr(verifier, "_unshare_flags", lambda: -1)


def test_no_isolation_means_no_verification(namespaces_refused, humaneval, tmp_path, capsys):
    problem = dict(humaneval["HumanEval/0"], kind="humaneval")
    with pytest.raises(IsolationUnavailable, match="run it as root with CAP_SYS_ADMIN") as refused:
        verifier.verify(problem, problem["canonical_solution"])
    # The verifier's own sentence names the fix, not the opt-out: Polar's test_command does not carry this
    # process's environment (issue 32, point 4), so an opt-out named there could not reach it.
    assert ISOLATION_ENV not in str(refused.value)
    sample = SimpleNamespace(response=problem["canonical_solution"], metadata={"problem": problem})
    assert asyncio.run(verifier.reward_func(SimpleNamespace(), sample)) == 0.0
    assert "sandbox cannot be set up" in sample.metadata["verifier_error"]
    (tmp_path / "problem.json").write_text(json.dumps(problem))
    (tmp_path / "solution.py").write_text(problem["prompt"] + problem["canonical_solution"])
    assert (
        verifier.main(
            ["--problem", str(tmp_path / "problem.json"), "--solution", str(tmp_path / "solution.py"), "--name", "t"]
        )
        == 8
    )
    captured = capsys.readouterr()
    assert "PASSED" not in captured.out and len(captured.err.strip().splitlines()) == 1
    assert ISOLATION_ENV not in captured.err and "CAP_SYS_ADMIN" in captured.err, captured.err
    fixture = REPO / "tests" / "fixtures" / "mbpp_sample.jsonl"
    assert cli_main(["verify", "--task", "mbpp", "--source", str(fixture)]) == ExitCode.ENVIRONMENT
    err = capsys.readouterr().err
    assert ISOLATION_ENV in err and len(err.strip().splitlines()) == 1  # `polarstack verify`: it reaches


def test_explicit_opt_out_still_judges_by_evidence(namespaces_refused, monkeypatch, humaneval):
    monkeypatch.setenv(ISOLATION_ENV, "none")
    problem = humaneval["HumanEval/0"]
    assert verifier.verify(problem, problem["canonical_solution"]).passed
    assert not verifier.verify(problem, "    return None\nimport os\nos._exit(0)\n").passed
    assert verifier.run_program("import sys\nsys.exit(0)\n").returncode == 0
    with pytest.raises(ValueError, match="unknown verifier isolation"):
        verifier.verify(problem, problem["canonical_solution"], Limits(isolation="off"))
