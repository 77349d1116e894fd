#!/usr/bin/env python3
"""Record how the pinned ray authenticates its clients under RAY_AUTH_MODE=token, read and measured.

  .venv/bin/python scripts/tools/record_ray_auth.py > configs/upstream/ray-auth.json

Two halves (issue 28 point 2):
- "source": read in the pinned wheel (the cached ray[default]==RAY_VERSION venv of polarstack.stack.ray_head.install)
  by a helper run with that venv's python, which inspects the installed modules: the header, cookie and environment
  names, the paths the dashboard and its agent serve without the token, the 401/403 answers, how the page's login
  sets the cookie, the token's shape, what `ray get-auth-token --generate` prints and writes (with the file's mode
  measured in a scratch HOME under umask 022), and the order in which the dashboard opens its HTTP port. Each fact
  names its file and line, described in our own words.
- "measured": the trainer's `ray start --head --block ...` exactly as Compose renders it (ports moved to free ones),
  with a token ray_auth.ensure wrote, and the clients of polarstack.stack.ray_auth_probe on the three ways in, each
  without the token, with a wrong one and with it; plus a head started with RAY_AUTH_MODE=token and no token file.
Everything started is stopped by pid; nothing records or prints the token (the probe redacts every captured line).
"""

from __future__ import annotations

import datetime
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from polarstack.errors import ExitCode, StackError
from polarstack.pins import pin
from polarstack.stack import ray_auth, ray_auth_probe, ray_head
from polarstack.stack.resolved import read_now

