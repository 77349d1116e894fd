"""The second node-path review's finding 1: Polar prepares the grading sandbox in `<agent session>/eval_runtime`, which
the agent's sandbox sees read-write at /polar/session/eval_runtime while it works (configs/upstream/
polar-eval-runtime.json): an agent could read the hidden tests there, or replace verifier.py by one that prints the
PASSED line, and earn the reward without solving the task. polarstack.polar.eval_dir moves it beside the session.

The stand-in is shaped as the record says Polar's gateway is (polarstack.offline.eval_dir.standin), not Polar's code."""

from __future__ import annotations

import asyncio
import copy
import os
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest

from polarstack.offline import eval_dir as offline
from polarstack.polar import eval_dir, switch

pytestmark = pytest.mark.unit
SCRIPTS = Path(__file__).resolve().parents[3] / "scripts"


def test_unpatched_the_grading_files_are_in_the_agents_view_and_the_check_says_so(tmp_path, monkeypatch):
    """What the agent would reach: the unpatched layout puts the grading directory under its session directory, and
    verify-offline's check, given a patch that does nothing, says so."""
    data = offline.record()
    manager = offline.standin(data).__dict__[data["class"]]()
    session = tmp_path / "session-1"
    session.mkdir()
    prepared = asyncio.run(manager._prepare_eval_runtime(types.SimpleNamespace(session_dir=session)))
    assert session in Path(prepared).parents  # /polar/session/eval_runtime in the agent's sandbox
    monkeypatch.setattr(eval_dir, "patch", lambda module: True)
    found = offline.behaviour_problems(data)
    assert any("inside the agent's session directory" in p for p in found), found


def test_patched_the_grading_directory_is_a_private_sibling_removed_with_the_session():
    assert offline.behaviour_problems(offline.record()) == []
    assert offline.check().ok, offline.check().problems


def test_a_prepared_sibling_left_by_anyone_fails_the_prewarm_instead_of_being_shared(tmp_path):
    module = offline.standin(offline.record())
    assert eval_dir.patch(module) and eval_dir.patch(module)  # twice: patched once
    manager = module.GatewayNodeManager()
    session = tmp_path / "session-2"
    session.mkdir()
    eval_dir.sibling(session).mkdir()
    (eval_dir.sibling(session) / "eval").mkdir()  # planted: a verifier.py of someone else's choosing would go here
    with pytest.raises(FileExistsError):
        asyncio.run(manager._prepare_eval_runtime(types.SimpleNamespace(session_dir=session)))


def test_verify_offline_refuses_a_record_that_names_another_directory_or_commit(monkeypatch):
    data = copy.deepcopy(offline.record())
    data["nested_name"], data["polar_commit"] = "grading", "0" * 40
    monkeypatch.setattr(offline, "record", lambda: data)
    check = offline.check()
    assert not check.ok and len(check.problems) >= 2, check.problems
    assert any("POLAR_COMMIT" in p for p in check.problems) and any("patches" in p for p in check.problems)


def test_the_trainers_pth_line_patches_polars_gateway_when_it_is_imported(tmp_path):
    """A package named polar.gateway.node on the path (the stand-in's shape, written here), the .pth line run first as
    site.py runs it, then the import: the class comes out patched."""
    node = tmp_path / "polar" / "gateway"
    node.mkdir(parents=True)
    (tmp_path / "polar" / "__init__.py").write_text("")
    (node / "__init__.py").write_text("")
    (node / "node.py").write_text(
        textwrap.dedent(
            """
            class GatewayNodeManager:
                async def _prepare_eval_runtime(self, managed):
                    return managed.session_dir / "eval_runtime"

                async def _remove_session_dir_best_effort(self, session_dir, session_id):
                    return None
            """
        )
    )
    code = switch.PTH_LINE + "import polar.gateway.node as n\nprint(getattr(n.GatewayNodeManager, 'MARK', None))\n"
    code = code.replace("'MARK'", repr(eval_dir.MARK))
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{SCRIPTS}", "POLAR_WORKER_DISCOVERY": "on"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "True"
