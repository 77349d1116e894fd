"""Node checks before anything long at NODES > 1 (issue 28 point 6): `polarstack cluster check`.

Every node's `make up` writes a report of itself to SHARED_DIR/nodes/rank-<N>.json (`write_report`): its address,
the hash of configs/pins.env, the SLIME/POLAR commits and other pins, the ids of the images it runs, a fingerprint of
the model's weights as its trainer sees them, its GPUs and memory, its clock, and the id of the head's `make up`
(SHARED_DIR/nodes/session.json, written by rank 0), so that a report left by an earlier bring-up is recognised.
The check (`check`), run by the last node's `make up` once every report of the head's session is in, by `make
preflight` and by `make train` before they launch, and by hand with `polarstack cluster check [--json]`:
- a report from every node, of the head's current session (missing: STATE; stale: STATE), each naming the node;
- the same pins on every node: each field of every report equals the head's (STATE, naming the node and the field);
- every node joined the head's Ray cluster, alive, with its trainer GPUs (the dashboard's state API, with Ray's
  token: UNREACHABLE / STATE);
- every port the layout needs answers from here: each engine of each node and the router (TCP connect; UNREACHABLE);
- clocks: the HTTP Date header of each node's engine against this node's clock, within CLOCK_BOUND_SECONDS
  (ENVIRONMENT);
- GPUs and memory per node against what the plan needs per node (polarstack.train.memory; ENVIRONMENT).
Everything the check reads from outside goes through `Probe` (tests pass fakes).
"""

from __future__ import annotations

import email.utils
import hashlib
import json
import os
import secrets
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import httpx

from polarstack.errors import ExitCode, StackError
from polarstack.paths import pins_env
from polarstack.pins import pins
from polarstack.stack import compose, ray_auth
from polarstack.stack.cluster import Cluster, NodeLayout, layout

REPORTS = "nodes"  # SHARED_DIR/<this>/
SESSION_FILE = "session.json"  # the head's `make up`: its id, so reports of an earlier bring-up are told apart
REPORT_VERSION = 1
# The pins every node must share (configs/pins.env keys; the whole file's hash is compared too).
PIN_KEYS = ("SLIME_COMMIT", "POLAR_COMMIT", "SGLANG_VERSION", "RAY_VERSION", "SLIME_IMAGE_TAG", "AGENT_CLI_VERSION")
# Fields of a report that must equal the head's, in the order they are compared (a dotted path into the report).
SAME_AS_HEAD = ("pins_sha256", *(f"pins.{k}" for k in PIN_KEYS), "profile", "images.engine", "images.trainer", "model")
# Clock bound: the Date header (RFC 9110) has a resolution of 1 s and a request on the cluster network takes
# milliseconds, so a correct clock reads within ~1 s; 5 s leaves room for that and still catches a node whose clock is
# not synchronised (a free-running clock drifts by seconds per day). What the bound protects: the reports' and logs'
# times compared across nodes (stale reports, a run's timeline), not correctness of training (chosen, not measured).
CLOCK_BOUND_SECONDS = 5.0
CONNECT_TIMEOUT = 5.0


def reports_dir(cluster: Cluster) -> Path:
    if not cluster.shared_dir:
        raise StackError(
            f"NODES={cluster.nodes} needs SHARED_DIR (configs/cluster.env): the node reports live in "
            f"SHARED_DIR/{REPORTS}/.",
            ExitCode.USAGE,
        )
    return Path(cluster.shared_dir) / REPORTS


def report_path(cluster: Cluster, rank: int) -> Path:
    return reports_dir(cluster) / f"rank-{rank}.json"


def _node(cluster: Cluster, rank: int) -> str:
    return f"node {rank} ({cluster.addrs[rank]})"


# --- what a node says about itself -----------------------------------------------------------------------------

