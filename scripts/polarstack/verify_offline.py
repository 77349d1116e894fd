"""`make verify-offline`: prove the GPU-side command lines and pins without a GPU.

1. Every command line the stack renders, per profile (and per task for the training launch), is checked
   against the parser of the exact pinned release (polarstack.flags): the engines' `sglang.launch_server`
   (from the Compose model the real Compose v2 binary renders, plus ENGINE_EXTRA_ARGS), the router launch
   (Compose and local runtime) with the release's own parser, the trainer's `ray start`, and the training
   launch (`ray start`, `ray job submit`, `train_async.py`).
2. Every Python package the images pin resolves on the package index at that version for the image's
   Python and platform (`pip download --no-deps --only-binary=:all:`, cached).
3. One source: images/README.md names every pin, the recorded upstream option tables match the pins.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from polarstack import compose, exposure, flags, profiles
from polarstack.cache import cache_dir
from polarstack.errors import ExitCode, StackError
from polarstack.pins import pins, repo_root
from polarstack.sglang_protocol import source_dir
from polarstack.tasks import TASKS
from polarstack.train import build_plan, load_defaults


@dataclass
class Check:
    name: str
    ok: bool
    detail: str = ""
    problems: list[str] = field(default_factory=list)


def _compose_model(profile: profiles.Profile, tmp: Path) -> dict[str, Any]:
    import json

    binary = compose.bundled_compose()
    command = [str(binary)] if binary else compose.compose_command()
    proc = subprocess.run([*command, *compose.compose_args(profile, tmp), "config", "--format", "json"],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise StackError(f"Compose rejected profile {profile.name}: {proc.stderr.strip().splitlines()[-1:]}",
                         ExitCode.USAGE)
    return json.loads(proc.stdout)


def _after(tokens: list[str], marker: list[str]) -> list[str] | None:
    for i in range(len(tokens) - len(marker) + 1):
        if tokens[i:i + len(marker)] == marker:
            return tokens[i + len(marker):]
    return None


def check_profile(profile: profiles.Profile, tmp: Path) -> list[Check]:
    checks: list[Check] = []
    model = _compose_model(profile, tmp)
    sglang = flags.sglang_table()
    for name, svc in sorted(model["services"].items()):
        command = svc.get("command") or []
        label = f"profile {profile.name}, service {name}"
        if name.startswith("engine-"):
            extra = (svc.get("environment") or {}).get("ENGINE_EXTRA_ARGS") or ""
            tokens = (_after(command, ["-m", "sglang.launch_server"]) or []) + shlex.split(extra)
            problems = flags.check_tokens(tokens, sglang, command=label, program=flags.sglang_program())
            checks.append(Check(f"{label}: sglang.launch_server", not problems, f"{len(tokens)} tokens",
                                [p.sentence() for p in problems]))
        elif name == "trainer":
            table, program = flags.ray_table("ray start")
            problems = flags.check_tokens(_after(command, ["ray", "start"]) or [], table, command=label, program=program)
            checks.append(Check(f"{label}: ray start", not problems, "", [p.sentence() for p in problems]))
            problems = exposure.trainer_problems(svc.get("environment") or {}, label)
            checks.append(Check(f"{label}: Ray and slime listen on loopback only", not problems, "", problems))
        elif name == "router":
            env = svc.get("environment") or {}
            release = profile.router
            args = ["--host", "127.0.0.1", "--port", str(env.get("ROUTER_PORT"))]
            if env.get("ROUTER_WORKER_URLS"):
                args += ["--worker-urls", *env["ROUTER_WORKER_URLS"].split()]
            args += shlex.split(env.get("ROUTER_EXTRA_ARGS") or "")
            problems = flags.router_check(release, args, command=label)
            checks.append(Check(f"{label}: {release.module} ({release.spec})", not problems, "",
                                [p.sentence() for p in problems]))
    if profile.router is not None:  # the local runtime's launch of the same release
        release = profile.router
        urls = ["http://127.0.0.1:30000", "http://127.0.0.1:30010"] if profile.registration == "static" else []
        args = release.launch_args(30080, urls, 30081)[2:]  # drop "-m MODULE"
        problems = flags.router_check(release, args, command=f"profile {profile.name}, local runtime router")
        checks.append(Check(f"profile {profile.name}, local runtime: {release.spec}", not problems, "",
                            [p.sentence() for p in problems]))
    slime, slime_program = flags.slime_table()
    for task in TASKS:
        plan = build_plan(task, profile, run_id="verify", config=load_defaults())
        label = f"profile {profile.name}, make train TASK={task}"
        problems = flags.check_tokens(plan.train_args, slime, command=label, program=slime_program)
        ray_start, _, _, submit = plan.commands
        table, program = flags.ray_table("ray start")
        problems += flags.check_tokens(ray_start[2:], table, command=label, program=program)
        table, program = flags.ray_table("ray job submit")
        options = submit[3:submit.index("--")]
        problems += flags.check_tokens(options, table, command=label, program=program)
        checks.append(Check(f"{label}: train_async.py, ray start, ray job submit", not problems,
                            f"{len(plan.train_args)} train_async tokens", [p.sentence() for p in problems]))
        job_env = json.loads(next(a for a in submit if a.startswith("--runtime-env-json=")).split("=", 1)[1])
        exposed = exposure.trainer_problems(job_env.get("env_vars") or {}, f"{label} (Ray job)", plan.train_args)
        checks.append(Check(f"{label}: Ray and slime listen on loopback only", not exposed, "", exposed))
    return checks


def _python_of(tag: str) -> str:
    match = re.match(r"(\d+\.\d+)", tag)
    if not match:
        raise StackError(f"cannot tell the Python version of the image tag {tag!r} (PYTHON_IMAGE_TAG).", ExitCode.USAGE)
    return match.group(1)


def pin_requirements() -> list[tuple[str, str, str]]:
    """(requirement, python version, why) for every Python package an image pins."""
    table = pins()
    router_python = _python_of(table["PYTHON_IMAGE_TAG"])
    out = []
    for prefix in ("ROUTER_PASSTHROUGH", "ROUTER_PATCHED", "ROUTER_STOCK"):
        out.append((f"{table[prefix + '_PACKAGE']}=={table[prefix + '_VERSION']}", router_python, f"router image ({prefix})"))
    out.append((f"ray=={table['RAY_VERSION']}", router_python, "trainer image (RAY_VERSION)"))
    pyproject = (repo_root() / "pyproject.toml").read_text()
    rich = re.search(r'"(rich==[^"]+)"', pyproject)
    if rich:
        out.append((rich.group(1), router_python, "trainer image (rich, pyproject.toml)"))
    return out


def check_pin(requirement: str, python: str) -> tuple[bool, str]:
    target = cache_dir() / "pin-check"
    target.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check",
           "--quiet", "--python-version", python, "--implementation", "cp",
           "--platform", "manylinux_2_34_x86_64", "--platform", "manylinux2014_x86_64", "--platform", "any",
           "-d", str(target), requirement]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if proc.returncode == 0:
        return True, ""
    lines = [l for l in (proc.stderr or proc.stdout).strip().splitlines() if "WARNING" not in l]
    return False, (lines[-1] if lines else f"pip exit {proc.returncode}")


def check_pins(skip_downloads: bool = False) -> list[Check]:
    checks = []
    table = pins()
    try:
        source_dir()
        checks.append(Check(f"sglang=={table['SGLANG_VERSION']} (engine image, emulator)", True, "wheel resolved"))
    except StackError as exc:
        checks.append(Check(f"sglang=={table['SGLANG_VERSION']} (engine image, emulator)", False, "",
                            [f"sglang=={table['SGLANG_VERSION']} does not resolve on the package index: {exc.message}"]))
    for requirement, python, why in pin_requirements():
        if skip_downloads:
            continue
        ok, detail = check_pin(requirement, python)
        checks.append(Check(f"{requirement} for CPython {python} x86_64 ({why})", ok, detail,
                            [] if ok else [f"{requirement} ({why}) does not resolve on the package index for "
                                           f"CPython {python} x86_64: {detail}"]))
    readme = (repo_root() / "images" / "README.md").read_text()
    missing = [f"{k}={v}" for k, v in table.items() if v and v not in readme]
    checks.append(Check("images/README.md names every pin", not missing, "",
                        [f"images/README.md does not name {m}" for m in missing]))
    recorded = flags.recorded_versions()
    mismatch = []
    if recorded["slime_commit"] != table["SLIME_COMMIT"]:
        mismatch.append(f"configs/upstream/slime-flags.json was recorded at slime {recorded['slime_commit']}, "
                        f"not SLIME_COMMIT={table['SLIME_COMMIT']}; rerecord it")
    if recorded["ray_version"] != table["RAY_VERSION"]:
        mismatch.append(f"configs/upstream/ray-flags.json was recorded for ray {recorded['ray_version']}, not "
                        f"RAY_VERSION={table['RAY_VERSION']}; rerecord it")
    checks.append(Check("recorded upstream options match the pins", not mismatch, "", mismatch))
    return checks


def run(skip_downloads: bool = False, progress: Callable[[str], None] = lambda m: None) -> tuple[list[Check], float]:
    import tempfile

    started = time.perf_counter()
    checks: list[Check] = []
    progress("pins")
    checks += check_pins(skip_downloads)
    with tempfile.TemporaryDirectory(prefix="polarstack-verify-") as tmp:
        for name in profiles.available():
            progress(f"profile {name}")
            try:
                checks += check_profile(profiles.load(name), Path(tmp) / name)
            except StackError as exc:  # a profile that cannot even be rendered is a failed check, not a crash
                checks.append(Check(f"profile {name}", False, "", [exc.message]))
    return checks, time.perf_counter() - started


__all__ = ["run", "Check", "check_profile", "check_pins"]
