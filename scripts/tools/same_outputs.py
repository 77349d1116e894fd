"""Whether two revisions print the same verdicts and plans: `python scripts/tools/same_outputs.py REV_A REV_B`.

The check a behaviour-preserving restructure answers to (issue 35's acceptance): `make train TASK=humaneval DRY_RUN=1`
for each working profile, `make demo` (the emulator) and, with --docker, `make demo RUNTIME=docker` print the same
verdicts and plans at both revisions, run ids, ports and times aside.

Each revision is checked out in a temporary `git worktree --detach` and run with this interpreter (the project's venv)
and PYTHONPATH set to that checkout's scripts/, so the installed package never decides which code runs; the worktrees
are removed afterwards. Each command runs with `--json`; the JSON is normalized (a run id's timestamp, a port, a
duration, an emulator's token count become placeholders; see `normalize`) and compared. It prints one line per
command and, for a difference, the first differing lines; it exits 0 when every command matches, 1 otherwise.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

PROFILES = ("engine-direct", "router-passthrough", "patched-router")
RUN_ID = re.compile(r"(\d{8}T\d{6})")  # humaneval-engine-direct-20261207T230736
LOOPBACK_PORT = re.compile(r"(127\.0\.0\.1|localhost):\d+")
# Keys whose values differ between two runs of the same code: in a plan, none (its run id and checkout are replaced
# in the text); in a demo, durations, ports, pids and the emulator's sampled token counts.
PLAN_VOLATILE = re.compile(r"^$")
DEMO_VOLATILE = re.compile(r"(seconds|_s|_ms|elapsed|duration|time|port|ports|pid|pids|tokens|latency)$")
DEMO_COUNT = re.compile(r"\b\d+ (trainable tokens|tokens)\b")


def normalize(value: object, volatile: re.Pattern[str], checkout: Path) -> object:
    """`value` with what differs between two runs of the same code replaced by placeholders: keys matching `volatile`,
    a run id's timestamp, a loopback port in a URL, and the checkout's own path."""
    if isinstance(value, dict):
        return {
            key: "<volatile>" if volatile.search(str(key)) else normalize(item, volatile, checkout)
            for key, item in value.items()
        }
    if isinstance(value, list):
        return [normalize(item, volatile, checkout) for item in value]
    if isinstance(value, str):
        text = value.replace(str(checkout), "<checkout>")
        if volatile is DEMO_VOLATILE:  # the emulator samples: its token counts vary from run to run
            text = DEMO_COUNT.sub(r"<n> \1", text)
        return LOOPBACK_PORT.sub(r"\1:<port>", RUN_ID.sub("<run>", text))
    return value


def commands(docker: bool) -> dict[str, tuple[list[str], re.Pattern[str]]]:
    """Name -> (polarstack arguments, volatile keys): a dry run per working profile, the demo, the docker demo if asked."""
    out = {
        f"train --dry-run {p}": (["train", "--task", "humaneval", "--dry-run", "--profile", p, "--json"], PLAN_VOLATILE)
        for p in PROFILES
    }
    out["demo"] = (["demo", "--json"], DEMO_VOLATILE)
    if docker:
        out["demo --runtime docker"] = (["demo", "--runtime", "docker", "--json"], DEMO_VOLATILE)
    return out


def run(checkout: Path, argv: list[str], volatile: re.Pattern[str], timeout: float) -> tuple[int, object]:
    """Exit code and normalized JSON (or normalized text when the output is not JSON) of one command."""
    env = {**os.environ, "PYTHONPATH": str(checkout / "scripts")}
    env.pop("POLARSTACK_ROOT", None)
    proc = subprocess.run(
        [sys.executable, "-m", "polarstack", *argv],
        cwd=checkout,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )
    try:
        return proc.returncode, normalize(json.loads(proc.stdout), volatile, checkout)
    except json.JSONDecodeError:
        return proc.returncode, normalize(proc.stdout + proc.stderr, volatile, checkout)


def split_text(value: object) -> object:
    """`value` with every multi-line string (a rendered launch.sh, a YAML file) as its list of lines, so that a diff
    shows the line that differs rather than the whole file."""
    if isinstance(value, dict):
        return {key: split_text(item) for key, item in value.items()}
    if isinstance(value, list):
        return [split_text(item) for item in value]
    if isinstance(value, str) and "\n" in value:
        return value.splitlines()
    return value


def lines(value: object) -> list[str]:
    if isinstance(value, str):
        return value.splitlines()
    return json.dumps(split_text(value), indent=1, sort_keys=True).splitlines()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before")
    parser.add_argument("after")
    parser.add_argument("--docker", action="store_true", help="also `demo --runtime docker` (a Docker engine needed)")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds per command")
    args = parser.parse_args(argv)
    repo = Path(
        subprocess.run(
            ["git", "rev-parse", "--show-toplevel"], capture_output=True, text=True, check=True
        ).stdout.strip()
    )
    same = True
    with tempfile.TemporaryDirectory(prefix="polarstack-same-outputs-") as tmp:
        checkouts: list[Path] = []
        try:
            for rev in (args.before, args.after):
                path = Path(tmp) / f"rev-{len(checkouts)}"
                checkouts.append(path)  # removed in `finally` even if the add fails half-way
                subprocess.run(
                    ["git", "-C", str(repo), "worktree", "add", "-q", "--detach", str(path), rev], check=True
                )
            for name, (command, volatile) in commands(args.docker).items():
                (code_a, out_a), (code_b, out_b) = (run(path, command, volatile, args.timeout) for path in checkouts)
                if code_a == code_b and out_a == out_b:
                    print(f"same      {name} (exit {code_a})", flush=True)
                    continue
                same = False
                print(f"DIFFERENT {name} (exit {code_a} / {code_b})", flush=True)
                diff = difflib.unified_diff(lines(out_a), lines(out_b), args.before, args.after, lineterm="", n=1)
                for line in list(diff)[:40]:
                    print("    " + line[:200])
        finally:
            for path in checkouts:
                subprocess.run(["git", "-C", str(repo), "worktree", "remove", "--force", str(path)], check=False)
            subprocess.run(["git", "-C", str(repo), "worktree", "prune"], check=False)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
