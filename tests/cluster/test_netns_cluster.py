"""Two nodes of a cluster in network namespaces on this machine (issue 28 point 7): `polarstack up/smoke/down` of
the local runtime with NODES=2, run through `ip netns exec` as a user would on each node.

Topology (cluster_netns): namespaces node-a, node-b and outsider on one bridge, addresses in 198.18.0.0/15 picked
by the test, no route beyond their /24. Node A (rank 0) runs the Ray head, the router and the smoke; node B (rank 1)
a Ray worker and two emulated engines; A also runs its own two engines (the profile's split on every node). The
token file is the test's own (RAY_AUTH_TOKEN_FILE, mode 0600, in the test's tmp dir).

Asserted: the Ray cluster has 2 alive nodes (the state API, with the token); the router lists B's engines by B's
address; the smoke from A passes across the boundary with trainable tokens per engine and per node; without the
token (none, or a wrong one) the dashboard/jobs API answers 401/403, `ray job submit` and `ray.init` to the GCS are
refused, from the outsider and from A, while the token's holder gets in (positive controls); every listening TCP
socket of A and B (read from /proc of each namespace's processes) is probed from the outsider and classified, and
the classes match the "Multi-node listeners" table of docs/exposure.md row for row; the token appears in no output
or log; `down` on each node stops exactly what `up` started there, and teardown leaves no namespace, link or
process. Everything started is stopped by pid (the CLI's `down`, then any survivor of the namespaces by its pid).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import cluster_netns
import pytest

from conftest import RAY_SESSION_NICE
from favoured_sessions import favoured_new_sessions
from polarstack.processes import start_time, stop_pid
from polarstack.stack import ray_head
from polarstack.stack.listeners import Listener, listening

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]
PROBE = Path(__file__).with_name("cluster_probe.py")
EXPOSURE = REPO / "docs" / "exposure.md"
ROLES = ("node-a", "node-b", "outsider")
UP_SECONDS = 420  # both `up`s, with the head's Ray start-up (10-30 s here, more under load)


@pytest.fixture(scope="module")
def ray_bin_dir() -> Path:
    reason = cluster_netns.missing_tools()
    if reason:
        pytest.skip(reason)
    bin_dir, _seconds = ray_head.install()  # the pinned ray, installed once under the cache
    return bin_dir


@dataclass
class ClusterRun:
    topo: cluster_netns.Topology
    tmp: Path
    profile: str
    token_file: Path
    bin_dir: Path
    outputs: list[str] = field(default_factory=list)  # every CLI output, searched for the token at the end
    recorded_pids: dict[str, list[int]] = field(default_factory=dict)

    def addr(self, role: str) -> str:
        return self.topo.addrs[role]

    def run_dir(self, role: str) -> Path:
        return self.tmp / f"run-{role}"

    def env(self, role: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "POLARSTACK_VIA_MAKE"))}
        env.update(
            NODES="2",
            NODE_RANK="0" if role == "node-a" else "1",
            CLUSTER_IFACE=cluster_netns.IFACE,
            NODE_ADDRS=f"{self.addr('node-a')},{self.addr('node-b')}",
            RAY_AUTH_TOKEN_FILE=str(self.token_file),
            POLARSTACK_RUN_DIR=str(self.run_dir(role)),
        )
        return env

    def cli(self, role: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        with favoured_new_sessions(RAY_SESSION_NICE):  # the node's Ray sessions (tests/favoured_sessions.py)
            proc = subprocess.run(
                [*self.topo.exec(role), sys.executable, "-m", "polarstack", *args],
                env=self.env(role),
                capture_output=True,
                text=True,
                timeout=timeout,
            )
        self.outputs += [proc.stdout, proc.stderr]
        return proc

    def make(self, role: str, target: str, timeout: float = 120, **variables: str) -> subprocess.CompletedProcess:
        """`make <target> VAR=value ...` of the repository in `role`'s namespace, as a user runs it on a node (the
        Makefile calls the same CLI; its exit code there is make's 2 on any failure, the CLI's printed beside it)."""
        with favoured_new_sessions(RAY_SESSION_NICE):
            proc = subprocess.run(
                [*self.topo.exec(role), "make", "-C", str(REPO), target, *(f"{k}={v}" for k, v in variables.items())],
                env=self.env(role),
                capture_output=True,
                text=True,
                timeout=timeout,
            )
        self.outputs += [proc.stdout, proc.stderr]
        return proc

    def python(self, role: str, code: str, *args: str, env: dict | None = None, timeout: float = 60, ray=False):
        """Run `code` with this venv's python (or the pinned ray's, `ray=True`) inside `role`'s namespace."""
        python = str(self.bin_dir / "python") if ray else sys.executable
        proc = subprocess.run(
            [*self.topo.exec(role), python, "-c", code, *args],
            env=env or {"PATH": os.environ["PATH"], "HOME": str(self.tmp / "empty-home")},
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        self.outputs += [proc.stdout, proc.stderr]
        return proc

    def state(self, role: str) -> dict:
        return json.loads((self.run_dir(role) / "state.json").read_text())


def _up(
    run: ClusterRun, via_make: bool = False
) -> tuple[subprocess.CompletedProcess, subprocess.CompletedProcess, float]:
    """`up` on both nodes at once (B first: it waits for the head, the head for B's engines and Ray worker); with
    `via_make`, `make up RUNTIME=local PROFILE=...` as the docs say, else the CLI with --json."""
    began = time.monotonic()

    def up(role: str) -> subprocess.CompletedProcess:
        if via_make:
            return run.make(role, "up", timeout=UP_SECONDS, RUNTIME="local", PROFILE=run.profile)
        return run.cli(role, "up", "--profile", run.profile, "--json", timeout=UP_SECONDS)

    with ThreadPoolExecutor(2) as pool:
        b = pool.submit(up, "node-b")
        time.sleep(0.5)
        a = pool.submit(up, "node-a")
        return a.result(), b.result(), time.monotonic() - began


def _stop_survivors(run: ClusterRun) -> list[str]:
    """Any process still in the test's namespaces is one the test started (through `up`): stop it by its pid."""
    found = []
    for role in ROLES:
        for pid in run.topo.pids(role):
            found.append(f"pid {pid} in {role}: {Path(f'/proc/{pid}/cmdline').read_bytes()[:120]!r}")
            stop_pid(pid, timeout=5)
    return found


@pytest.fixture
def cluster_run(tmp_path_factory, ray_bin_dir, request):
    tmp = tmp_path_factory.mktemp("cluster")
    (tmp / "empty-home").mkdir()
    token_file = tmp / "ray-auth-token"
    fd = os.open(token_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(secrets.token_hex(32) + "\n")
    topo = cluster_netns.create(ROLES)
    run = ClusterRun(topo, tmp, request.param, token_file, ray_bin_dir)
    try:
        yield run
    finally:
        # `down` on every node (a no-op when the test already ran it), then survivors by pid, then the namespaces
        for role in ("node-b", "node-a"):
            if (run.run_dir(role) / "state.json").exists():
                run.cli(role, "down", timeout=120)
        survivors = _stop_survivors(run)
        cluster_netns.remove(topo)
        left = topo.leftovers()
        pids = [pid for pids in run.recorded_pids.values() for pid in pids if start_time(pid) is not None]
        assert not survivors and not left and not pids, (survivors, left, pids)


def _check_down(run: ClusterRun, via_make: bool = False) -> None:
    """`down` on each node stops what `up` started there (its recorded pids), and nothing is left in it."""
    for role in ("node-b", "node-a"):
        recorded = [p["pid"] for p in run.state(role)["processes"]]
        temp_dirs = [p["temp_dir"] for p in run.state(role)["processes"] if p.get("temp_dir")]
        run.recorded_pids[role] = recorded
        proc = run.make(role, "down", RUNTIME="local") if via_make else run.cli(role, "down", timeout=120)
        assert proc.returncode == 0, proc.stderr
        assert all(start_time(pid) is None for pid in recorded), f"down on {role} left a recorded process"
        assert run.topo.pids(role) == [], f"down on {role} left processes in its namespace"
        assert not any(Path(d).exists() for d in temp_dirs), temp_dirs
        assert not (run.run_dir(role) / "state.json").exists()


# --- what listens, and what the outsider reaches -----------------------------------------------------------

RAY_SERVERS = (  # process command line -> the listener's name in docs/exposure.md's table
    ("gcs_server", "ray gcs_server"),
    ("raylet", "ray raylet"),
    ("dashboard.py", "ray dashboard"),
    ("DashboardAgent", "ray dashboard agent"),
    ("RuntimeEnvAgent", "ray runtime-env agent"),
    ("ray.util.client.server", "ray client server"),
    ("monitor.py", "ray autoscaler monitor"),
)


def _owner(run: ClusterRun, role: str, listener: Listener, states: dict) -> str:
    """The table's name for the process holding `listener`: the run state's roles first, then Ray's programs."""
    for entry in states[role]["processes"]:
        if entry["pid"] == listener.pid:
            return "router" if entry["role"] == "router" else "engine (emulator)" if "engine" in entry["role"] else ""
    for needle, name in RAY_SERVERS:
        if needle in listener.process:
            return name
    if "ray::" in listener.process or "default_worker" in listener.process:
        return "ray worker"
    return f"unknown: {listener.process[:100]}"


def _scope(listener: Listener) -> str:
    if listener.loopback:
        return "loopback"
    return "every interface" if listener.address in ("0.0.0.0", "::") else "the node's address"


def measured_listeners(run: ClusterRun) -> list[dict]:
    """Every listening TCP socket of A's and B's processes, with its owner, bind scope and the outsider's class."""
    states = {role: run.state(role) for role in ("node-a", "node-b")}
    rows = []
    for role in ("node-a", "node-b"):
        pids = run.topo.pids(role)
        for item in listening(pids, proc_net=run.topo.proc_net(role)):
            rows.append(
                {
                    "node": "head" if role == "node-a" else "worker",
                    "role": role,
                    "listener": _owner(run, role, item, states),
                    "binds": _scope(item),
                    "address": item.address,
                    "port": item.port,
                    "target": f"{run.addr(role)}:{item.port}",
                }
            )
    # A loopback socket is never routed to from another namespace; probed at the node's address only when no other
    # socket of that node holds its port (else the probe would reach that one: ray's client server binds both).
    shared = {(r["role"], r["port"]) for r in rows if r["binds"] != "loopback"}
    probed = [r for r in rows if not (r["binds"] == "loopback" and (r["role"], r["port"]) in shared)]
    targets = [row["target"] for row in probed]
    outside = run.python("outsider", PROBE.read_text(), *targets, ray=True, timeout=600)
    assert outside.returncode == 0, outside.stderr[-2000:]
    inside = run.python("node-a", PROBE.read_text(), "--token", str(run.token_file), *targets, ray=True, timeout=600)
    assert inside.returncode == 0, inside.stderr[-2000:]
    for row, without, holder in zip(probed, outside.stdout.splitlines(), inside.stdout.splitlines(), strict=True):
        row["outsider"], row["outsider_detail"] = json.loads(without)["class"], json.loads(without)["detail"]
        row["with_token"] = json.loads(holder)["class"]
    for row in rows:
        if row not in probed:
            row.update(
                outsider="unreachable", outsider_detail="loopback; its port is also bound beyond it", with_token=""
            )
    return rows


def documented_listeners() -> tuple[set[tuple[str, str, str, str]], set[tuple[str, str, str, str]]]:
    """(listener, node, binds, class) of the rows of docs/exposure.md's "Multi-node listeners" table measured here:
    (the rows that must be measured, the rows that may be: evidence "... while ..." exists only at times)."""
    text = EXPOSURE.read_text()
    section = text.split("## Multi-node listeners", 1)[1].split("\n## ", 1)[0]
    always, sometimes = set(), set()
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 7 or not cells[0].startswith("`") or "measured: `tests/cluster" not in cells[-1]:
            continue
        name = cells[0].split("`")[1]
        nodes = {"head": ["head"], "worker": ["worker"], "every node": ["head", "worker"]}[cells[1].split(" (")[0]]
        binds = cells[2].split(" (")[0]
        cls = {"refused": "token", "open": "open", "unreachable": "unreachable"}[cells[4].split()[0].strip(",;:")]
        target = sometimes if " while " in cells[-1] else always
        target |= {(name, node, binds, cls) for node in nodes}
    return always, sometimes


# --- the test ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("cluster_run", ["patched-router"], indirect=True)
def test_two_nodes_registered_router_token_and_exposure(cluster_run, tmp_path):
    run = cluster_run
    a, b, seconds = _up(run)
    assert a.returncode == 0 and b.returncode == 0, (a.stderr[-3000:], b.stderr[-3000:])
    print(f"both `up`s: {seconds:.1f} s")
    head, worker = json.loads(a.stdout), json.loads(b.stdout)
    b_engines = [f"http://{run.addr('node-b')}:{port}" for port in (30000, 30010)]
    a_engines = [f"http://{run.addr('node-a')}:{port}" for port in (30000, 30010)]
    assert head["engine_urls"] == a_engines + b_engines == worker["engine_urls"]
    assert [p["role"] for p in head["processes"]] == ["engine-0", "engine-1", "ray-head", "router"]
    assert [p["role"] for p in worker["processes"]] == ["engine-0", "engine-1", "ray-worker"]
    assert head["base_url"] == f"http://{run.addr('node-a')}:30080"
    assert str(run.token_file) == head["token_file"] == worker["token_file"]

    # the Ray cluster: 2 alive nodes, read through the state API with the token
    nodes = run.python(
        "node-a",
        "import sys, json; from pathlib import Path; from polarstack.stack import ray_node; "
        "print(json.dumps(ray_node.alive_nodes(sys.argv[1], Path(sys.argv[2]))))",
        head["ray_dashboard"],
        str(run.token_file),
    )
    assert nodes.returncode == 0, nodes.stderr
    assert json.loads(nodes.stdout) == sorted([run.addr("node-a"), run.addr("node-b")])

    # the router lists B's engines by B's address (registered by A's `up` through POST /workers, as slime does)
    listed = run.python(
        "node-a",
        "import sys, httpx; print(httpx.get(sys.argv[1] + '/workers', trust_env=False).text)",
        head["base_url"],
    )
    urls = sorted(w["url"].rstrip("/") for w in json.loads(listed.stdout)["workers"])
    assert urls == sorted(a_engines + b_engines)

    # the smoke from A, across the boundary: trainable tokens per engine and per node
    smoke = run.cli("node-a", "smoke", "--json")
    assert smoke.returncode == 0, smoke.stderr[-2000:]
    report = json.loads(smoke.stdout)
    assert [(n["rank"], n["addr"], n["engines"], n["failed"]) for n in report["per_node"]] == [
        (0, run.addr("node-a"), 2, []),
        (1, run.addr("node-b"), 2, []),
    ]
    assert all(n["trainable_tokens"] > 0 for n in report["per_node"])
    assert [r["url"] for r in report["per_engine"]] == a_engines + b_engines
    assert all(r["verdict"] == "pass" and r["trainable_tokens"] > 0 for r in report["per_engine"])
    served = run.python(
        "node-a",
        "import sys, httpx; print(len(httpx.get(sys.argv[1] + '/_emulator/requests', trust_env=False)"
        ".json()['requests']))",
        b_engines[1],
    )
    assert int(served.stdout) >= 1  # B's engine answered a request sent from A
    text = run.cli("node-a", "smoke")
    assert text.returncode == 0
    assert f"node 1 ({run.addr('node-b')}): " in text.stdout and "trainable tokens from 2 engine(s)" in text.stdout

    _check_refusals(run, head)

    rows = measured_listeners(run)
    (tmp_path / "listeners.json").write_text(json.dumps(rows, indent=1))
    print(json.dumps(rows, indent=1))
    unknown = [r for r in rows if r["listener"].startswith("unknown")]
    assert not unknown, unknown
    for row in rows:
        if row["outsider"] == "token":  # the positive control: the token's holder is let in where the outsider is not
            assert row["with_token"] == "answers", row
        if row["binds"] == "loopback":
            assert row["outsider"] == "unreachable", row
        if row["listener"].startswith("ray ") and row["outsider"] == "open":
            assert "/metrics 200" in row["outsider_detail"], row  # only Ray's Prometheus exporters answer openly
    measured = {(r["listener"], r["node"], r["binds"], r["outsider"]) for r in rows}
    always, sometimes = documented_listeners()
    assert always - measured == set(), f"docs/exposure.md lists listeners not measured: {always - measured}"
    assert measured - always - sometimes == set(), f"not in docs/exposure.md: {measured - always - sometimes}"

    for text in run.outputs + [p.read_text(errors="replace") for p in _logs(run)]:
        assert run.token_file.read_text().strip() not in text, "the Ray token was printed"

    _check_down(run)


def _logs(run: ClusterRun) -> list[Path]:
    files = [p for role in ("node-a", "node-b") for p in run.run_dir(role).rglob("*") if p.is_file()]
    for role in ("node-a", "node-b"):
        for entry in run.state(role)["processes"]:
            if entry.get("temp_dir"):
                files += [p for p in Path(entry["temp_dir"]).rglob("*") if p.is_file() and not p.is_socket()]
    return [p for p in files if p.stat().st_size < 50_000_000]


def _check_refusals(run: ClusterRun, head: dict) -> None:
    """Without the token: HTTP 401 (none) / 403 (wrong), `ray job submit` refused, `ray.init` refused, from the
    outsider and from A; with it, from A: HTTP 200, `ray job list` and `ray.init` succeed."""
    dashboard = head["ray_dashboard"]
    wrong = run.tmp / "wrong-token"
    fd = os.open(wrong, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(secrets.token_hex(32) + "\n")
    http = (
        "import sys, json, httpx; from pathlib import Path\n"
        "out = {}\n"
        "for name, header in (('none', {}), ('wrong', {'Authorization': 'Bearer ' + Path(sys.argv[2]).read_text().strip()}),"
        " ('right', {'Authorization': 'Bearer ' + Path(sys.argv[3]).read_text().strip()} if sys.argv[3] != '-' else None)):\n"
        "    if header is None: continue\n"
        "    out[name] = {p: httpx.get(sys.argv[1] + p, headers=header, trust_env=False).status_code"
        " for p in ('/api/version', '/api/jobs/', '/api/v0/nodes')}\n"
        "print(json.dumps(out))\n"
    )
    for role, right in (("outsider", "-"), ("node-a", str(run.token_file))):
        proc = run.python(role, http, dashboard, str(wrong), right)
        assert proc.returncode == 0, proc.stderr
        found = json.loads(proc.stdout)
        assert set(found["none"].values()) == {401} and set(found["wrong"].values()) == {403}, (role, found)
        if role == "node-a":
            assert set(found["right"].values()) == {200}, found

    home = run.tmp / "empty-home"  # no ~/.ray/auth_token to fall back on
    plain = {"PATH": os.environ["PATH"], "HOME": str(home), "RAY_TMPDIR": str(run.tmp / "ray-client")}
    ray = str(run.bin_dir / "ray")

    def submit(role: str, extra: dict) -> subprocess.CompletedProcess:
        argv = [ray, "job", "submit", f"--address={dashboard}", "--no-wait", "--", "true"]
        return subprocess.run(
            [*run.topo.exec(role), *argv], env={**plain, **extra}, capture_output=True, text=True, timeout=120
        )

    wrong_env = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(wrong)}
    for role in ("outsider", "node-a"):
        none, bad = submit(role, {}), submit(role, wrong_env)
        assert none.returncode != 0 and "Unauthorized: Missing authentication token" in none.stdout + none.stderr
        assert bad.returncode != 0 and "Forbidden: Invalid authentication token" in bad.stdout + bad.stderr
        run.outputs += [none.stdout, none.stderr, bad.stdout, bad.stderr]
    holder = subprocess.run(
        [*run.topo.exec("node-a"), ray, "job", "list", f"--address={dashboard}"],
        env={**plain, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(run.token_file)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert holder.returncode == 0, holder.stderr[-2000:]
    run.outputs += [holder.stdout, holder.stderr]

    connect = (
        "import sys, json, ray\n"
        "try:\n"
        "    ray.init(address=sys.argv[1], log_to_driver=False)\n"
        "    print(json.dumps(sorted(n['NodeManagerAddress'] for n in ray.nodes() if n['Alive'])))\n"
        "    ray.shutdown()\n"
        "except Exception as exc:\n"
        "    print('REFUSED', type(exc).__name__)\n"
    )
    gcs = head["ray_gcs"]
    jobs = [
        ("outsider", {}),
        ("node-a", {}),
        ("node-a", wrong_env),
        ("node-a", {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(run.token_file)}),
    ]
    with ThreadPoolExecutor(len(jobs)) as pool:
        results = list(
            pool.map(lambda job: run.python(job[0], connect, gcs, env={**plain, **job[1]}, timeout=180, ray=True), jobs)
        )
    for (role, extra), proc in zip(jobs[:3], results[:3], strict=True):
        assert "REFUSED" in proc.stdout, (role, extra, proc.stdout, proc.stderr[-1500:])
        assert re.search(r"Unauthenticated.*(missing or incorrect|InvalidAuthToken)", proc.stderr), proc.stderr[-1500:]
    assert json.loads(results[3].stdout.strip().splitlines()[-1]) == sorted([run.addr("node-a"), run.addr("node-b")])


@pytest.mark.parametrize("cluster_run", ["router-passthrough"], indirect=True)
def test_two_nodes_static_router(cluster_run):
    """Also: rank 0 alone gives up naming the silent node and leaves nothing; an engine of B without token fields
    fails the smoke, and the smoke says which node and engine."""
    run = cluster_run
    alone = run.cli("node-a", "up", "--profile", run.profile, "--wait-nodes", "3", timeout=UP_SECONDS)
    assert alone.returncode == 5, alone.stderr[-2000:]  # UNREACHABLE
    assert f"of node 1 ({run.addr('node-b')}) did not answer /health within 3 s" in alone.stderr
    assert "NODE_RANK=1" in alone.stderr
    assert not (run.run_dir("node-a") / "state.json").exists() and run.topo.pids("node-a") == []

    # This test drives the nodes through the Makefile (`make up/smoke/down RUNTIME=local`), the other through the CLI.
    a, b, seconds = _up(run, via_make=True)
    assert a.returncode == 0 and b.returncode == 0, (a.stderr[-3000:], b.stderr[-3000:])
    print(f"both `make up`s: {seconds:.1f} s")
    head = run.state("node-a")
    router = next(p for p in head["processes"] if p["role"] == "router")
    cmd = router["cmd"]
    listed = cmd[cmd.index("--worker-urls") + 1 : cmd.index("--worker-urls") + 5]
    b_engines = [f"http://{run.addr('node-b')}:{port}" for port in (30000, 30010)]
    assert listed[2:] == b_engines and cmd[cmd.index("--host") + 1] == run.addr("node-a")
    smoke = run.cli("node-a", "smoke", "--json")
    assert smoke.returncode == 0, smoke.stderr[-2000:]
    report = json.loads(smoke.stdout)
    assert [n["rank"] for n in report["per_node"] if n["trainable_tokens"] > 0 and not n["failed"]] == [0, 1]
    made = run.make("node-a", "smoke", RUNTIME="local")
    assert made.returncode == 0, made.stderr[-2000:]
    assert f"node 1 ({run.addr('node-b')})" in made.stdout + made.stderr

    broken = b_engines[1]
    fault = run.python(
        "node-a",
        "import sys, httpx; httpx.post(sys.argv[1] + '/_emulator/fault', json={'mode': 'no_extensions'},"
        " trust_env=False).raise_for_status()",
        broken,
    )
    assert fault.returncode == 0, fault.stderr
    smoke = run.cli("node-a", "smoke", "--json")
    assert smoke.returncode == 3, smoke.stderr[-2000:]  # TOKENS_MISSING
    report = json.loads(smoke.stdout)
    assert [n["failed"] for n in report["per_node"]] == [[], [broken]]
    row = next(r for r in report["per_engine"] if r["url"] == broken)
    assert row["code"] == "TOKENS_MISSING" and row["trainable_tokens"] == 0
    if not report["message"].startswith("zero trainable tokens"):  # the path's requests may miss that engine
        assert report["message"].startswith(f"node 1 ({run.addr('node-b')}), engine {broken}: zero trainable")
    made = run.make("node-a", "smoke", RUNTIME="local")
    assert made.returncode != 0 and "exit 3" in made.stderr, made.stderr[-2000:]  # the CLI's TOKENS_MISSING via make
    _check_down(run, via_make=True)
