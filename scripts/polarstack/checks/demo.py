"""`polarstack demo` / `make demo`: every profile up locally in turn, smoke, a table, everything torn down.

The engines start once and only the router changes between profiles (`DemoRuntime`), with what carries over in
the engines reset before each profile (issue 27 point 5).

Exits 0 only if the working profiles pass and the diagnostic stock-router profile fails for the expected
reason (TOKENS_MISSING naming both of Polar's request fields).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Protocol

from polarstack.checks import rehearsal_report, tool_exchange
from polarstack.checks.smoke import run_smoke
from polarstack.checks.smoke_inputs import SmokeOptions, SmokeTarget
from polarstack.errors import ExitCode, StackError
from polarstack.polar.contract import POLAR_REQUEST_FLAGS
from polarstack.routers.harness import install
from polarstack.stack import local, profiles, real_sglang

ROUTER_STOP_SECONDS = 2.0


@dataclass
class ProfileUp:
    """What the smoke needs of a profile a demo runtime brought up."""

    base_url: str
    tool_fields: dict[str, Any] | None = None  # the real engine's scripted tool answer (local.LocalState.tool_fields)
    tool_unscripted: str | None = None  # why that script cannot reach the engines through this router


class DemoRuntime(Protocol):
    """How `make demo` drives a runtime. The profiles differ in their router, not their engines: the engines start
    once (as many as the profiles need at most), and each profile starts and stops only its router in front of
    the first `engine_count` of them, after `reset` cleared what the previous profile left in them. The local
    runtime is `LocalDemo`; another runtime (Docker) implements the same five calls."""

    def start_engines(self, profiles: list[profiles.Profile]) -> None:
        """Start the shared engines once; raises (a StackError) when they cannot start."""

    def reset(self) -> list[str]:
        """Clear what carries over between profiles (prefix/radix caches, request logs, registrations); what is
        still left afterwards, one phrase each: a profile never runs on a dirty slate."""

    def up(self, profile: profiles.Profile) -> ProfileUp:
        """Start `profile`'s router (if it has one) in front of the shared engines."""

    def down(self) -> None:
        """Stop what `up` started (the router), never the shared engines; shielded against Ctrl-C."""

    def stop_engines(self) -> None:
        """Stop the shared engines; shielded against Ctrl-C."""


class LocalDemo:
    """The local runtime's demo: shared engines in <run dir>/demo/engines, each profile's router in
    <run dir>/demo/<profile>: if the demo is killed before its teardown ends, `polarstack down`
    (`make down RUNTIME=local`) still finds both."""

    def __init__(self, engine: str = "emulator", progress: Callable[[str], None] = print) -> None:
        self.engine = engine
        self.progress = progress
        self.shared: local.LocalState | None = None
        self.directory: Path | None = None
        self.state: local.LocalState | None = None

    def start_engines(self, wanted: list[profiles.Profile]) -> None:
        for profile in wanted:  # before any engine starts: a cold router install can take seconds
            if profile.router is not None:
                install(profile.router)
        count = max(profile.engine_count for profile in wanted)
        self.shared = local.start_engines(
            wanted[0], count, directory=local.demo_dir() / "engines", engine=self.engine, progress=self.progress
        )

    def reset(self) -> list[str]:
        assert self.shared is not None, "start_engines first"
        return local.reset_engines(self.shared)

    def up(self, profile: profiles.Profile) -> ProfileUp:
        assert self.shared is not None, "start_engines first"
        self.directory = local.demo_dir() / profile.name
        self.state = local.up(
            profile, directory=self.directory, progress=self.progress, engine=self.engine, shared=self.shared
        )
        stale = local.stale_registrations(self.state, profile)
        if stale:
            raise StackError(
                f"the router of profile {profile.name} lists workers it was not given: {', '.join(stale)}.",
                ExitCode.STATE,
            )
        return ProfileUp(self.state.base_url, self.state.tool_fields, self.state.tool_unscripted)

    def down(self) -> None:
        if self.directory is not None:
            # shielded: a second Ctrl-C cannot interrupt it; the smoke has ended, so a router still draining is
            # killed after ROUTER_STOP_SECONDS (smg drains for about 5 s on SIGTERM)
            local.down(directory=self.directory, router_timeout=ROUTER_STOP_SECONDS)
        self.directory = self.state = None

    def stop_engines(self) -> None:
        local.down(directory=local.demo_dir() / "engines")
        self.shared = None


