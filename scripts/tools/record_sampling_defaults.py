#!/usr/bin/env python3
"""Record where the engines' default sampling parameters come from (configs/upstream/sampling-defaults.json).

Run with the pinned sglang's site-packages (the wheel unpacked, or the install `polarstack sglang-install` makes) and a
clone or bare mirror of THUDM/slime that has SLIME_COMMIT:
  python scripts/tools/record_sampling_defaults.py SITE_PACKAGES /path/to/slime.git > configs/upstream/sampling-defaults.json

Read from sglang (ast, no import):
- sglang/srt/server_args.py: the `sampling_defaults` field's default and choices ("model" takes the model's
  generation_config.json, "openai" the OpenAI defaults);
- sglang/srt/configs/model_config.py `get_default_sampling_params`: which generation_config keys it takes over.
Read from slime at SLIME_COMMIT (`git show`):
- slime/utils/arguments.py: `--rollout-temperature`'s default;
- slime/backends/megatron_utils/loss.py: the line where the trainer divides its logits by rollout_temperature.
`make verify-offline` checks that every engine passes `--sampling-defaults openai` when the pinned default is "model",
so the engines sample from softmax(logits / T) with the temperature the trainer scores with (issue 26 review).
"""

from __future__ import annotations

import ast
import datetime
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def pin(name: str) -> str:
    for line in (ROOT / "configs" / "pins.env").read_text().splitlines():
        if line.startswith(name + "="):
            return line.split("=", 1)[1].strip()
    raise SystemExit(f"configs/pins.env has no {name}")


def sampling_field(text: str) -> dict:
    """default, choices and line of `sampling_defaults: A[str, Arg(help=..., choices=[...])] = "..."`."""
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", "") == "sampling_defaults":
            choices = None
            for call in ast.walk(node.annotation):
                if isinstance(call, ast.Call):
                    for keyword in call.keywords:
                        if keyword.arg == "choices":
                            choices = ast.literal_eval(keyword.value)
            return {"default": ast.literal_eval(node.value), "choices": choices, "line": node.lineno}
    raise SystemExit("server_args.py has no sampling_defaults field")


def model_params(text: str) -> dict:
    """The generation_config keys get_default_sampling_params takes, and the line of its `!= "model"` test."""
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.FunctionDef) and node.name == "get_default_sampling_params":
            for item in ast.walk(node):
                if isinstance(item, ast.Assign) and getattr(item.targets[0], "id", "") == "available_params":
                    return {"keys": ast.literal_eval(item.value), "line": node.lineno}
    raise SystemExit("model_config.py has no get_default_sampling_params with available_params")


def rollout_temperature(arguments: str, loss: str) -> dict:
    default = None
    for node in ast.walk(ast.parse(arguments)):
        if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            if node.args[0].value == "--rollout-temperature":
                default = next(ast.literal_eval(k.value) for k in node.keywords if k.arg == "default")
                line = node.lineno
    if default is None:
        raise SystemExit("slime/utils/arguments.py has no --rollout-temperature")
    scaled = [n for n, text in enumerate(loss.splitlines(), 1) if "/ rollout_temperature" in text]
    if not scaled:
        raise SystemExit("slime/backends/megatron_utils/loss.py no longer divides by rollout_temperature")
    return {"default": default, "line": line, "loss_line": scaled[0]}


def main() -> int:
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    site, repo = Path(sys.argv[1]), sys.argv[2]
    commit = pin("SLIME_COMMIT")

    def show(path: str) -> str:
        return subprocess.run(
            ["git", "-C", repo, "show", f"{commit}:{path}"], capture_output=True, text=True, check=True
        ).stdout

    field = sampling_field((site / "sglang/srt/server_args.py").read_text())
    params = model_params((site / "sglang/srt/configs/model_config.py").read_text())
    temperature = rollout_temperature(show("slime/utils/arguments.py"), show("slime/backends/megatron_utils/loss.py"))
    record = {
        "recorded": datetime.date.today().isoformat(),
        "recorder": "scripts/tools/record_sampling_defaults.py",
        "sglang": {
            "version": pin("SGLANG_VERSION"),
            "flag": "--sampling-defaults",
            "default": field["default"],
            "choices": field["choices"],
            "source": f"sglang/srt/server_args.py:{field['line']}",
            "model_keys": params["keys"],
            "model_keys_source": f"sglang/srt/configs/model_config.py:{params['line']}",
        },
        "slime": {
            "commit": commit,
            "rollout_temperature_default": temperature["default"],
            "source": f"slime/utils/arguments.py:{temperature['line']}",
            "loss_source": f"slime/backends/megatron_utils/loss.py:{temperature['loss_line']}",
        },
    }
    json.dump(record, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