MODEL_FINGERPRINT_SCRIPT = (
    # Run inside the trainer (where the models volume or MODEL_DIR is mounted): config.json's bytes and every
    # weight file's name and size, hashed; the same weights on every node give the same fingerprint, cheaply.
    "import hashlib, json, os, sys\n"
    "d = sys.argv[1]\n"
    "h = hashlib.sha256(open(os.path.join(d, 'config.json'), 'rb').read())\n"
    "for name in sorted(os.listdir(d)):\n"
    "    if name.endswith(('.safetensors', '.bin')) or name.endswith('.index.json'):\n"
    "        h.update(f'{name}:{os.path.getsize(os.path.join(d, name))}'.encode())\n"
    "print(h.hexdigest())\n"
)


class Probe:
    """What the check and the report read from the machine (tests replace it)."""

    def now(self) -> float:
        return time.time()

    def image_id(self, image: str) -> str | None:
        try:
            proc = subprocess.run(
                ["docker", "image", "inspect", "--format", "{{.Id}}", image], capture_output=True, text=True, timeout=30
            )
        except (OSError, subprocess.TimeoutExpired):
            return None
        return proc.stdout.strip() or None if proc.returncode == 0 else None

    def model_fingerprint(self, profile: Any, model_path: str, where: compose.Where) -> str | None:
        """`where`: the node's device and cluster (its trainer's Compose project)."""
        proc = compose.run_compose(
            profile,
            ["exec", "-T", "trainer", "python3", "-c", MODEL_FINGERPRINT_SCRIPT, model_path],
            where=where,
            capture=True,
        )
        return proc.stdout.strip().splitlines()[-1] if proc.returncode == 0 and proc.stdout.strip() else None

    def gpus(self) -> list[dict[str, float]] | None:
        """nvidia-smi's index and memory.total (MiB) of every GPU, or None where none is visible (the same query as
        polarstack.train.memory.gpu_memory_mib; POLARSTACK_NVIDIA_SMI points tests at a fake)."""
        binary = shutil.which(os.environ.get("POLARSTACK_NVIDIA_SMI") or "nvidia-smi")
        if binary is None:
            return None
        proc = subprocess.run(
            [binary, "--query-gpu=index,memory.total", "--format=csv,noheader,nounits"], capture_output=True, text=True
        )
        if proc.returncode != 0:
            return None
        out = []
        for line in proc.stdout.splitlines():
            index, _, total = line.partition(",")
            try:
                out.append({"index": int(index.strip()), "memory_mib": float(total.strip())})
            except ValueError:
                continue
        return out or None

    def host_memory_kib(self) -> float | None:
        """MemAvailable (kB), as polarstack.train.memory reads this node's capacity (issue 32: not MemTotal)."""
        try:
            for line in Path(os.environ.get("POLARSTACK_PROC_MEMINFO") or "/proc/meminfo").read_text().splitlines():
                if line.startswith("MemAvailable:"):
                    return float(line.split()[1])
        except (OSError, IndexError, ValueError):
            return None
        return None

    def get(self, url: str, headers: dict[str, str] | None = None, timeout: float = 10.0) -> httpx.Response:
        return httpx.get(url, headers=headers, timeout=timeout, trust_env=False)

    def connect(self, host: str, port: int) -> None:
        with socket.create_connection((host, port), timeout=CONNECT_TIMEOUT):
            pass


def images_of(values: dict[str, str]) -> dict[str, str]:
    """The images a node runs, by compose.yaml's names (the rendered values give the tags)."""
    return {
        "engine": f"polarstack/engine:{values['SGLANG_VERSION']}",
        "trainer": f"polarstack/trainer:{values['SLIME_COMMIT']}",
    }


def pins_sha256() -> str:
    return hashlib.sha256(pins_env().read_bytes()).hexdigest()