# Run by the pinned ray's python: prints the source facts as JSON (file paths relative to site-packages).
SOURCE_HELPER = r"""
import ast, inspect, json, os, shutil, stat, sys, tempfile, textwrap
from pathlib import Path

import ray
from ray._private.authentication import authentication_constants as constants
from ray._private.authentication import authentication_token_generator as generator
from ray._private.authentication import authentication_token_setup as setup
from ray._private.authentication import http_token_authentication as http_auth
from ray.dashboard import head as dashboard_head
from ray.dashboard import http_server_agent, http_server_head
from ray.dashboard.modules.job import job_head
from ray.dashboard.modules.reporter import healthz_agent, reporter_head
from ray.scripts import scripts

site = Path(ray.__file__).resolve().parents[1]


def where(obj, needle):
    lines, start = inspect.getsourcelines(obj)
    for offset, text in enumerate(lines):
        if needle in text:
            return {"file": str(Path(inspect.getsourcefile(obj)).resolve().relative_to(site)), "line": start + offset}
    sys.exit(f"{obj!r} no longer contains {needle!r}; read the source again")


def literal(obj, name):
    for node in ast.walk(ast.parse(textwrap.dedent(inspect.getsource(obj)))):
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == name for t in node.targets):
            return sorted(ast.literal_eval(node.value))
    sys.exit(f"no assignment of {name} in {obj!r}")


run = http_server_head.HttpServerDashboardHead.run
middleware = inspect.getsource(http_auth.get_token_auth_middleware)
authenticate = http_server_head.HttpServerDashboardHead.authenticate
auth_source = inspect.getsource(authenticate)
dash_run = inspect.getsource(dashboard_head.DashboardHead.run)
start_source = inspect.getsource(scripts.start.callback)
get_token = inspect.getsource(scripts.get_auth_token.callback)
save = inspect.getsource(setup.generate_and_save_token)

token = generator.generate_new_authentication_token()
home = Path(tempfile.mkdtemp(prefix="ray-auth-home-"))
os.environ["HOME"] = str(home)
old = os.umask(0o022)
try:
    setup.generate_and_save_token()
finally:
    os.umask(old)
written = setup._get_default_token_path()
mode = stat.S_IMODE(written.stat().st_mode)
default_path = str(written).replace(str(home), "~")

facts = {
    "env": {
        "mode": "RAY_AUTH_MODE",
        "mode_value": "token",
        "token_path": "RAY_AUTH_TOKEN_PATH",
        "token_text": "RAY_AUTH_TOKEN",
        "where": {"file": "ray/_private/authentication_test_utils.py", "names": ["RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"]},
        "default_file": default_path,
        "meaning": "RAY_AUTH_MODE=token turns authentication on for every Ray process that sees it; the token is read "
        "from RAY_AUTH_TOKEN, a file RAY_AUTH_TOKEN_PATH names, or ~/.ray/auth_token (by the C++ "
        "AuthenticationTokenLoader, which the wheel ships compiled). The stack sets RAY_AUTH_TOKEN_PATH only: "
        "RAY_AUTH_TOKEN would put the token itself into every process environment",
    },
    "http": {
        "header": constants.AUTHORIZATION_HEADER_NAME,
        "bearer_prefix": constants.AUTHORIZATION_BEARER_PREFIX,
        "fallback_header": constants.RAY_AUTHORIZATION_HEADER_NAME,
        "cookie": constants.AUTHENTICATION_TOKEN_COOKIE_NAME,
        "cookie_max_age_seconds": constants.AUTHENTICATION_TOKEN_COOKIE_MAX_AGE,
        "constants": where(constants, "AUTHENTICATION_TOKEN_COOKIE_NAME"),
        "missing_status": 401 if "status=401" in middleware and "Missing authentication token" in middleware else None,
        "invalid_status": 403 if "status=403" in middleware and "Invalid authentication token" in middleware else None,
        "order": ["authorization header", "x-ray-authorization header", "cookie"]
        if middleware.index("AUTHORIZATION_HEADER_NAME") < middleware.index("RAY_AUTHORIZATION_HEADER_NAME")
        < middleware.index("AUTHENTICATION_TOKEN_COOKIE_NAME") else None,
        "middleware": where(http_auth.get_token_auth_middleware, "status=401"),
        "meaning": "the dashboard's middleware takes the token from the Authorization header, then X-Ray-Authorization, "
        "then the cookie; none: 401, a wrong one: 403; paths on the public lists pass without any",
    },
    "dashboard_public_paths": literal(run, "public_exact_paths"),
    "dashboard_public_prefixes": literal(run, "public_path_prefixes"),
    "dashboard_public_where": where(run, "public_exact_paths = {"),
    "agent_public_paths": sorted(http_server_agent.PUBLIC_EXACT_PATHS),
    "agent_public_where": where(http_server_agent, "PUBLIC_EXACT_PATHS = ["),
    "routes": {
        "/api/gcs_healthz": {**where(reporter_head.ReportHead.health_check, "check_gcs_liveness"),
                             "server": "dashboard head (ReportHead)", "meaning": "200 'success' while the GCS answers, else 503"},
        "/api/healthz": {**where(healthz_agent.HealthzAgent, "async def unified_health"),
                         "server": "dashboard agent (HealthzAgent), not the dashboard head's port"},
        "/api/version": {**where(job_head.JobHead.get_version, "VersionResponse("), "server": "dashboard head (JobHead)"},
    },
    "http_port_after_modules": {
        **where(dashboard_head.DashboardHead.run, "wait_for_module_ready()"),
        "holds": dash_run.index("wait_for_module_ready()") < dash_run.index("_configure_http_server("),
        "meaning": "DashboardHead.run waits until every subprocess module (the jobs API's JobHead and ReportHead among "
        "them) is ready before it configures and opens the HTTP server: any answer on the port means they are up",
    },
    "browser_login": {
        "mode_route": where(http_server_head.HttpServerDashboardHead, "async def get_authentication_mode"),
        "login_route": where(http_server_head.HttpServerDashboardHead, "httponly=True"),
        "httponly": "httponly=True" in auth_source,
        "samesite": "Strict" if 'samesite="Strict"' in auth_source else None,
        "secure_only_on_https": 'is_secure = req.scheme == "https"' in auth_source,
        "meaning": "the page asks GET /api/authentication_mode; on 'token' it asks the user for the token and POSTs it "
        "to /api/authenticate in the Authorization header, which sets the HttpOnly, SameSite=Strict cookie (Secure only "
        "over https) that every later request of the page carries",
    },
    "token_shape": {
        **where(generator.generate_new_authentication_token, "token_hex(32)"),
        "hex_digits": len(token),
        "all_hex": all(c in "0123456789abcdef" for c in token),
    },
    "get_auth_token": {
        **where(scripts, "click.echo(token, nl=False)"),
        "prints_token_to_stdout": "click.echo(token, nl=False)" in get_token,
        "generate_writes": default_path,
        "writes_without_chmod": "chmod" not in save and 'open(token_path, "w")' in save,
        "file_mode_under_umask_022": f"{mode:04o}",
        "meaning": "`ray get-auth-token --generate` prints the token on stdout and, when none exists, writes it to "
        "~/.ray/auth_token with the umask's mode (0644 under the usual 022): polarstack writes its own file instead",
    },
    "ray_start_needs_token": {
        **where(scripts, "ensure_token_if_auth_enabled(system_config, create_token_if_missing=False)"),
        "head_and_worker": start_source.count("create_token_if_missing=False") >= 2,
        "meaning": "`ray start` (head or worker) under RAY_AUTH_MODE=token refuses to start without a token; it never makes one",
    },
}
shutil.rmtree(home, ignore_errors=True)
print(json.dumps(facts))
"""


