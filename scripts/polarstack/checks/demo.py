"""`polarstack demo` / `make demo`: every profile up locally in turn, smoke, a table, everything torn down.

Exits 0 only if the working profiles pass and the diagnostic stock-router profile fails for the expected
reason (TOKENS_MISSING naming both of Polar's request fields).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

from polarstack.checks import rehearsal_report
from polarstack.checks.smoke import run_smoke
from polarstack.polar.contract import POLAR_REQUEST_FLAGS
from polarstack.stack import local, profiles, real_sglang


def run_profile(
    name: str, directory: Path, progress: Callable[[str], None], engine: str = "emulator"
) -> dict[str, Any]:
    profile = profiles.load(name)
    release = profile.router
    row: dict[str, Any] = {
        "profile": name,
        "engine": engine,
        "role": profile.role,
        "router": release.spec if release else "none",
        "expected": profile.expect,
    }
    started = time.perf_counter()
    try:
        state = local.up(profile, directory=directory, progress=progress, engine=engine)
        row["up_seconds"] = round(time.perf_counter() - started, 3)
        # the real engine on a shared 2-core CPU answers a 16-token request in 0.1-7 s (measured): more headroom
        timeout = real_sglang.SMOKE_TIMEOUT if engine == "sglang" else 10.0
        report = run_smoke(
            state.base_url,
            route=profile.route,
            tool_fields=state.tool_fields,
            tool_unscripted=state.tool_unscripted,
            timeout=timeout,
        )
        row.update(
            verdict="pass" if report.ok else report.code.name,
            trainable_tokens=report.trainable_tokens,
            smoke_seconds=round(report.elapsed, 3),
            message=report.message,
            fields_missing=report.fields_missing,
            router_bypassed=report.resolution.bypassed,
            base_url=state.base_url,
        )
        if profile.expect == "pass":  # the part of the rehearsal's report the local runtime measures (issue 19)
            trainable = [e.polar["polar_trainable_tokens"] if e.polar else 0 for e in report.exchanges]
            row["rehearsal"] = [v.as_dict() for v in rehearsal_report.local_part(trainable, report.tool_check)]
    except Exception as exc:  # a profile that cannot come up is a row, not a crash
        row.update(verdict="ERROR", trainable_tokens=0, smoke_seconds=None, message=str(getattr(exc, "message", exc)))
    finally:
        local.down(directory=directory)  # shielded: a second Ctrl-C cannot interrupt it
    row["as_expected"] = _as_expected(row)
    return row


def _as_expected(row: dict[str, Any]) -> bool:
    if row["expected"] == "pass":
        return row["verdict"] == "pass" and row["trainable_tokens"] > 0
    if row["verdict"] != row["expected"]:
        return False
    if row["expected"] == "TOKENS_MISSING":
        return sorted(row.get("fields_missing", [])) == sorted(POLAR_REQUEST_FLAGS)
    return True


def run_demo(
    names: list[str] | None = None, progress: Callable[[str], None] = print, engine: str = "emulator"
) -> list[dict[str, Any]]:
    """Each profile's run state lives in <run dir>/demo/<profile>, not in a temporary folder: if the demo is
    killed before its teardown ends, `polarstack down` (`make down RUNTIME=local`) still finds what it left."""
    rows = []
    for name in names or list(profiles.PROFILE_ORDER):
        progress(f"demo: {name}")
        rows.append(run_profile(name, local.demo_dir() / name, progress, engine))
    return rows