def start_session(cluster: Cluster, probe: Probe | None = None) -> dict[str, Any]:
    """The head's `make up` opens a session: every node's report of this bring-up carries its id."""
    probe = probe or Probe()
    if not cluster.head:
        raise StackError("internal: only the head (NODE_RANK=0) opens a cluster session.", ExitCode.INTERNAL)
    directory = reports_dir(cluster)
    directory.mkdir(parents=True, exist_ok=True)
    session = {"id": secrets.token_hex(8), "head": cluster.head_addr, "started_at": probe.now()}
    _write_json(directory / SESSION_FILE, session)
    return session


def read_session(cluster: Cluster) -> dict[str, Any]:
    path = reports_dir(cluster) / SESSION_FILE
    try:
        session = json.loads(path.read_text())
    except FileNotFoundError:
        raise StackError(
            f"no cluster session in {path}: run `make up` on the head ({cluster.head_addr}, NODE_RANK=0) first, then "
            "on this node.",
            ExitCode.STATE,
        ) from None
    except (OSError, ValueError) as exc:
        raise StackError(f"cannot read {path} ({exc}); run `make up` on the head again.", ExitCode.STATE) from None
    if not isinstance(session, dict) or not session.get("id"):
        raise StackError(f"{path} is not a cluster session; run `make up` on the head again.", ExitCode.STATE)
    return session


def _write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")  # whole or absent for a reader on another node
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, path)


def build_report(
    cluster: Cluster, profile: Any, values: dict[str, str], session: dict[str, Any], probe: Probe, *, cpu: bool
) -> dict[str, Any]:
    """This node's report (no secret in it: the token file's path is not even named). `cpu`: the node's device."""
    table = pins()
    images = images_of(values)
    mine = next(n for n in layout(profile, cluster) if n.rank == cluster.rank)
    return {
        "version": REPORT_VERSION,
        "rank": cluster.rank,
        "addr": cluster.addr,
        "iface": cluster.iface,
        "session": session["id"],
        "written_at": probe.now(),
        "profile": profile.name,
        "pins_sha256": pins_sha256(),
        "pins": {k: table.get(k, "") for k in PIN_KEYS},
        "images": {name: probe.image_id(ref) for name, ref in images.items()},
        "model": probe.model_fingerprint(profile, values.get("MODEL_PATH", ""), compose.Place(cpu, cluster)),
        "gpus": probe.gpus(),
        "host_memory_kib": probe.host_memory_kib(),
        "engine_urls": list(mine.engine_urls),
    }


def write_report(
    cluster: Cluster, profile: Any, values: dict[str, str], probe: Probe | None = None, *, cpu: bool
) -> Path:
    """`make up` on every node at NODES>1, once its stack is up (or found already up): its report, in the session the
    head's `make up` opened before it started anything (polarstack.train.cluster_up.open_session), so a node that comes up
    before the head finishes files its report under the head's current session. `cpu`: the node's device (the
    caller's site), whose trainer the report reads the model in."""
    probe = probe or Probe()
    session = read_session(cluster)
    path = report_path(cluster, cluster.rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    _write_json(path, build_report(cluster, profile, values, session, probe, cpu=cpu))
    return path


def pending(cluster: Cluster) -> list[int]:
    """Ranks whose report of the head's current session is not in yet (all of them when there is no session)."""
    try:
        session = read_session(cluster)["id"]
    except StackError:
        return list(range(cluster.nodes))
    out = []
    for rank in range(cluster.nodes):
        try:
            report = json.loads(report_path(cluster, rank).read_text())
        except (OSError, ValueError):
            out.append(rank)
            continue
        if not isinstance(report, dict) or report.get("session") != session:
            out.append(rank)
    return out


# --- the check -----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Need:
    """What one node must hold, from the plan (computed by polarstack.train.memory per node; None: not checked)."""

    gpu_count: int  # GPU indices 0..gpu_count-1 must exist (the profile's ENGINE_GPUS and TRAINER_GPUS)
    trainer_gpus: tuple[int, ...] = ()
    engine_gpus: tuple[int, ...] = ()
    trainer_gpu_gb: float | None = None
    engine_gpu_gb: float | None = None
    host_gb: float | None = None


@dataclass
class NodeRow:
    rank: int
    addr: str
    report: str = ""  # ok | the problem
    ray: str = ""
    ports: list[str] = field(default_factory=list)
    clock_skew_seconds: float | None = None
    gpus: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "addr": self.addr,
            "report": self.report,
            "ray": self.ray,
            "ports": self.ports,
            "clock_skew_seconds": self.clock_skew_seconds,
            "gpus": self.gpus,
        }


