"""`make verify-offline`: the grading sandbox's directory stays out of the agent's (polarstack.polar.eval_dir).

Checks configs/upstream/polar-eval-runtime.json against the pins and the patch: read at POLAR_COMMIT; the class,
methods and directory name it records are the ones the patch wraps; a stand-in of the recorded behaviour (the
evaluator's directory joined to the session's, the session's removed at the end), patched, prepares the grading
directory outside the session's, mode 0700, refuses one that exists already, and removes it with the session; the
trainer image installs the .pth line that applies the patch.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from polarstack.offline.check import Check
from polarstack.pins import pins, repo_root
from polarstack.polar import eval_dir, switch

RECORD = Path("configs") / "upstream" / "polar-eval-runtime.json"


def record() -> dict[str, Any]:
    return json.loads((repo_root() / RECORD).read_text())


def standin(data: dict[str, Any]) -> types.ModuleType:
    """A module shaped as the record says Polar's is: `prepare` joins the recorded name to the session's directory and
    makes its artifacts directory there; `remove` deletes a directory, ignoring one that is gone. Not Polar's code."""

    async def prepare(self, managed):
        directory = managed.session_dir / data["nested_name"]
        (directory / "artifacts").mkdir(parents=True, exist_ok=True)
        (managed.session_dir / "logs").mkdir(exist_ok=True)  # Polar writes the prepare logs in the session's own
        return directory

    async def remove(self, session_dir, session_id):
        shutil.rmtree(session_dir, ignore_errors=True)

    module = types.ModuleType("polarstack_eval_dir_standin")
    module.__dict__[data["class"]] = type(
        data["class"], (), {data["prepare_method"]: prepare, data["remove_method"]: remove}
    )
    return module


@dataclass(frozen=True)
class _Managed:
    """What the recorded prepare method reads of Polar's managed session: its directory."""

    session_dir: Path


def behaviour_problems(data: dict[str, Any]) -> list[str]:
    """What the patched stand-in does against what the patch promises, one sentence each."""
    module = standin(data)
    if not eval_dir.patch(module):
        return [f"polarstack.polar.eval_dir does not patch a {data['class']} with {data['prepare_method']}"]
    manager = module.__dict__[data["class"]]()
    problems = []
    with tempfile.TemporaryDirectory(prefix="polarstack-eval-dir-") as root:
        session = Path(root) / "session-abcd1234-x"
        session.mkdir()
        managed = _Managed(session_dir=session)
        prepared = Path(asyncio.run(getattr(manager, data["prepare_method"])(managed)))
        if prepared == session or session in prepared.parents:
            problems.append(f"the grading directory {prepared} is inside the agent's session directory")
        elif prepared.stat().st_mode & 0o077:
            problems.append(f"the grading directory is mode {oct(prepared.stat().st_mode & 0o777)}, not 0700")
        if not (session / "logs").is_dir():
            problems.append("the session's other paths moved too (its logs are no longer in the session directory)")
        try:
            asyncio.run(getattr(manager, data["prepare_method"])(managed))
            problems.append("a grading directory that exists already is used instead of failing the prewarm")
        except FileExistsError:
            pass
        asyncio.run(getattr(manager, data["remove_method"])(session, "s"))
        if prepared.exists() or session.exists():
            problems.append("removing the session's directory leaves the grading directory behind")
    return problems


def check() -> Check:
    data = record()
    problems = []
    if data["polar_commit"] != pins()["POLAR_COMMIT"]:
        problems.append(f"{RECORD} was read at Polar {data['polar_commit']}, not POLAR_COMMIT: reread it")
    expected = (eval_dir.CLASS, eval_dir.PREPARE, eval_dir.REMOVE, eval_dir.NESTED)
    recorded = (data["class"], data["prepare_method"], data["remove_method"], data["nested_name"])
    if recorded != expected:
        problems.append(f"{RECORD} records {recorded}, polarstack.polar.eval_dir patches {expected}")
    problems += behaviour_problems(data)
    if "_polarstack_eval_dir.install_hook()" not in switch.PTH_LINE:
        problems.append("the trainer's .pth line (polarstack.polar.switch.PTH_LINE) does not install the patch")
    if "RUN polarstack polar-switch install" not in (repo_root() / "images" / "trainer" / "Dockerfile").read_text():
        problems.append("images/trainer/Dockerfile does not install the .pth line (polarstack polar-switch install)")
    return Check(
        "the grading sandbox's directory is outside the agent's session (polar-eval-runtime.json)",
        not problems,
        f"{data['file']} {data['class']}.{data['prepare_method']}: <session>/{data['nested_name']} -> "
        f"<session>{eval_dir.SUFFIX}",
        problems,
    )
