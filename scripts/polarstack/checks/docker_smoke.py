"""`make smoke` on the docker runtime: the smoke runs inside the trainer container, where the pinned Polar is installed.

The host's .venv has no `polar`, so a host smoke never got the second opinion of scripts/polarstack/polar/opinion.py
(Polar's own functions on the smoke's raw answers, issue 11 point 6). The trainer shares the host network
(compose.yaml: network_mode host) and is the process whose Polar will call the inference path, so the host runs
`compose exec -T trainer polarstack smoke --in-trainer --json ...` with the user's arguments, and reports the
trainer's JSON and exit code as its own. docs/polar-verdict.md ("The smoke on the docker runtime") says why this
was chosen over re-checking the host's answers inside the trainer.

Inside the trainer (`--in-trainer`) the smoke refuses unless Polar is importable (so the second opinion cannot be
skipped silently) and unless the trainer's environment, rendered by `make up`, names the profile and base URL the
image's profile file gives (a stale image would check other ports).
"""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from polarstack import paths
from polarstack.checks.smoke_inputs import SmokeOptions
from polarstack.errors import ExitCode, StackError
from polarstack.polar import opinion as polar_opinion
from polarstack.stack import device, real_sglang
from polarstack.stack.runtime import DockerRuntime

TRAINER_SMOKE_DIR = "smoke"  # under .run/train (mounted at train.TRAINER_RUN_DIR): the --polar-config handed over


def trainer_command(
    options: SmokeOptions, profile_name: str, route: str | None = None, record: dict[str, Any] | None = None
) -> list[str]:
    """The `polarstack smoke` command line run inside the trainer: the same options (SmokeOptions.to_argv, the Polar
    config handed over), the profile made explicit, `route` the caller's --route (None: the profile's); `record`: the
    record of `make up` (DEVICE=cpu's carries the real engines' scripted tool answer, handed over too)."""
    cmd = ["polarstack", "smoke", "--in-trainer", "--json", "--runtime", "docker", "--profile", profile_name]
    if route:
        cmd += ["--route", route]
    if options.polar_config:
        options = replace(options, polar_config=_hand_over(options.polar_config))
    cmd += options.to_argv()
    record = record or {}
    if record.get("tool_fields"):  # DEVICE=cpu: real engines, the scripted tool answer `make up` recorded
        target = paths.train_run_dir() / TRAINER_SMOKE_DIR / "tool_fields.json"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(record["tool_fields"]))
        cmd += ["--tool-fields", f"{paths.TRAINER_RUN_DIR}/{TRAINER_SMOKE_DIR}/tool_fields.json"]
    if record.get("tool_unscripted"):
        cmd += ["--tool-unscripted", record["tool_unscripted"]]
    return cmd


def real_engine_options(
    in_trainer: bool, tool_fields: str | None, tool_unscripted: str | None, record: dict[str, Any] | None = None
) -> dict[str, Any]:
    """DEVICE=cpu: the smoke's options for real engines (the scripted tool answer and the real engine's timeout),
    from the record of `make up` on the host (`record`), or inside the trainer (`in_trainer`) from what the host
    handed over (--tool-fields, the path of the script's JSON file, and --tool-unscripted); {} elsewhere."""
    if in_trainer:
        if not tool_fields:
            return {}
        try:
            fields = json.loads(Path(tool_fields).read_text())
        except (OSError, ValueError):
            raise StackError(
                f"--tool-fields {tool_fields} is not a readable JSON file; rerun `make smoke` on the host.",
                ExitCode.USAGE,
            ) from None
        return {"tool_fields": fields, "tool_unscripted": tool_unscripted, "timeout": real_sglang.SMOKE_TIMEOUT}
    if not (record or {}).get("tool_fields"):
        return {}
    return {"timeout": real_sglang.SMOKE_TIMEOUT}


def _hand_over(path: str) -> str:
    """Copy the host's Polar config into .run/train/smoke/ and return its path inside the trainer."""
    target = paths.train_run_dir() / TRAINER_SMOKE_DIR / "polar_config.yaml"
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        shutil.copyfile(path, target)
    except OSError as exc:
        raise StackError(
            f"--polar-config {path} cannot be read ({exc.strerror}); pass a readable Polar config "
            "(e.g. a rendered polar_config.yaml).",
            ExitCode.USAGE,
        ) from None
    return f"{paths.TRAINER_RUN_DIR}/{TRAINER_SMOKE_DIR}/polar_config.yaml"


def run_in_trainer(
    options: SmokeOptions,
    profile,
    runtime: DockerRuntime,
    route: str | None = None,
    record: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Run the smoke inside `profile`'s trainer (trainer_command) through the docker `runtime`; its report (a dict),
    or a StackError with the trainer's code. `record`: the record of `make up` (trainer_command)."""

    command = trainer_command(options, profile.name, route, record)
    proc = runtime.run_in_trainer(profile, command, capture=True)
    report = None
    try:
        report = json.loads(proc.stdout) if proc.stdout.strip() else None
    except ValueError:
        pass
    codes = {int(c) for c in ExitCode}
    if (
        isinstance(report, dict)
        and report.get("verdict") in ("pass", "fail")
        and report.get("exit_code") in codes
        and isinstance(report.get("message"), str)
    ):
        if runtime.cpu:  # named, in the report and on stderr: the CPU trainer has no Polar
            report["skipped"] = [device.SKIPPED_ON_CPU["polar"]]
            print(f"polarstack: skipped: {device.SKIPPED_ON_CPU['polar']}", file=sys.stderr)
        return report
    lines = [line for line in (proc.stderr or "").splitlines() if line.strip()]
    said = lines[-1].removeprefix("polarstack: ").strip() if lines else ""
    if proc.returncode in codes - {0, 1} and said:
        raise StackError(f"inside the trainer: {said}", ExitCode(proc.returncode))
    raise StackError(
        f"the smoke inside the trainer of profile {profile.name} ended with exit {proc.returncode} and no "
        f"report ({said or 'no message'}); see `make logs SERVICE=trainer{' DEVICE=cpu' if runtime.cpu else ''}`.",
        ExitCode.ENVIRONMENT,
    )


def check_inside_trainer(profile, cpu: bool, environment: Mapping[str, str]) -> None:
    """--in-trainer: Polar importable, and the trainer's rendered environment (`environment`: the CLI's, the one
    `make up` gave the trainer) agrees with the image's profile file. `cpu`: DEVICE=cpu (the trainer's environment
    says so, compose.cpu.yaml), whose trainer has no Polar."""

    if not polar_opinion.available() and cpu:  # the CPU trainer has no Polar (GitHub only): say so
        print(f"polarstack: skipped: {device.SKIPPED_ON_CPU['polar']}", file=sys.stderr)
    elif not polar_opinion.available():
        raise StackError(
            "the smoke runs inside the trainer for the installed Polar's second opinion, and `polar` is "
            "not importable here; rebuild the trainer image with `make build`.",
            ExitCode.ENVIRONMENT,
        )
    rendered = {"PROFILE_NAME": profile.name, "SGLANG_ROUTER_BASE_URL": profile.base_url()}
    differs = [
        f"{key}={environment[key]} (the image's profile says {value})"
        for key, value in rendered.items()
        if environment.get(key) not in (None, value)
    ]
    if differs:
        raise StackError(
            f"the trainer was started with {', '.join(differs)}; the image's configs/profiles/"
            f"{profile.name}.env is stale: run `make build PROFILE={profile.name}` and `make up "
            f"PROFILE={profile.name}`.",
            ExitCode.STATE,
        )
