"""`polarstack cluster`: the nodes of a NODES > 1 stack (`make cluster-check`; docs/multi-node.md).

- `cluster check [--json]`: every node's report, pins, Ray membership, ports, clock, GPUs and memory
  (polarstack.checks.nodes), against what `make train` would need per node (polarstack.train.memory);
- `cluster report`: write this node's report to SHARED_DIR/nodes/ (`make up` does it on every node).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from polarstack.checks import nodes
from polarstack.cli.render import print_json
from polarstack.errors import ExitCode, StackError
from polarstack.paths import load_defaults
from polarstack.stack import cluster, compose, docker_state, profiles, ray_auth
from polarstack.train import cluster_plan, memory
from polarstack.train.plan import ray_dashboard_port


def _add_cluster(sub) -> None:
    p = sub.add_parser("cluster", help="the nodes of a NODES>1 stack: check them all, or write this node's report")
    p.add_argument("action", choices=("check", "report"), help="check: every node (run on any node); report: this one")
    p.add_argument("--profile", default=None, help="profile (default: the one `make up` started, else engine-direct)")
    p.add_argument("--json", action="store_true", help="print the check as JSON")
    p.set_defaults(handler=_cmd_cluster)


def need_for(profile: profiles.Profile, nodes_count: int) -> nodes.Need:
    """What each node must hold for the run `make train` would launch (configs/train/defaults.yaml), per node."""
    return cluster_plan.node_need(profile, memory.check_up(profile, nodes=nodes_count))


def check_cluster(profile: profiles.Profile, found: cluster.Cluster) -> nodes.ClusterReport:
    port = ray_dashboard_port(profile, load_defaults())
    return nodes.check(found, profile, need=need_for(profile, found.nodes), dashboard_port=port)


def _cmd_cluster(args: argparse.Namespace) -> int:
    found = cluster.load()
    profile = profiles.load(docker_state.profile_name(args.profile))
    if args.action == "report":
        if not found.multi:
            raise StackError("NODES=1: a single node writes no node report (configs/cluster.env).", ExitCode.USAGE)
        path = nodes.write_report(found, profile, compose.render_values(profile, found))
        print(f"node {found.rank} ({found.addr}): report written to {path}", file=sys.stderr)
        return 0
    if args.json:
        report = nodes.run(
            found,
            profile,
            need=need_for(profile, found.nodes),
            dashboard_port=ray_dashboard_port(profile, load_defaults()),
        )
        print_json(report.as_dict())
        if not report.ok:
            raise StackError(report.message, ExitCode(report.code))
        return 0
    report = check_cluster(profile, found)
    render_cluster_check(report)
    return 0


def render_cluster_check(report: nodes.ClusterReport) -> None:
    for row in report.rows:
        skew = "" if row.clock_skew_seconds is None else f", clock {row.clock_skew_seconds:+.1f} s"
        ports = f", ports {' '.join(row.ports)}" if row.ports else ""
        print(
            f"node {row.rank} ({row.addr}): report {row.report}, Ray {row.ray or '-'}{ports}{skew}, {row.gpus or '-'}"
        )
    print(f"cluster: {report.message} (clock bound {nodes.CLOCK_BOUND_SECONDS:g} s)")


# --- `make up` at NODES > 1 -------------------------------------------------------------------------------------


def before_up(found: cluster.Cluster) -> None:
    """Before this node's `make up`: CLUSTER_IFACE holds this node's address (nothing else is bound), Ray's token file
    is in place (the head writes it, every other node must have a copy), SHARED_DIR is there and writable."""
    found.bind_host()  # ENVIRONMENT: the interface is missing or does not hold NODE_ADDRS[NODE_RANK]
    path = ray_auth.token_path(found.token_file or None)
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


def open_session(profile: profiles.Profile, found: cluster.Cluster) -> None:
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


def after_up(profile: profiles.Profile, found: cluster.Cluster) -> None:
    """After this node's `make up`: its report; once every node's report of the head's session is in, the check."""
    path = nodes.write_report(found, profile, compose.render_values(profile, found))
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
    render_cluster_check(check_cluster(profile, found))


def add_commands(sub) -> None:
    """This module's subcommands, in the order `polarstack --help` lists them."""
    _add_cluster(sub)
