"""What a command resolved once about where it runs, as the layers below the CLI see it (issue 35 point 1).

`Resolved` is the shape: the device, the cluster layout, the local runtime's run state and the docker runtime's
record. The CLI's site (polarstack.cli.site.Site) is the one built for every command, each field read at most once,
when first asked; the modules below take it from their caller instead of reading the environment, configs/cluster.env
or the run state themselves. `read_now()` is the stated fallback for callers that run without a CLI around them (the
tests of one module, scripts/tools): the same reads, each done when asked; in the package it is only the default of a
`site` its product callers always pass (tests/static/test_site_reads.py). `reread(site)` is for a caller whose own
command changed the run states (the rehearsal's `up`, the docker demo's own project): the site's device and cluster,
the run states read again.
"""

from __future__ import annotations

import functools
from typing import Any, Protocol

from polarstack.stack import cluster as cluster_mod
from polarstack.stack import device, docker_state, local
from polarstack.stack.cluster import Cluster
from polarstack.stack.compose import Where
from polarstack.stack.local import LocalState


class Resolved(Where, Protocol):
    """Where a command runs: also a polarstack.stack.compose.Where, so it is handed to Compose as it is."""

    @property
    def cpu(self) -> bool:
        """DEVICE=cpu: the docker runtime's CPU stack (polarstack.stack.device)."""
        ...

    @property
    def cluster(self) -> Cluster:
        """configs/cluster.env and the environment: one node unless NODES>1 (polarstack.stack.cluster)."""
        ...

    @property
    def local_state(self) -> LocalState | None:
        """The local runtime's run state (`polarstack up`), None when nothing is recorded."""
        ...

    @property
    def docker_record(self) -> dict[str, Any] | None:
        """The docker runtime's record of `make up` on this device, None when nothing is recorded."""
        ...


class ReadOnce:
    """The three reads of where a command runs that cost a file or the environment, each done when first asked and
    at most once per object: the cluster, the local runtime's run state and the docker runtime's record. The CLI's
    site (polarstack.cli.site.Site) and read_now() both have them from here, so they read alike."""

    @functools.cached_property
    def cluster(self) -> Cluster:
        """configs/cluster.env and the environment (polarstack.stack.cluster): one node unless NODES>1."""
        return cluster_mod.load()

    @functools.cached_property
    def local_state(self) -> LocalState | None:
        return local.read_state()

    cpu: bool  # the device: the site's field, read_now()'s read

    @functools.cached_property
    def docker_record(self) -> dict[str, Any] | None:
        """The docker runtime's record of `make up` on this device (`cpu`; polarstack.stack.docker_state)."""
        return docker_state.read(cpu=self.cpu)


class _ReadNow(ReadOnce):
    """Resolved without a CLI: the device too, read when first asked (read_now)."""

    @functools.cached_property
    def cpu(self) -> bool:
        return device.current() == "cpu"


def read_now() -> Resolved:
    """The fallback for a caller without a site (module docstring)."""
    return _ReadNow()


class _Reread(ReadOnce):
    """Resolved with the device and the cluster given, the run states read when first asked (reread)."""

    def __init__(self, cpu: bool, cluster: Cluster) -> None:
        self.cpu = cpu
        self.cluster = cluster  # the caller's: ReadOnce.cluster is not read


def reread(site: Resolved, *, cpu: bool | None = None) -> Resolved:
    """The run states as they are now, for a caller whose command changed them since the site read them: the
    device (`cpu`, else the site's) and the cluster of the caller's `site`."""
    return _Reread(site.cpu if cpu is None else cpu, site.cluster)
