"""`make up` at NODES > 1 on each node, and `make cluster-check` (docs/multi-node.md): the steps the docker runtime's
`up` runs around its own (polarstack.stack.runtime.DockerRuntime.up, through `NodeSteps`), and the cluster check.

- before anything starts: this node's address on CLUSTER_IFACE, Ray's token file, SHARED_DIR there and writable;
- once every check passed, on the head: the session every node's report of this bring-up carries;
- after this node's `up`: its report; once every node's report is in, the check of every node (checks.nodes) against
  what `make train` would need per node (train.memory).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from polarstack.checks import nodes
from polarstack.errors import ExitCode, StackError
from polarstack.paths import load_defaults
from polarstack.stack import compose, profiles, ray_auth
from polarstack.stack.cluster import Cluster
from polarstack.train import cluster_plan, memory
from polarstack.train.plan import ray_dashboard_port


def need_for(profile: profiles.Profile, nodes_count: int) -> nodes.Need:
    """What each node must hold for the run `make train` would launch (configs/train/defaults.yaml), per node."""
    return cluster_plan.node_need(profile, memory.check_up(profile, nodes=nodes_count))


def check_cluster(profile: profiles.Profile, found: Cluster) -> nodes.ClusterReport:
    port = ray_dashboard_port(profile, load_defaults())
    return nodes.check(found, profile, need=need_for(profile, found.nodes), dashboard_port=port)


def run_check(profile: profiles.Profile, found: Cluster) -> nodes.ClusterReport:
    """`make cluster-check --json`: the check, its report whatever it found (check_cluster raises on a failure)."""
    return nodes.run(
        found,
        profile,
        need=need_for(profile, found.nodes),
        dashboard_port=ray_dashboard_port(profile, load_defaults()),
    )


def write_report(profile: profiles.Profile, where: compose.Where) -> Path:
    """This node's report into SHARED_DIR/nodes/ (`polarstack cluster report`); USAGE on one node. `where`: the site's
    cluster and device."""
    found = where.cluster
    if not found.multi:
        raise StackError("NODES=1: a single node writes no node report (configs/cluster.env).", ExitCode.USAGE)
    return nodes.write_report(found, profile, compose.render_values(profile, found, cpu=where.cpu), cpu=where.cpu)


def before_up(found: Cluster) -> None:
    """Before this node's `make up`: CLUSTER_IFACE holds this node's address (nothing else is bound), Ray's token file
    is in place (the head writes it, every other node must have a copy), SHARED_DIR is there and writable."""
    found.bind_host()  # ENVIRONMENT: the interface is missing or does not hold NODE_ADDRS[NODE_RANK]
    path = ray_auth.token_path(found.token_file)
    ray_auth.prepare(path, head=found.head)
    shared = Path(cluster_plan.shared_dir(found, "the node reports, the weight sync and the checkpoints"))
    if not shared.is_dir():
        raise StackError(
            f"SHARED_DIR={shared} is not a directory on this node: mount the shared filesystem there (the same path "
            "on every node) before `make up`.",
            ExitCode.ENVIRONMENT,
        )
    probe = shared / nodes.REPORTS
    try:
        probe.mkdir(exist_ok=True)
        (probe / f".write-test-{found.rank}").write_text("ok\n")
        (probe / f".write-test-{found.rank}").unlink()
    except OSError as exc:
        raise StackError(
            f"SHARED_DIR={shared} is not writable here ({exc.strerror}): the trainer and the node report write to it.",
            ExitCode.ENVIRONMENT,
        ) from None


def open_session(profile: profiles.Profile, found: Cluster) -> None:
    """The head, once every check of its `make up` passed and before it starts anything: the session every node's report
    of this bring-up carries (a node whose `make up` ends first reports into it). With a static worker list the head's
    router, and so this `make up`, waits for the other nodes' engines: say so now."""
    if not found.head:
        return
    nodes.start_session(found)
    if profile.router is not None and profile.registration == "static":
        others = ", ".join(f"node {r} ({found.addrs[r]})" for r in range(1, found.nodes))
        print(
            f"cluster: the router lists every node's engines and opens only once they answer: run `make up "
            f"PROFILE={profile.name}` on {others} now (with its NODE_RANK); this waits up to ENGINE_START_PERIOD.",
            file=sys.stderr,
        )


def after_up(profile: profiles.Profile, where: compose.Where, show: Callable[[nodes.ClusterReport], None]) -> None:
    """After this node's `make up`: its report; once every node's report of the head's session is in, the check,
    handed to `show` (the CLI renders it). `where`: the docker runtime's cluster and device (the site's)."""
    found, cpu = where.cluster, where.cpu
    path = nodes.write_report(found, profile, compose.render_values(profile, found, cpu=cpu), cpu=cpu)
    print(f"node {found.rank} ({found.addr}): report in {path}", file=sys.stderr)
    waiting = nodes.pending(found)
    if waiting:
        names = ", ".join(f"node {r} ({found.addrs[r]})" for r in waiting)
        print(
            f"cluster: waiting for `make up` on {names}; the last node's `make up` runs the cluster check "
            "(or run `make cluster-check`).",
            file=sys.stderr,
        )
        return
    show(check_cluster(profile, found))


@dataclass(frozen=True)
class NodeSteps:
    """The steps above as polarstack.stack.runtime.NodeSteps: what DockerRuntime.up calls at NODES>1."""

    show: Callable[[nodes.ClusterReport], None]  # how the cluster check is shown (cli.cluster.render_cluster_check)

    def before_up(self, found: Cluster) -> None:
        before_up(found)

    def open_session(self, profile: profiles.Profile, found: Cluster) -> None:
        open_session(profile, found)

    def after_up(self, profile: profiles.Profile, where: compose.Where) -> None:
        after_up(profile, where, self.show)
