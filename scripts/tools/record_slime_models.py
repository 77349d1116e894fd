#!/usr/bin/env python3
"""Record the Megatron arguments of slime's Qwen2.5 model scripts at SLIME_COMMIT (configs/upstream/slime-models.json).

Run with a clone (or bare mirror) of THUDM/slime that has SLIME_COMMIT:
  python scripts/tools/record_slime_models.py /path/to/slime.git > configs/upstream/slime-models.json

Each `scripts/models/qwen2.5-<size>.sh` defines one bash array, MODEL_ARGS=( ... ), of flags and values. The
recorder reads the file at the pinned commit with `git show` and splits the array with shlex (bash's quoting),
keeping every token in order, with the line each flag is on. `make verify-offline` checks that the rehearsal's
model (configs/train/preflight.yaml) and the real run's (configs/train/defaults.yaml) pass exactly these tokens.
"""

from __future__ import annotations

import datetime
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

SIZES = ("0.5B", "1.5B", "3B", "7B")
ROOT = Path(__file__).resolve().parents[2]


def pinned_commit() -> str:
    for line in (ROOT / "configs" / "pins.env").read_text().splitlines():
        if line.startswith("SLIME_COMMIT="):
            return line.split("=", 1)[1].strip()
    raise SystemExit("configs/pins.env has no SLIME_COMMIT")


def parse_model_args(text: str) -> tuple[list[str], dict[str, int]]:
    """The tokens of the MODEL_ARGS=( ... ) array and the 1-based line of each flag."""
    match = re.search(r"MODEL_ARGS=\((.*?)\)", text, re.S)
    if not match:
        raise ValueError("no MODEL_ARGS=( ... ) array")
    first_line = text[: match.start(1)].count("\n") + 1
    tokens: list[str] = []
    lines: dict[str, int] = {}
    for offset, line in enumerate(match.group(1).split("\n")):
        for token in shlex.split(line, comments=True):
            tokens.append(token)
            if token.startswith("--"):
                lines[token] = first_line + offset
    return tokens, lines


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    repo, commit = sys.argv[1], pinned_commit()
    models = {}
    for size in SIZES:
        path = f"scripts/models/qwen2.5-{size}.sh"
        text = subprocess.run(
            ["git", "-C", repo, "show", f"{commit}:{path}"], capture_output=True, text=True, check=True
        ).stdout
        tokens, lines = parse_model_args(text)
        models[f"qwen2.5-{size}"] = {"file": path, "args": tokens, "flag_lines": lines}
    record = {
        "what": "MODEL_ARGS of slime's Qwen2.5 model scripts, token by token (record_slime_models.py)",
        "slime_commit": commit,
        "recorded_on": datetime.date.today().isoformat(),
        "recorded_with": "scripts/tools/record_slime_models.py",
        "models": models,
    }
    json.dump(record, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
