"""`polarstack image-facts --stage STAGE`: the trainer image's own upstream code says what configs/upstream records.

Run by images/trainer/Dockerfile at build time, after Polar, slime and the router are installed, so that `make build`
fails on the node, in one sentence, when the code that will run differs from the recorded facts the stack relies on:

- Polar's apptainer runtime (src/polar/runtime/apptainer.py of the installed Polar, at POLAR_COMMIT) reads the four
  switches the stack sets for every session (configs/upstream/polar-apptainer.json: POLAR_APPTAINER_NO_INSTANCE,
  _NO_MOUNT_TMP, _CLEANENV, _ISOLATE_IPC) and spells the apptainer options they turn on (`--no-mount` with `tmp`,
  `--cleanenv`, `--ipc`). The record was read at other revisions than the pin (the index holds no copy at
  POLAR_COMMIT); without a switch the sandbox probe, which rebuilds Polar's command line from the record
  (polarstack.checks.sandbox_probe), would pass while real sessions see the trainer's /tmp or its environment. The
  file's sha256 is printed, so the build log names the exact source that was checked.
- The router slime's image ships (slime's docker/Dockerfile force-installs its own sglang-router build) has
  `RouterArgs.prometheus_host`: slime adds the router's arguments with a `--router-` prefix
  (slime/backends/sglang_utils/arguments.py at SLIME_COMMIT), and the stack passes `--router-prometheus-host
  127.0.0.1` (polarstack.stack.exposure.SLIME_ROUTER_ARGS); a router without the field would make train_async.py
  refuse its command line after the preflight (configs/upstream/router-prometheus-host.json records which PyPI
  releases have it; slime's build is not on PyPI).

Both are read as source text (ast), without importing Polar or the router. On `--stage base` (DEVICE=cpu: the image
without slime, Polar or apptainer, polarstack.stack.device.SKIPPED_ON_CPU) the checks are skipped by name.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import json
from pathlib import Path
from typing import Any

from polarstack.errors import ExitCode, StackError
from polarstack.pins import repo_root

STAGES = ("upstream", "base")
POLAR_RECORD = Path("configs") / "upstream" / "polar-apptainer.json"
SWITCH_KEYS = ("mode_env", "no_mount_tmp_env", "cleanenv_env", "isolate_ipc_env")
# The apptainer options those switches turn on, as Polar's _runtime_options spells them (the record's
# facts.runtime_options); `tmp` is the entry POLAR_APPTAINER_NO_MOUNT_TMP appends to the --no-mount list.
POLAR_OPTIONS = ("--no-mount", "tmp", "--cleanenv", "--ipc")
ROUTER_FIELD = "prometheus_host"


def polar_record() -> dict[str, Any]:
    return json.loads((repo_root() / POLAR_RECORD).read_text())


def _strings(source: str) -> set[str]:
    return {
        node.value
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    }


def polar_problems(source: str, record: dict[str, Any]) -> list[str]:
    """What Polar's apptainer runtime `source` lacks of the record: a switch it never reads, an option it never
    spells (both as string literals)."""
    strings = _strings(source)
    missing = [record[key] for key in SWITCH_KEYS if record[key] not in strings]
    missing += [option for option in POLAR_OPTIONS if option not in strings]
    return missing


def router_problems(source: str) -> list[str]:
    """[] when `source` (sglang_router/router_args.py) defines RouterArgs with the field prometheus_host."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef) and node.name == "RouterArgs":
            fields = {
                item.target.id
                for item in node.body
                if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)
            }
            return [] if ROUTER_FIELD in fields else [f"RouterArgs has no {ROUTER_FIELD}"]
    return ["it defines no RouterArgs"]


def installed_file(package: str, relative: str) -> Path:
    """A file of an installed package, found without importing it (ENVIRONMENT when the package is absent)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise StackError(
            f"the trainer image has no {package} package; build it with UPSTREAM_STAGE=upstream (`make build`).",
            ExitCode.ENVIRONMENT,
        )
    for location in spec.submodule_search_locations:
        path = Path(location) / relative
        if path.is_file():
            return path
    raise StackError(f"the installed {package} has no {relative}; rebuild the trainer image.", ExitCode.ENVIRONMENT)


def check(stage: str) -> list[str]:
    """The lines `image-facts` prints; a StackError (ENVIRONMENT, one sentence) when a fact does not hold."""
    if stage not in STAGES:
        raise StackError(f"--stage {stage!r} is not one of {', '.join(STAGES)}.", ExitCode.USAGE)
    if stage == "base":
        return [
            "skipped on DEVICE=cpu (UPSTREAM_STAGE=base): Polar's apptainer runtime and slime's router are not in "
            "this image (polarstack.stack.device.SKIPPED_ON_CPU)"
        ]
    record = polar_record()
    polar = installed_file("polar", "runtime/apptainer.py")
    text = polar.read_text(encoding="utf-8")
    missing = polar_problems(text, record)
    if missing:
        raise StackError(
            f"the installed Polar's {polar} never names {', '.join(missing)}, which {POLAR_RECORD} says it reads for "
            f"every session; reread that file at POLAR_COMMIT and update the record before building.",
            ExitCode.ENVIRONMENT,
        )
    router = installed_file("sglang_router", "router_args.py")
    wrong = router_problems(router.read_text(encoding="utf-8"))
    if wrong:
        raise StackError(
            f"slime's router in this image ({router}): {wrong[0]}, so slime would refuse --router-prometheus-host; "
            "drop it from polarstack.stack.exposure.SLIME_ROUTER_ARGS or install a router that has it.",
            ExitCode.ENVIRONMENT,
        )
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
    return [
        f"Polar's {polar} (sha256 {digest}) reads {', '.join(record[key] for key in SWITCH_KEYS)} and spells "
        f"{' '.join(POLAR_OPTIONS)}, as {POLAR_RECORD} records",
        f"slime's router ({router}) has RouterArgs.{ROUTER_FIELD}: --router-prometheus-host is accepted",
    ]
