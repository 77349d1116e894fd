"""The grading sandbox's directory outside the agent's: no agent sees or rewrites the files that grade it.

Polar's gateway (src/polar/gateway/node.py at POLAR_COMMIT, `GatewayNodeManager._prepare_eval_runtime`; recorded in
configs/upstream/polar-eval-runtime.json) makes the fresh evaluator runtime of a `refresh_runtime` task in
`<agent session dir>/eval_runtime`, and starts preparing it when the agent starts. The agent's sandbox binds its
session directory read-write at /polar/session, so the agent would see the grading sandbox's files at
/polar/session/eval_runtime/ while it works: the task's hidden tests (eval/problem.json) to hard-code answers from,
and eval/verifier.py to replace by one that prints the PASSED line Polar grades by. A process the agent leaves
running could do it after the upload too: the agent's sandbox stops only after grading.

`patch()` wraps two methods of Polar's GatewayNodeManager, without changing their code:
- `_prepare_eval_runtime` gets a view of the session whose `session_dir / "eval_runtime"` is the sibling
  `<agent session dir>-eval` (made here first, mode 0700; one that exists already fails the prewarm, and Polar then
  reports the session as an error without a reward); every other path stays the session's own;
- `_remove_session_dir_best_effort`, which removes the session's directory at the end, removes the sibling too.
The sibling sits beside the session directory, in the trainer's /tmp, which no session sees (`--no-mount ...,tmp`,
POLAR_APPTAINER_NO_MOUNT_TMP); the grading sandbox binds it at its own /polar/session.

Installed like the worker-discovery switch (polarstack.polar.switch): the trainer image's .pth file calls
`install_hook()` at interpreter start-up, and the patch applies when polar.gateway.node is first imported.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from polarstack.polar.switch import patch_on_import

TARGET = "polar.gateway.node"
CLASS = "GatewayNodeManager"
PREPARE = "_prepare_eval_runtime"
REMOVE = "_remove_session_dir_best_effort"
NESTED = "eval_runtime"  # the name Polar joins to the agent's session directory
SUFFIX = "-eval"
MARK = "_polarstack_eval_dir_apart"


def sibling(session_dir: Path | str) -> Path:
    """Where the grading sandbox's directory goes for the agent session at `session_dir`."""
    return Path(f"{session_dir}{SUFFIX}")


class _SessionDir:
    """The agent's session directory as `_prepare_eval_runtime` sees it: `/ NESTED` is the sibling."""

    def __init__(self, path: Path) -> None:
        self._path = Path(path)

    def __truediv__(self, name: Any) -> Path:
        return sibling(self._path) if name == NESTED else self._path / name

    def __fspath__(self) -> str:
        return str(self._path)

    def __str__(self) -> str:
        return str(self._path)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._path, name)


class _Session:
    """A managed session whose `session_dir` is a _SessionDir; every other attribute is the session's own."""

    def __init__(self, managed: Any) -> None:
        object.__setattr__(self, "_managed", managed)

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._managed, name)
        return _SessionDir(value) if name == "session_dir" else value

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._managed, name, value)


def patch(module: Any) -> bool:
    """Keep the grading sandbox's directory out of the agent's in an imported polar.gateway.node; True if patched."""
    manager = getattr(module, CLASS, None)
    if manager is None or not hasattr(manager, PREPARE) or not hasattr(manager, REMOVE):
        return False
    if getattr(manager, MARK, False):
        return True
    prepare, remove = getattr(manager, PREPARE), getattr(manager, REMOVE)

    async def prepare_apart(self, managed):  # Polar's signature: (self, managed) -> BaseRuntime | None
        sibling(managed.session_dir).mkdir(mode=0o700)  # exists already: fail the prewarm, never share it
        return await prepare(self, _Session(managed))

    async def remove_both(self, session_dir, session_id):  # Polar's signature: (self, session_dir, session_id)
        await remove(self, session_dir, session_id)
        await remove(self, sibling(session_dir), session_id)

    setattr(manager, PREPARE, prepare_apart)
    setattr(manager, REMOVE, remove_both)
    setattr(manager, MARK, True)
    return True


def install_hook() -> None:
    """Apply the patch in this process now (polar.gateway.node imported already) or when it is first imported."""
    patch_on_import(TARGET, patch)