def source_facts(bin_dir: Path) -> dict:
    proc = subprocess.run([str(bin_dir / "python"), "-c", SOURCE_HELPER], capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        sys.exit(f"reading the pinned ray failed: {(proc.stderr or proc.stdout).strip()[-600:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def readiness(dashboard_port: int, token_file: Path, stop: threading.Event, out: dict) -> None:
    """Seconds from `ray start` until HEALTH_PATH (no token) and /api/version (with it) first answer 200."""
    started = time.monotonic()
    urls = {
        ray_head.HEALTH_PATH: (f"http://127.0.0.1:{dashboard_port}{ray_head.HEALTH_PATH}", {}),
        "/api/version": (f"http://127.0.0.1:{dashboard_port}/api/version", None),
    }
    while not stop.is_set() and len(out) < len(urls):
        for path, (url, headers) in urls.items():
            if path in out:
                continue
            try:
                sent = headers if headers is not None else ray_auth.auth_header(token_file)
                if httpx.get(url, headers=sent, timeout=2, trust_env=False).status_code == 200:
                    out[path] = round(time.monotonic() - started, 2)
            except httpx.HTTPError:
                pass
        time.sleep(0.1)


def measure(bin_dir: Path) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="ps-rauth-", dir="/tmp"))  # AF_UNIX paths under RAY_TMPDIR: keep it short
    saved = os.environ.get("RAY_AUTH_TOKEN_FILE")
    os.environ["RAY_AUTH_TOKEN_FILE"] = str(tmp / "secrets" / "ray-auth-token")
    try:
        where = read_now()  # a tool without a site: the device and the cluster as the environment says
        inputs = ray_auth_probe.trainer_head_inputs(tmp / "compose", where=where)
        ray_auth.ensure(inputs.token_file)
        refused_start = ray_auth_probe.head_start_without_token(bin_dir, tmp / "no-token", where=where)
    finally:
        if saved is None:
            os.environ.pop("RAY_AUTH_TOKEN_FILE", None)
        else:
            os.environ["RAY_AUTH_TOKEN_FILE"] = saved
    ready: dict[str, float] = {}
    stop = threading.Event()
    poller = threading.Thread(target=readiness, args=(inputs.dashboard_port, inputs.token_file, stop, ready))
    poller.start()
    started = time.monotonic()
    head = None
    try:
        for attempt in (1, 2, 3):  # ray's own 30 s start-up timeouts can expire on a loaded machine
            try:
                head = ray_head.start(
                    inputs.command,
                    inputs.env,
                    bin_dir=bin_dir,
                    temp_dir=tmp / "rt",
                    dashboard_port=inputs.dashboard_port,
                )
                break
            except StackError as exc:
                if attempt == 3 or exc.code not in (ExitCode.ENVIRONMENT, ExitCode.UNREACHABLE):
                    raise
                print(f"attempt {attempt}: {exc.message}; starting again", file=sys.stderr)
                ready.clear()
                started = time.monotonic()
        start_seconds = round(time.monotonic() - started, 1)
        poller.join(timeout=30)
        clients = ray_auth_probe.Clients(
            bin_dir=bin_dir,
            gcs_port=inputs.gcs_port,
            dashboard_port=inputs.dashboard_port,
            token_file=inputs.token_file,
            wrong_file=ray_auth_probe.wrong_token_file(tmp / "wrong"),
            scratch=tmp / "clients",
            ray_tmpdir=tmp / "rt",
        )
        paths = ["/api/version", "/api/jobs/", "/api/cluster_status", ray_head.HEALTH_PATH, "/api/healthz", "/",
                 "/api/authentication_mode"]  # fmt: skip
        http = clients.http(paths)
        login = clients.browser_login("/api/version")
        runtime_env = {"env_vars": ray_auth.process_env(inputs.token_file)}
        calls = {
            **{
                f"job_submit {w}": (lambda w=w: clients.job_submit(w, runtime_env))
                for w in ("without", "wrong", "with")
            },
            **{f"gcs {w}": (lambda w=w: clients.gcs_connect(w)) for w in ("without", "wrong", "with")},
            "ray_status with": lambda: clients.ray_status("with"),
            "ray_status without": lambda: clients.ray_status("without"),
        }
        with ThreadPoolExecutor(max_workers=len(calls)) as pool:
            futures = {name: pool.submit(call) for name, call in calls.items()}
            results = {name: future.result() for name, future in futures.items()}
        listeners = [item.as_dict() for item in head.listeners if not item.loopback]
    finally:
        stop.set()
        if head is not None:
            head.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    for result in results.values():
        result.pop("tail", None)  # log lines with timestamps: not a fact
    return {
        "command": ray_head.head_command(gcs_port="GCS_PORT", dashboard_port="DASHBOARD_PORT", num_gpus=1, block=True),
        "env": {k: v for k, v in inputs.env.items() if k != "RAY_AUTH_TOKEN_PATH"}
        | {"RAY_AUTH_TOKEN_PATH": "<the host file of the trainer's read-only mount>"},
        "token_file_mode": "0600",
        "token_file_ends_with_newline": True,  # ray_auth.ensure writes "<64 hex>\n": every "with" case below used it
        "head_start_seconds": start_seconds,
        "head_start_attempts": attempt,  # first_200_seconds counts from the first attempt's start
        "first_200_seconds": ready,
        "listeners_beyond_loopback": listeners,
        "http": http,
        "browser_login": login,
        "job_submit": {w: results[f"job_submit {w}"] for w in ("without", "wrong", "with")},
        "gcs_connect": {w: results[f"gcs {w}"] for w in ("without", "wrong", "with")},
        "ray_status": {w: results[f"ray_status {w}"] for w in ("without", "with")},
        "head_start_without_token_file": refused_start,
    }


def main() -> int:
    bin_dir, seconds = ray_head.install()
    started = time.monotonic()
    record = {
        "what": "How the pinned ray authenticates clients under RAY_AUTH_MODE=token: facts read in its installed "
        "sources, and the trainer's Ray head (as Compose renders it) measured on a CPU machine with and without the "
        "token on the three ways in. Used by polarstack.stack.ray_auth, compose.yaml, make verify-offline "
        "(polarstack.offline.ray_auth_facts) and docs/exposure.md.",
        "ray_version": pin("RAY_VERSION"),
        "recorded_on": datetime.date.today().isoformat(),
        "recorded_with": "scripts/tools/record_ray_auth.py",
        "stack": {
            "container_token_path": ray_auth.CONTAINER_TOKEN_PATH,
            "health_path": ray_head.HEALTH_PATH,
            "token_hex_digits": ray_auth.TOKEN_HEX_DIGITS,
        },
        "source": source_facts(bin_dir),
        "measured": measure(bin_dir),
    }
    json.dump(record, sys.stdout, indent=1)
    sys.stdout.write("\n")
    print(
        f"ray install took {seconds:.1f} s (0 when cached); the recording {time.monotonic() - started:.1f} s",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
