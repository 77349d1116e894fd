"""Every TCP port one node binds with a fixed number, who binds it and when, and where two could meet (issue 34 point 5).

Every service uses host networking, so the engines, the router, the trainer's Ray and Polar share one port space:
- `make up` binds the engines' ENGINE_PORT_BASE + 10 i, the router's ROUTER_PORT and, for a release with
  --prometheus-port, its metrics port ROUTER_PORT + 1 (sglang-router 0.1.4 has no such option and opens no other port:
  measured, ../shared/reference/router-behavior.md and configs/upstream/router-prometheus-host.json), then the trainer's
  Ray head: RAY_GCS_PORT, RAY_DASHBOARD_PORT and four ports the stack leaves at the pinned ray's fixed values, the client
  server (10001), the dashboard agent (52365) and the autoscaler's and dashboard's Prometheus exporters (44217, 44227);
- `make train`'s launch.sh binds Polar's rollout server and gateway (polar.rollout_port, polar.gateway_port) at each
  attempt, while that Ray head runs.
The pinned ray hands each worker process the next free port of 10002-19999 (--min-worker-port / --max-worker-port,
never set by the stack) and picks its other ports at random at or above the kernel's ephemeral range
(net.ipv4.ip_local_port_range); both are recorded, with the source of each rule, in configs/upstream/ray-listeners.json
(scripts/tools/record_ray_listeners.py: `port_defaults`, `port_rules`, each listener's port). A port bound while Ray
runs (Polar's) inside either range can belong to a Ray worker or a random pick first, and Polar's server then cannot
listen: so the plan refuses it (`problems`). Ports that slime, Polar and NCCL pick for themselves while they bind
(slime's own router from 3000-4000 and its metrics from 4000-5000, Megatron's MASTER_PORT from 20000-21000, Polar's
callback listener on port 0, NCCL's and Gloo's) are taken free when chosen and have no fixed number to account for.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from polarstack.pins import pin, repo_root
from polarstack.stack.profiles import Profile, stack_knobs

RECORD = "configs/upstream/ray-listeners.json"
POLAR_APPTAINER = "configs/upstream/polar-apptainer.json"  # broker_proxy_port: apptainer_broker._DEFAULT_PROXY_PORT
LOCAL_PORT_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LINUX_EPHEMERAL_START = 32768  # the kernel's default first ephemeral port, where LOCAL_PORT_RANGE cannot be read
# The head's ports the stack leaves at ray's fixed values: record `port_kind` -> what they are.
RAY_FIXED = {
    "client_server": "the trainer's Ray client server",
    "dashboard_agent": "the trainer's Ray dashboard agent",
    "autoscaler_metrics": "the trainer's Ray autoscaler metrics",
    "dashboard_metrics": "the trainer's Ray dashboard metrics",
}
RAY_FIXED_DEFAULTS = {  # record `port_kind` -> its key in the record's port_defaults (None: measured only)
    "client_server": None,
    "dashboard_agent": "dashboard_agent_listen_port",
    "autoscaler_metrics": "autoscaler_metric_port",
    "dashboard_metrics": "dashboard_metric_port",
}


@lru_cache(maxsize=1)
def record() -> dict[str, Any]:
    return json.loads((repo_root() / RECORD).read_text())


def ray_fixed_ports(data: dict[str, Any] | None = None) -> dict[str, int]:
    """The head's fixed ports the stack does not set (record `port_kind` -> port), as the pinned ray uses them: the
    client server's as measured (ray start's 10001 when the option is not given), the others its defaults."""
    data = data or record()
    out: dict[str, int] = {}
    for kind, key in RAY_FIXED_DEFAULTS.items():
        if key is not None:
            out[kind] = int(data["port_defaults"][key])
            continue
        seen = {row["port"] for row in data["with_loopback_env"] if row.get("port_kind") == kind}
        if len(seen) != 1 or not isinstance(next(iter(seen)), int):
            raise ValueError(f"{RECORD} holds no single measured port of kind {kind}")
        out[kind] = int(next(iter(seen)))
    return out


def worker_range(data: dict[str, Any] | None = None) -> tuple[int, int]:
    """Ports the pinned ray's workers take (its --min-worker-port, --max-worker-port defaults)."""
    defaults = (data or record())["port_defaults"]
    return int(defaults["min_worker_port"]), int(defaults["max_worker_port"])