@dataclass
class ClusterReport:
    nodes: int
    session: str
    rows: list[NodeRow]
    ok: bool = True
    message: str = ""
    code: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "nodes": self.nodes,
            "session": self.session,
            "clock_bound_seconds": CLOCK_BOUND_SECONDS,
            "rows": [r.as_dict() for r in self.rows],
            "message": self.message,
            "exit_code": self.code,
        }


def _field(report: dict[str, Any], dotted: str) -> Any:
    node: Any = report
    for part in dotted.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node


def _read_reports(cluster: Cluster, session: str) -> list[dict[str, Any]]:
    reports = []
    for rank in range(cluster.nodes):
        path = report_path(cluster, rank)
        try:
            report = json.loads(path.read_text())
        except FileNotFoundError:
            raise StackError(
                f"{_node(cluster, rank)} has written no report to {path}: run `make up` on it (NODE_RANK={rank}).",
                ExitCode.STATE,
            ) from None
        except (OSError, ValueError) as exc:
            raise StackError(
                f"{_node(cluster, rank)}'s report {path} cannot be read ({exc}); run `make up` on it again.",
                ExitCode.STATE,
            ) from None
        if not isinstance(report, dict) or report.get("version") != REPORT_VERSION:
            raise StackError(
                f"{_node(cluster, rank)}'s report {path} is not a version-{REPORT_VERSION} node report; run `make up` "
                "on it again.",
                ExitCode.STATE,
            )
        if report.get("session") != session:
            raise StackError(
                f"{_node(cluster, rank)}'s report {path} is stale: it is from an earlier `make up` of the head (session "
                f"{report.get('session')}, the head's is {session}); run `make up` on it again.",
                ExitCode.STATE,
            )
        if report.get("rank") != rank or report.get("addr") != cluster.addrs[rank]:
            raise StackError(
                f"{path} says rank {report.get('rank')} at {report.get('addr')}, but NODE_ADDRS[{rank}] is "
                f"{cluster.addrs[rank]}: configs/cluster.env differs between the nodes; use the same NODE_ADDRS on "
                "every node.",
                ExitCode.STATE,
            )
        reports.append(report)
    return reports


def _same_pins(cluster: Cluster, reports: list[dict[str, Any]]) -> None:
    head = reports[0]
    for report in reports[1:]:
        for name in SAME_AS_HEAD:
            mine, theirs = _field(report, name), _field(head, name)
            if mine is None or mine != theirs:
                raise StackError(
                    f"{_node(cluster, report['rank'])} differs from the head in {name} ({mine!r}, the head has "
                    f"{theirs!r}): give every node the same configs/pins.env, images (`make build`) and weights "
                    "(`make model`), then `make up` on it again.",
                    ExitCode.STATE,
                )


def _ray_nodes(cluster: Cluster, dashboard_port: int, probe: Probe, token: Path) -> list[dict[str, Any]]:
    url = f"http://{cluster.head_addr}:{dashboard_port}/api/v0/nodes"
    try:
        response = probe.get(url, headers=ray_auth.auth_header(token), timeout=20)
    except httpx.HTTPError as exc:
        raise StackError(
            f"the head's Ray dashboard at {url} does not answer ({type(exc).__name__}); is `make up` done on the head?",
            ExitCode.UNREACHABLE,
        ) from None
    if response.status_code in (401, 403):
        raise StackError(
            f"the head's Ray dashboard refused this node's token ({response.status_code}): copy the head's token file "
            "to the same path here (RAY_AUTH_TOKEN_FILE).",
            ExitCode.STATE,
        )
    try:
        response.raise_for_status()
        rows = response.json()["data"]["result"]["result"]
    except (httpx.HTTPError, ValueError, KeyError, TypeError):
        raise StackError(
            f"the head's Ray dashboard at {url} answered {response.status_code} without a node list.",
            ExitCode.UNREACHABLE,
        ) from None
    return [r for r in rows if isinstance(r, dict)]


