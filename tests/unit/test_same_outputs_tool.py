"""Pins scripts/tools/same_outputs.py, the check that two revisions print the same plans and demo verdicts (issue 35's
acceptance): what it treats as volatile (a run id, a loopback port, the checkout's path; in a demo only, durations,
ports and the emulator's token counts) and nothing else, and, end to end on a repository of its own, that it runs
each revision's own code, exits 1 naming the command that differs and leaves no worktree behind."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

TOOL = Path(__file__).resolve().parents[2] / "scripts" / "tools" / "same_outputs.py"
spec = importlib.util.spec_from_file_location("same_outputs", TOOL)
same_outputs = importlib.util.module_from_spec(spec)
spec.loader.exec_module(same_outputs)


def test_a_plan_keeps_every_value_but_run_ids_ports_and_the_checkout():
    checkout = Path("/tmp/x/rev-0")
    plan = {
        "run_id": "humaneval-engine-direct-20261207T230736",
        "launch": f"polar serve_rollout -c {checkout}/.run/train/x/topology.yaml --url http://127.0.0.1:28080",
        "max_tokens_per_gpu": 32768,
        "seconds": 5,
    }
    assert same_outputs.normalize(plan, same_outputs.PLAN_VOLATILE, checkout) == {
        "run_id": "humaneval-engine-direct-<run>",
        "launch": "polar serve_rollout -c <checkout>/.run/train/x/topology.yaml --url http://127.0.0.1:<port>",
        "max_tokens_per_gpu": 32768,  # a plan's numbers are the plan: never hidden
        "seconds": 5,
    }


def test_a_demo_hides_times_ports_and_sampled_counts_but_not_verdicts():
    row = {"verdict": "pass", "smoke_s": 1.4, "trainable_tokens": 127, "message": "127 trainable tokens via x"}
    out = same_outputs.normalize([row], same_outputs.DEMO_VOLATILE, Path("/nowhere"))
    assert out == [
        {
            "verdict": "pass",
            "smoke_s": "<volatile>",
            "trainable_tokens": "<volatile>",
            "message": "<n> trainable tokens via x",
        }
    ]
    assert same_outputs.normalize({"verdict": "TOKENS_MISSING"}, same_outputs.DEMO_VOLATILE, Path("/x")) != (
        same_outputs.normalize({"verdict": "pass"}, same_outputs.DEMO_VOLATILE, Path("/x"))
    )


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout.strip()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A repository whose scripts/polarstack prints, for every command, JSON naming its revision's VERDICT file."""
    repo = tmp_path / "repo"
    package = repo / "scripts" / "polarstack"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "__main__.py").write_text(
        "import json, pathlib, sys, time\n"
        "verdict = (pathlib.Path(__file__).parents[2] / 'VERDICT').read_text().strip()\n"
        "print(json.dumps({'argv': sys.argv[1:], 'verdict': verdict, 'run': f'x-{time.strftime(\"%Y%m%dT%H%M%S\")}'}))\n"
    )
    (repo / "VERDICT").write_text("pass\n")
    _git(repo.parent, "init", "-q", str(repo))
    for step, verdict in (("one", "pass"), ("two", "pass"), ("three", "TOKENS_MISSING")):
        (repo / "VERDICT").write_text(verdict + "\n")
        _git(repo, "add", "-A")
        _git(repo, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", step, "--allow-empty")
    return repo


def _run(repo: Path, before: str, after: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(TOOL), before, after], cwd=repo, capture_output=True, text=True, timeout=120
    )


def test_two_revisions_alike_pass_and_a_changed_verdict_fails_by_name(repo):
    alike = _run(repo, "HEAD~2", "HEAD~1")
    assert alike.returncode == 0, alike.stdout + alike.stderr
    assert alike.stdout.count("same      ") == 4 and "DIFFERENT" not in alike.stdout
    changed = _run(repo, "HEAD~1", "HEAD")
    assert changed.returncode == 1, changed.stdout + changed.stderr
    assert "DIFFERENT train --dry-run engine-direct" in changed.stdout and "TOKENS_MISSING" in changed.stdout
    assert _git(repo, "worktree", "list").count("\n") == 0  # only the repository itself: no worktree left


def test_a_rendered_file_is_diffed_line_by_line():
    before = {"files": {"launch.sh": "set -e\n# (the old home)\nexport A=1"}}
    after = {"files": {"launch.sh": "set -e\n# (the new home)\nexport A=1"}}
    changed = [line for line in same_outputs.lines(after) if line not in same_outputs.lines(before)]
    assert changed == ['   "# (the new home)",'], changed