def ephemeral_start(path: Path | None = None) -> int:
    """The first port of this kernel's ephemeral range (ray's random picks start there or above)."""
    try:
        return int((path or LOCAL_PORT_RANGE).read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return LINUX_EPHEMERAL_START


@dataclass(frozen=True)
class Bound:
    port: int
    what: str
    knob: str | None  # the knob that moves it; None: one of ray's fixed ports, which the stack leaves as they are
    while_ray_runs: bool = False  # bound after the trainer's Ray head started (a Ray worker can hold it first)

    @property
    def moved_by(self) -> str:
        return self.knob or f"ray's fixed port, {RECORD}"


def _ray_port(profile: Profile | None, key: str) -> int:
    raw = (profile.setting(key) if profile is not None else "") or stack_knobs().get(key) or "0"
    return int(raw) if raw.strip().isdigit() else 0


def node_ports(
    profile: Profile, polar: dict[str, Any] | None = None, data: dict[str, Any] | None = None
) -> list[Bound]:
    """Every fixed port of `profile` on one node; `polar`: configs/train/defaults.yaml's polar section (Polar's two
    ports), None when only `make up`'s services count."""
    ports = [Bound(profile.engine_port(i), f"engine-{i}", "ENGINE_PORT_BASE") for i in range(profile.engine_count)]
    if profile.router is not None:
        ports.append(Bound(profile.router_port, "the router", "ROUTER_PORT"))
        if profile.router.accepts_prometheus_port:  # compose.render_values passes ROUTER_PORT + 1 to such a release
            ports.append(Bound(profile.router_port + 1, "the router's metrics", "ROUTER_PORT"))
    ports += [
        Bound(_ray_port(profile, "RAY_GCS_PORT"), "the trainer's Ray GCS", "RAY_GCS_PORT"),
        Bound(_ray_port(profile, "RAY_DASHBOARD_PORT"), "the trainer's Ray dashboard", "RAY_DASHBOARD_PORT"),
    ]
    for kind, port in ray_fixed_ports(data).items():
        ports.append(Bound(port, RAY_FIXED[kind], None))
    if polar is not None:
        for key, what in (("rollout_port", "Polar's rollout server"), ("gateway_port", "Polar's gateway")):
            ports.append(Bound(int(polar[key]), what, f"polar.{key}", while_ray_runs=True))
        # A session's broker may listen here on the trainer's network (configs/upstream/polar-apptainer.json).
        proxy = int(json.loads((repo_root() / POLAR_APPTAINER).read_text())["broker_proxy_port"])
        ports.append(Bound(proxy, "Polar's in-session HTTP proxy", f"Polar's default, {POLAR_APPTAINER}"))
    return [p for p in ports if p.port]


def problems(
    profile: Profile, polar: dict[str, Any] | None, data: dict[str, Any] | None = None, ephemeral: int | None = None
) -> list[str]:
    """Where two servers of the node would want one port: the same fixed port twice, or a port bound while Ray runs
    inside the range Ray's workers take or at or above the ephemeral start where Ray picks its random ports."""
    data = data or record()
    low, high = worker_range(data)
    first_random = ephemeral if ephemeral is not None else ephemeral_start()
    out = []
    seen: dict[int, Bound] = {}
    for bound in node_ports(profile, polar, data):
        other = seen.setdefault(bound.port, bound)
        if other is not bound:
            out.append(
                f"port {bound.port} is both {other.what}'s ({other.moved_by}) and {bound.what}'s ({bound.moved_by}); "
                "move one"
            )
        if not bound.while_ray_runs:
            continue
        if low <= bound.port <= high:
            out.append(
                f"{bound.what}'s port {bound.port} ({bound.knob}) lies in {low}-{high}, the ports the pinned ray hands "
                f"its workers one by one ({RECORD} port_rules), so a Ray worker can hold it before {bound.what} binds; "
                f"pick a port outside {low}-{high}"
            )
        elif bound.port >= first_random:
            out.append(
                f"{bound.what}'s port {bound.port} ({bound.knob}) lies at or above {first_random}, where the pinned ray "
                f"picks its random ports (the kernel's ephemeral range, {RECORD} port_rules); pick one below "
                f"{first_random} and outside {low}-{high}"
            )
    return out


KNOWN_KINDS = ("gcs", "dashboard", "random", *RAY_FIXED)


def record_problems(data: dict[str, Any] | None = None) -> list[str]:
    """`make verify-offline`: the recorded head (configs/upstream/ray-listeners.json) is the one the accounting
    describes: recorded for RAY_VERSION; every listener on loopback with the stack's setting and of a known kind (a
    port the stack sets, one of RAY_FIXED, or one of ray's random picks); each RAY_FIXED kind seen listening, on the
    default the accounting uses where the recorder left it at ray's own; every random pick at or above the start of
    the ephemeral range when measured; a worker range to keep Polar's ports out of."""
    data = data or record()
    out = []
    if data.get("ray_version") != pin("RAY_VERSION"):
        out.append(f"{RECORD} was recorded for ray {data.get('ray_version')}, not RAY_VERSION={pin('RAY_VERSION')}")
    rows = data.get("with_loopback_env") or []
    for row in rows:
        if row.get("port_kind") not in KNOWN_KINDS:
            out.append(
                f"{RECORD}: {row.get('server')} listened on port {row.get('port')} ({row.get('port_kind')}), which "
                "polarstack.stack.ports does not account for; rerecord it and add the port"
            )
        elif not row.get("loopback"):
            out.append(f"{RECORD}: {row.get('server')} listened on {row.get('address')} with the loopback setting")
    try:
        fixed = ray_fixed_ports(data)
    except (KeyError, ValueError) as exc:
        return out + [f"{RECORD}: {exc}"]
    for kind in RAY_FIXED:
        seen = [row["port"] for row in rows if row.get("port_kind") == kind]
        if not seen:
            out.append(f"{RECORD}: the recorded head shows no {kind} listener; rerecord it")
        elif kind in ("client_server", "dashboard_agent") and any(port != fixed[kind] for port in seen):
            out.append(f"{RECORD}: the {kind} listened on {seen}, not on {fixed[kind]}, the port accounted for")
    randoms = data.get("random_ports") or {}
    low_seen, local_range = randoms.get("lowest_seen"), randoms.get("ip_local_port_range") or [None]
    if not isinstance(low_seen, int) or not isinstance(local_range[0], int) or low_seen < local_range[0]:
        out.append(
            f"{RECORD}: ray's random ports were not all at or above the ephemeral range when recorded "
            f"(lowest {low_seen}, range {local_range}): the rule polarstack.stack.ports refuses by does not hold"
        )
    try:
        low, high = worker_range(data)
    except (KeyError, TypeError, ValueError):
        return out + [f"{RECORD}: port_defaults has no worker range; rerecord it"]
    if not 0 < low <= high <= 65535:
        out.append(f"{RECORD}: the worker range {low}-{high} is not a port range")
    return out
