"""The verifier's limits, outcomes and isolation modes: the plain data every part of polarstack.reward.verifier shares."""

from __future__ import annotations

import os
from dataclasses import dataclass

VERIFIER_UID_BASE = 61000  # slots 61000..61999: unused by Debian's system and regular users
SLOTS = 1000
DEFAULT_TIMEOUT = 10.0
DEFAULT_MEMORY_MB = 1024
DEFAULT_NPROC = 32
ISOLATION_ENV = "POLARSTACK_VERIFIER_ISOLATION"
ISOLATION_MODES = ("namespaces", "none")
_GRACE = 2.0  # seconds allowed for tearing a sandbox down after its deadline


class IsolationUnavailable(RuntimeError):
    """The sandbox's namespaces could not be set up here; verifying without them needs an explicit opt-out."""


@dataclass
class Limits:
    timeout: float = DEFAULT_TIMEOUT  # wall clock, seconds
    cpu_seconds: int = 10  # the sandbox's CPU time in total (and each process's RLIMIT_CPU)
    memory_mb: int = DEFAULT_MEMORY_MB  # the sandbox's memory in total, its tmpfs included (and each RLIMIT_AS)
    nproc: int = DEFAULT_NPROC  # the sandbox's processes in total
    file_size_mb: int = 16
    open_files: int = 64
    isolation: str | None = None  # "namespaces" or "none"; None: $POLARSTACK_VERIFIER_ISOLATION, else namespaces


@dataclass
class Outcome:
    """A verification: passed only on the judge's authenticated report."""

    passed: bool
    reason: str  # "passed", "failed", "timeout", "error"
    seconds: float
    detail: str = ""
    stderr_tail: str = ""
    calls: int = 0
    checks: int = 0
    limits: str = ""  # which mechanism bounded the sandbox's total (cgroup v2, or the supervisor's watchdog)

    @property
    def reward(self) -> float:
        return 1.0 if self.passed else 0.0


@dataclass
class Run:
    """A raw program's run in the sandbox (for probing the sandbox itself; never a reward)."""

    returncode: int | None
    timed_out: bool
    seconds: float
    stderr_tail: str = ""
    limits: str = ""  # which mechanism bounded the sandbox's total


def isolation_mode(value: str | None = None) -> str:
    mode = (value or os.environ.get(ISOLATION_ENV) or "namespaces").strip().lower()
    if mode not in ISOLATION_MODES:
        raise ValueError(f"unknown verifier isolation {mode!r}; use one of {', '.join(ISOLATION_MODES)}")
    return mode