def run_profile(
    profile: profiles.Profile, runtime: DemoRuntime, progress: Callable[[str], None], engine: str = "emulator"
) -> dict[str, Any]:
    release = profile.router
    row: dict[str, Any] = {
        "profile": profile.name,
        "engine": engine,
        "role": profile.role,
        "router": release.spec if release else "none",
        "expected": profile.expect,
    }
    started = time.perf_counter()
    try:
        left = runtime.reset()  # nothing of the previous profile's traffic may reach this one's smoke
        if left:
            raise StackError(f"state carried over from the previous profile: {'; '.join(left)}.", ExitCode.STATE)
        stack = runtime.up(profile)
        row["up_seconds"] = round(time.perf_counter() - started, 3)
        # the real engine on a shared 2-core CPU answers a 16-token request in 0.1-7 s (measured): more headroom
        knobs = tool_exchange.knobs_from(profile.settings)  # the smoke's knobs, as the profile was loaded
        options = (
            SmokeOptions(timeout=real_sglang.SMOKE_TIMEOUT, knobs=knobs)
            if engine == "sglang"
            else SmokeOptions(knobs=knobs)
        )
        target = SmokeTarget(
            stack.base_url, route=profile.route, tool_fields=stack.tool_fields, tool_unscripted=stack.tool_unscripted
        )
        report = run_smoke(target, options)
        row.update(
            verdict="pass" if report.ok else report.code.name,
            trainable_tokens=report.trainable_tokens,
            smoke_seconds=round(report.elapsed, 3),
            message=report.message,
            fields_missing=report.fields_missing,
            router_bypassed=report.resolution.bypassed,
            base_url=stack.base_url,
        )
        if profile.expect == "pass":  # the part of the rehearsal's report the local runtime measures (issue 19)
            trainable = [e.polar["polar_trainable_tokens"] if e.polar else 0 for e in report.exchanges]
            row["rehearsal"] = [v.as_dict() for v in rehearsal_report.local_part(trainable, report.tool_check)]
    except Exception as exc:  # a profile that cannot come up is a row, not a crash
        row.update(verdict="ERROR", trainable_tokens=0, smoke_seconds=None, message=str(getattr(exc, "message", exc)))
    finally:
        runtime.down()
    row["as_expected"] = row_as_expected(row)
    return row


def row_as_expected(row: dict[str, Any]) -> bool:
    if row["expected"] == "pass":
        return row["verdict"] == "pass" and row["trainable_tokens"] > 0
    if row["verdict"] != row["expected"]:
        return False
    if row["expected"] == "TOKENS_MISSING":
        return sorted(row.get("fields_missing", [])) == sorted(POLAR_REQUEST_FLAGS)
    return True


def run_demo(
    names: list[str] | None = None,
    progress: Callable[[str], None] = print,
    engine: str = "emulator",
    runtime: DemoRuntime | None = None,
) -> list[dict[str, Any]]:
    """Every profile in turn on one set of engines (`DemoRuntime`); a row per profile. Engines that cannot start
    make every row an ERROR naming why."""
    wanted = [profiles.load(name) for name in names or list(profiles.PROFILE_ORDER)]
    runtime = runtime or LocalDemo(engine, progress)
    rows = []
    try:
        try:
            runtime.start_engines(wanted)
        except Exception as exc:
            message = f"the shared engines did not start: {getattr(exc, 'message', exc)}"
            for profile in wanted:
                row = {"profile": profile.name, "engine": engine, "role": profile.role, "expected": profile.expect}
                row.update(router=profile.router.spec if profile.router else "none", verdict="ERROR")
                row.update(trainable_tokens=0, smoke_seconds=None, message=message)
                rows.append({**row, "as_expected": False})
            return rows
        for profile in wanted:
            progress(f"demo: {profile.name}")
            rows.append(run_profile(profile, runtime, progress, engine))
        return rows
    finally:
        runtime.stop_engines()