def _joined(cluster: Cluster, profile: Any, rows: list[NodeRow], ray_nodes: list[dict[str, Any]]) -> None:
    alive = {r.get("node_ip"): r for r in ray_nodes if r.get("state") == "ALIVE"}
    want = float(len(profile.trainer_gpus))
    for row in rows:
        node = alive.get(row.addr)
        if node is None:
            raise StackError(
                f"{_node(cluster, row.rank)} is not an alive node of the head's Ray cluster (alive: "
                f"{', '.join(sorted(str(a) for a in alive)) or 'none'}): see its trainer's log (`make logs "
                "SERVICE=trainer` there); its Ray worker joins the head at `make up`.",
                ExitCode.STATE,
            )
        gpus = float((node.get("resources_total") or {}).get("GPU", 0.0))
        if gpus != want:
            raise StackError(
                f"{_node(cluster, row.rank)} offers Ray {gpus:g} GPU(s), the plan places {want:g} trainer ranks on "
                "it (TRAINER_GPUS); check its profile and GPUs.",
                ExitCode.STATE,
            )
        row.ray = f"alive, {gpus:g} GPU"


def _ports(cluster: Cluster, profile: Any, nodes: list[NodeLayout], rows: list[NodeRow], probe: Probe) -> None:
    targets: list[tuple[int, str]] = [(n.rank, u) for n in nodes for u in n.engine_urls]
    if profile.router is not None:
        targets.insert(0, (0, f"http://{cluster.head_addr}:{profile.router_port}"))
    for rank, url in targets:
        parsed = urlparse(url)
        try:
            probe.connect(parsed.hostname or "", int(parsed.port or 0))
        except OSError as exc:
            raise StackError(
                f"{_node(cluster, rank)} does not accept a connection on {parsed.hostname}:{parsed.port} from here "
                f"({exc.strerror or type(exc).__name__}): is it up (`make ps` there), and does the firewall between "
                "the nodes let the layout's ports through (docs/multi-node.md)?",
                ExitCode.UNREACHABLE,
            ) from None
        rows[rank].ports.append(f"{parsed.hostname}:{parsed.port}")


def _clocks(cluster: Cluster, nodes: list[NodeLayout], rows: list[NodeRow], probe: Probe) -> None:
    for node in nodes:
        url = f"{node.engine_urls[0]}/health"
        try:
            response = probe.get(url, timeout=10)
        except httpx.HTTPError as exc:
            raise StackError(
                f"{_node(cluster, node.rank)}'s engine {url} does not answer ({type(exc).__name__}).",
                ExitCode.UNREACHABLE,
            ) from None
        here = probe.now()
        date = response.headers.get("date")
        try:
            theirs = email.utils.parsedate_to_datetime(date).timestamp() if date else None
        except (TypeError, ValueError):
            theirs = None
        if theirs is None:
            raise StackError(
                f"{_node(cluster, node.rank)}'s engine {url} sent no Date header, so its clock cannot be compared.",
                ExitCode.ENVIRONMENT,
            )
        skew = theirs - here
        rows[node.rank].clock_skew_seconds = round(skew, 1)
        if abs(skew) > CLOCK_BOUND_SECONDS:
            raise StackError(
                f"{_node(cluster, node.rank)}'s clock is {skew:+.0f} s from this node's (bound {CLOCK_BOUND_SECONDS:g} s): "
                "synchronise the clocks (chrony or systemd-timesyncd) on every node.",
                ExitCode.ENVIRONMENT,
            )


