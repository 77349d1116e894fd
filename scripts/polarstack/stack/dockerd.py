"""A private Docker engine for this machine (`make dockerd`, `.ci/run`'s docker tier): never the system daemon.

Measured recipe: ../shared/reference/tooling.md, "A real Docker engine and Compose v2 on a CPU machine". The
daemon gets a config file of its own and touches nothing of a system daemon's configuration:
- its data root (images, build cache, volumes) under the download cache (~/.cache/polarstack/docker/data), so later
  runs are warm;
- its exec root, pidfile and socket under a short folder in /tmp (a unix socket path is limited to 108 bytes, and
  HOME, hence the cache path, may be long); the folder is named after the data root, so two caches never share it;
- `iptables: false` and `ip-forward: false` (it changes no host firewall rule), its bridge and every Compose network
  inside 198.18.0.0/15 (the range reserved for network tests; the default 172.17.0.0/16 is a private range this
  machine never routes to), and published ports bound to 127.0.0.1 only (`ip`).
It is stopped by the pid it recorded, and the exec root's network-namespace mount that dockerd leaves behind
(`exec-root/netns/default`) is unmounted before the folder is removed.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from polarstack.errors import ExitCode, StackError
from polarstack.paths import cache_dir

BRIDGE_IP = "198.18.0.1/24"  # docker0 of the private daemon: inside 198.18.0.0/15
ADDRESS_POOL = {"base": "198.18.64.0/18", "size": 24}  # Compose networks: inside 198.18.0.0/15 too
READY_TIMEOUT = 60.0  # measured ready in ~5 s; a loaded machine gets headroom


@dataclass(frozen=True)
class Daemon:
    data_root: Path  # under the cache: kept between runs
    run_root: Path  # short: exec root, pidfile, socket, config, log

    @property
    def socket(self) -> Path:
        return self.run_root / "docker.sock"

    @property
    def host(self) -> str:
        return f"unix://{self.socket}"

    @property
    def exec_root(self) -> Path:
        return self.run_root / "exec"

    @property
    def pidfile(self) -> Path:
        return self.run_root / "dockerd.pid"

    @property
    def config_file(self) -> Path:
        return self.run_root / "daemon.json"

    @property
    def log_file(self) -> Path:
        return self.data_root.parent / "dockerd.log"

    def config(self) -> dict:
        return {
            "data-root": str(self.data_root),
            "exec-root": str(self.exec_root),
            "pidfile": str(self.pidfile),
            "hosts": [self.host],
            "storage-driver": "overlay2",
            "iptables": False,
            "ip-forward": False,
            "ip-masq": False,
            "ip": "127.0.0.1",
            "bip": BRIDGE_IP,
            "default-address-pools": [ADDRESS_POOL],
        }


def daemon(data_root: Path | None = None) -> Daemon:
    """The private daemon of this cache (POLARSTACK_DOCKER_ROOT overrides the data root)."""
    root = data_root or Path(os.environ.get("POLARSTACK_DOCKER_ROOT") or cache_dir() / "docker" / "data")
    digest = hashlib.sha256(str(root.resolve()).encode()).hexdigest()[:10]
    run_root = Path("/tmp") / f"psd-{os.getuid()}-{digest}"  # 24 bytes: the socket path stays far below 108
    return Daemon(root, run_root)


def _pid(d: Daemon) -> int | None:
    try:
        pid = int(d.pidfile.read_text().strip())
    except (OSError, ValueError):
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        return pid
    return pid


def answers(host: str, timeout: float = 10.0) -> bool:
    """Does the engine at `host` (a DOCKER_HOST value) answer `docker info`?"""
    env = {**os.environ, "DOCKER_HOST": host}
    try:
        proc = subprocess.run(
            ["docker", "info", "--format", "{{.ServerVersion}}"], env=env, capture_output=True, timeout=timeout
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return proc.returncode == 0


def start(d: Daemon | None = None, *, progress=lambda s: print(s, file=sys.stderr)) -> Daemon:
    """Start the private dockerd (idempotent: an answering one is kept); ENVIRONMENT in one sentence otherwise."""
    d = d or daemon()
    if shutil.which("dockerd") is None or shutil.which("docker") is None:
        raise StackError(
            "the private Docker engine needs dockerd and the docker CLI; install Debian's docker.io "
            "(`apt-get install -y docker.io`), or point DOCKER_HOST at a running engine.",
            ExitCode.ENVIRONMENT,
        )
    if _pid(d) is not None and answers(d.host):
        progress(f"dockerd: already running (pid {_pid(d)}), DOCKER_HOST={d.host}")
        return d
    d.data_root.mkdir(parents=True, exist_ok=True)
    d.run_root.mkdir(mode=0o700, parents=True, exist_ok=True)
    d.config_file.write_text(json.dumps(d.config(), indent=2) + "\n")
    d.socket.unlink(missing_ok=True)
    log = open(d.log_file, "ab")
    proc = subprocess.Popen(
        ["dockerd", "--config-file", str(d.config_file)],
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # a Ctrl-C of the caller does not reach it; `make dockerd-stop` stops it by pid
    )
    log.close()
    deadline = time.monotonic() + READY_TIMEOUT
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise StackError(
                f"dockerd exited with {proc.returncode} at start; its log is {d.log_file} (last line: "
                f"{_last_line(d.log_file)}).",
                ExitCode.ENVIRONMENT,
            )
        if d.socket.exists() and answers(d.host, timeout=5):
            progress(f"dockerd: started (pid {proc.pid}), DOCKER_HOST={d.host}, data root {d.data_root}")
            return d
        time.sleep(0.5)
    stop(d)
    raise StackError(
        f"dockerd did not answer within {READY_TIMEOUT:.0f} s; its log is {d.log_file} (last line: "
        f"{_last_line(d.log_file)}).",
        ExitCode.ENVIRONMENT,
    )


def _last_line(path: Path) -> str:
    try:
        lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return "no log"
    return lines[-1][-200:] if lines else "empty log"


def _mounts_under(root: Path) -> list[str]:
    try:
        text = Path("/proc/self/mountinfo").read_text()
    except OSError:
        return []
    found = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) > 4 and (fields[4] == str(root) or fields[4].startswith(str(root) + "/")):
            found.append(fields[4])
    return sorted(found, key=len, reverse=True)  # deepest first


def stop(d: Daemon | None = None, *, progress=lambda s: print(s, file=sys.stderr), timeout: float = 30.0) -> bool:
    """Stop the private dockerd by its pid, unmount what it left under its exec root, remove that folder.

    Returns whether a daemon was running. Containers it ran stop with it (dockerd stops them on SIGTERM)."""
    d = d or daemon()
    pid = _pid(d)
    if pid is not None:
        os.kill(pid, 15)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and _pid(d) == pid:
            time.sleep(0.2)
        if _pid(d) == pid:
            os.kill(pid, 9)
            time.sleep(0.5)
        progress(f"dockerd: stopped (pid {pid})")
    for mount in [*_mounts_under(d.exec_root), *_mounts_under(d.data_root)]:
        subprocess.run(["umount", "-l", mount], capture_output=True)
    shutil.rmtree(d.run_root, ignore_errors=True)
    return pid is not None


def data_root_bytes(d: Daemon | None = None) -> int:
    """The data root's disk use (`du -sb`), for the demo's closing note."""
    d = d or daemon()
    proc = subprocess.run(["du", "-sb", str(d.data_root)], capture_output=True, text=True)
    try:
        return int(proc.stdout.split()[0])
    except (IndexError, ValueError):
        return 0
