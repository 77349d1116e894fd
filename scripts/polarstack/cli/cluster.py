"""`polarstack cluster`: the nodes of a NODES > 1 stack (`make cluster-check`; docs/multi-node.md).

- `cluster check [--json]`: every node's report, pins, Ray membership, ports, clock, GPUs and memory
  (polarstack.checks.nodes), against what `make train` would need per node (polarstack.train.memory);
- `cluster report`: write this node's report to SHARED_DIR/nodes/ (`make up` does it on every node).
What `make up` adds at NODES>1 (the reports, the session, the check once every node is up) is
polarstack.train.cluster_up, run by the docker runtime's `up` (polarstack.stack.runtime).
"""

from __future__ import annotations

import argparse
import sys

from polarstack.checks import nodes
from polarstack.cli.render import print_json
from polarstack.errors import ExitCode, StackError
from polarstack.train import cluster_up


def _add_cluster(sub) -> None:
    p = sub.add_parser("cluster", help="the nodes of a NODES>1 stack: check them all, or write this node's report")
    p.add_argument("action", choices=("check", "report"), help="check: every node (run on any node); report: this one")
    p.add_argument("--profile", default=None, help="profile (default: the one `make up` started, else engine-direct)")
    p.add_argument("--json", action="store_true", help="print the check as JSON")
    p.set_defaults(handler=_cmd_cluster)


def _cmd_cluster(args: argparse.Namespace) -> int:
    found, profile = args.site.cluster, args.site.profile
    if args.action == "report":
        path = cluster_up.write_report(profile, args.site)
        print(f"node {found.rank} ({found.addr}): report written to {path}", file=sys.stderr)
        return 0
    if args.json:
        report = cluster_up.run_check(profile, found)
        print_json(report.as_dict())
        if not report.ok:
            raise StackError(report.message, ExitCode(report.code))
        return 0
    render_cluster_check(cluster_up.check_cluster(profile, found))
    return 0


def render_cluster_check(report: nodes.ClusterReport) -> None:
    for row in report.rows:
        skew = "" if row.clock_skew_seconds is None else f", clock {row.clock_skew_seconds:+.1f} s"
        ports = f", ports {' '.join(row.ports)}" if row.ports else ""
        print(
            f"node {row.rank} ({row.addr}): report {row.report}, Ray {row.ray or '-'}{ports}{skew}, {row.gpus or '-'}"
        )
    print(f"cluster: {report.message} (clock bound {nodes.CLOCK_BOUND_SECONDS:g} s)")


def add_commands(sub) -> None:
    """This module's subcommands, in the order `polarstack --help` lists them."""
    _add_cluster(sub)