def _capacity(cluster: Cluster, reports: list[dict[str, Any]], rows: list[NodeRow], need: Need) -> None:
    for report, row in zip(reports, rows, strict=True):
        gpus = report.get("gpus")
        if gpus is None:
            row.gpus = "no GPU visible (not checked)"
            continue
        memory = {int(g["index"]): float(g["memory_mib"]) for g in gpus if isinstance(g, dict)}
        missing = [i for i in range(need.gpu_count) if i not in memory]
        if missing:
            raise StackError(
                f"{_node(cluster, row.rank)} has {len(memory)} GPU(s), the profile uses GPUs 0-{need.gpu_count - 1} on "
                "every node: change ENGINE_GPUS/TRAINER_GPUS, or use nodes alike.",
                ExitCode.ENVIRONMENT,
            )
        for kind, indices, gb in (
            ("trainer", need.trainer_gpus, need.trainer_gpu_gb),
            ("engine", need.engine_gpus, need.engine_gpu_gb),
        ):
            if gb is None or not indices:
                continue
            smallest = min(memory[i] for i in indices) * 1024**2 / 1e9
            if smallest < gb:
                raise StackError(
                    f"{_node(cluster, row.rank)}'s {kind} GPUs have {smallest:.1f} GB, the plan needs {gb:.1f} GB per "
                    f"{kind} GPU on every node (make train DRY_RUN=1 prints every term).",
                    ExitCode.ENVIRONMENT,
                )
        host = report.get("host_memory_kib")
        if need.host_gb is not None and host is not None and host * 1024 / 1e9 < need.host_gb:
            raise StackError(
                f"{_node(cluster, row.rank)} has {host * 1024 / 1e9:.1f} GB of host memory available, the plan needs "
                f"{need.host_gb:.1f} GB per node.",
                ExitCode.ENVIRONMENT,
            )
        row.gpus = f"{len(memory)} GPU, smallest {min(memory.values()) * 1024**2 / 1e9:.1f} GB"


def check(
    cluster: Cluster,
    profile: Any,
    *,
    need: Need,
    dashboard_port: int,
    probe: Probe | None = None,
    token: Path | None = None,
) -> ClusterReport:
    """Every check above, in order; raises the first failure as a StackError (one sentence, its code)."""
    probe = probe or Probe()
    if not cluster.multi:
        return ClusterReport(
            1, "", [NodeRow(0, cluster.addr, report="one node")], message="NODES=1: one node, nothing to compare"
        )
    nodes = layout(profile, cluster)
    session = read_session(cluster)["id"]
    rows = [NodeRow(n.rank, n.addr) for n in nodes]
    reports = _read_reports(cluster, session)
    for row in rows:
        row.report = "ok"
    _same_pins(cluster, reports)
    _joined(
        cluster,
        profile,
        rows,
        _ray_nodes(cluster, dashboard_port, probe, token or ray_auth.token_path(cluster.token_file)),
    )
    _ports(cluster, profile, nodes, rows, probe)
    _clocks(cluster, nodes, rows, probe)
    _capacity(cluster, reports, rows, need)
    return ClusterReport(cluster.nodes, session, rows, message=f"{cluster.nodes} nodes checked")


def run(cluster: Cluster, profile: Any, **kwargs: Any) -> ClusterReport:
    """`check` that returns the failure in the report instead of raising it (for --json)."""
    try:
        return check(cluster, profile, **kwargs)
    except StackError as exc:
        report = ClusterReport(cluster.nodes, "", [], ok=False, message=exc.message, code=int(exc.code))
        return report


__all__ = [
    "CLOCK_BOUND_SECONDS",
    "ClusterReport",
    "Need",
    "Probe",
    "check",
    "pending",
    "read_session",
    "run",
    "start_session",
    "write_report",
]
