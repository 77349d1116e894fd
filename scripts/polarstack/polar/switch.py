"""Polar's worker-discovery switch: POLAR_WORKER_DISCOVERY=off keeps Polar's chat requests on the router.

Current Polar (src/polar/gateway/proxy.py, `InferenceClient._regular_worker_urls` / `_completion_url`) asks
`GET <base>/workers` and, when the router lists regular workers, sends each chat request straight to one of
them, round-robin. Behind a router that forwards Polar's fields (the patched-router profile) that bypass
silently turns the profile into "engine-direct without session affinity": consecutive turns of one agent
session land on different engines and each miss recomputes the shared prefix.

With POLAR_WORKER_DISCOVERY=off, `install_hook()` replaces `InferenceClient._regular_worker_urls` by one that
discovers nothing, so `_completion_url` and `_tokenize_url` fall back to the base URL exactly as Polar does
when a router lists no workers. The trainer image installs a `.pth` file that calls `install_hook()` at
interpreter start-up, so every Python process there (gateway, rollout server, Ray workers) gets it; the
patch is applied when `polar.gateway.proxy` is first imported. This module imports nothing heavy.

Polar's tokenize (`InferenceClient.tokenize`, POST <base>/v1/tokenize) follows the same fallback, so with the switch
off it goes to the router, which refuses it: measured here on 2026-12-07 with a chat-shaped tokenize request (messages
and the bash tool) through each pinned router to the engine emulator, smg 1.13.0 answered 422 ("missing field
`prompt`") and sglang-router 0.1.4 404, neither reaching the engine (a chat completion through each did). At
POLAR_COMMIT its one caller is the gateway's own POST /v1/tokenize route (src/polar/gateway/server.py,
`tokenize_request`), which only harnesses with a response-token budget call (vanillux2, spilot_router's pool agents);
this stack's task template names the claude_code harness (polarstack.reward.tasks.task_template), which never does.
A harness that tokenizes would need its tokenize sent to an engine, not through either router.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys
import sysconfig
from pathlib import Path

ENV = "POLAR_WORKER_DISCOVERY"
TARGET = "polar.gateway.proxy"
PTH_NAME = "polarstack-polar-switch.pth"
# The .pth line also keeps the grading sandbox's directory out of the agent's (polarstack.polar.eval_dir).
PTH_LINE = (
    "import polarstack.polar.switch as _polarstack_switch, polarstack.polar.eval_dir as _polarstack_eval_dir; "
    "_polarstack_switch.install_hook(); _polarstack_eval_dir.install_hook()\n"
)


def discovery_enabled() -> bool:
    value = os.environ.get(ENV, "on").strip().lower()
    if value not in ("on", "off"):
        raise ValueError(f"{ENV}={value!r}: use on or off")
    return value == "on"


def patch(module) -> bool:
    """Turn worker discovery off in an imported polar.gateway.proxy; True if it patched something."""
    client = getattr(module, "InferenceClient", None)
    if client is None or not hasattr(client, "_regular_worker_urls"):
        return False
    if getattr(client, "_polarstack_discovery_off", False):
        return True

    async def _no_worker_discovery(self, client):  # same signature as Polar's method
        return ()

    client._regular_worker_urls = _no_worker_discovery
    client._polarstack_discovery_off = True
    return True


class _PatchingLoader(importlib.abc.Loader):
    def __init__(self, loader, patch_module) -> None:
        self._loader = loader
        self._patch = patch_module

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:
        self._loader.exec_module(module)
        self._patch(module)


class _Finder(importlib.abc.MetaPathFinder):
    def __init__(self, target: str, patch_module) -> None:
        self.target = target
        self._patch = patch_module

    def find_spec(self, fullname, path, target=None):
        if fullname != self.target:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _PatchingLoader(spec.loader, self._patch)
                return spec
        return None


def patch_on_import(target: str, patch_module) -> None:
    """Call `patch_module(module)` on the module `target` now if it is imported, else when it first is."""
    if target in sys.modules:
        patch_module(sys.modules[target])
    elif not any(isinstance(f, _Finder) and f.target == target for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder(target, patch_module))


def install_hook() -> bool:
    """Apply the switch in this process if POLAR_WORKER_DISCOVERY=off; True when discovery is off."""
    try:
        if discovery_enabled():
            return False
    except ValueError as exc:
        print(f"polarstack: {exc}; leaving Polar's worker discovery on.", file=sys.stderr)
        return False
    patch_on_import(TARGET, patch)
    return True


def install_pth(site_packages: Path | None = None) -> Path:
    """Write the .pth file that runs install_hook() at every interpreter start-up."""
    target = Path(site_packages or sysconfig.get_paths()["purelib"]) / PTH_NAME
    target.write_text(PTH_LINE)
    return target
