#!/usr/bin/env python3
"""polarstack-model-download: fill MODEL_PATH with MODEL_NAME's weights, resumably, and prove they are complete.

Runs as the one-shot `model-download` service (images/model/Dockerfile; `make model`, and before the engines on
every `make up`). Standard library plus huggingface_hub (HF_HUB_REQUIREMENT in configs/pins.env).

- Download: `hf download MODEL_NAME --local-dir MODEL_PATH --include ...`; an interrupted run resumes from the
  partial files huggingface_hub keeps under MODEL_PATH/.cache/huggingface.
- Verify: every weight/config file the Hub lists for the repository is present with the size the Hub reports,
  and LFS files (the safetensors shards) match the Hub's sha256; config.json and every shard named in
  model.safetensors.index.json must be among them. Then MARKER is written: `make up` looks for it.
- A rerun with MARKER present re-checks sizes against MARKER only (no network, seconds).
- `--check-only` (MODEL_DIR mode, weights bind-mounted read-only): local checks only, nothing written.
HF_TOKEN passes through from the caller's environment (huggingface_hub reads it); it is never written anywhere.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

MARKER = ".polarstack-model.json"
INCLUDE = ["*.json", "*.safetensors", "*.txt", "*.model", "*.tiktoken", "LICENSE*"]


def say(message: str) -> None:
    print(f"model-download: {message}", flush=True)


def fail(message: str) -> int:
    print(f"model-download: {message}", file=sys.stderr, flush=True)
    return 1


def wanted(name: str) -> bool:
    from fnmatch import fnmatch

    return "/" not in name and any(fnmatch(name, pattern) for pattern in INCLUDE)


def local_problems(directory: Path) -> list[str]:
    """config.json and every shard of model.safetensors.index.json present and non-empty."""
    problems = []
    if not (directory / "config.json").is_file():
        problems.append(f"{directory}/config.json is missing")
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        try:
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (ValueError, KeyError):
            return problems + [f"{index} has no weight_map"]
        for shard in shards:
            path = directory / shard
            if not path.is_file() or path.stat().st_size == 0:
                problems.append(f"{path} is missing or empty")
    elif not (directory / "model.safetensors").is_file():
        problems.append(f"{directory} has no model.safetensors(.index.json)")
    return problems


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(8 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def hub_files(repo: str) -> tuple[str, dict[str, dict]]:
    from huggingface_hub import HfApi

    info = HfApi().model_info(repo, files_metadata=True)
    files = {}
    for sibling in info.siblings or []:
        if wanted(sibling.rfilename):
            lfs = getattr(sibling, "lfs", None)
            files[sibling.rfilename] = {"size": sibling.size, "sha256": getattr(lfs, "sha256", None) if lfs else None}
    return info.sha, files


def report_context(directory: Path) -> None:
    try:
        config = json.loads((directory / "config.json").read_text())
    except (OSError, ValueError):
        return
    say(
        f"max_position_embeddings={config.get('max_position_embeddings')} (context.model_context_length in "
        "configs/train/defaults.yaml must not exceed it)"
    )


def main(argv: list[str]) -> int:
    repo = os.environ.get("MODEL_NAME", "")
    target = Path(os.environ.get("MODEL_PATH", ""))
    if not repo or not str(target).startswith("/"):
        return fail("MODEL_NAME and an absolute MODEL_PATH must be set (configs/stack.env).")
    marker = target / MARKER
    if "--check-only" in argv:
        problems = local_problems(target)
        if problems:
            return fail(f"the weights at MODEL_DIR (mounted at {target}) are incomplete: {problems[0]}.")
        report_context(target)
        say(f"{target}: config.json and every shard present (MODEL_DIR, read-only; nothing downloaded).")
        return 0
    if marker.is_file():
        recorded = json.loads(marker.read_text())
        stale = [
            name
            for name, meta in recorded.get("files", {}).items()
            if not (target / name).is_file() or (target / name).stat().st_size != meta["size"]
        ]
        if recorded.get("repo") == repo and not stale and not local_problems(target):
            report_context(target)
            say(
                f"{repo} already in {target} (revision {recorded.get('revision')}, "
                f"{len(recorded['files'])} files, {sum(m['size'] for m in recorded['files'].values())} bytes)."
            )
            return 0
        say(f"{marker} does not match the files ({stale[:1] or 'other model'}); downloading again.")
        marker.unlink()
    started = time.monotonic()
    target.mkdir(parents=True, exist_ok=True)
    command = ["hf", "download", repo, "--local-dir", str(target)]
    for pattern in INCLUDE:
        command += ["--include", pattern]
    say(f"{' '.join(command)} (resumes an interrupted download)")
    if subprocess.run(command).returncode != 0:
        return fail(
            f"`hf download {repo}` failed; check the network and HF_TOKEN, then rerun `make model` (it resumes)."
        )
    revision, files = hub_files(repo)
    problems = local_problems(target)
    for name, meta in sorted(files.items()):
        path = target / name
        if not path.is_file():
            problems.append(f"{name} is missing")
        elif meta["size"] is not None and path.stat().st_size != meta["size"]:
            problems.append(f"{name} has {path.stat().st_size} bytes, the Hub lists {meta['size']}")
        elif meta["sha256"] and sha256(path) != meta["sha256"]:
            problems.append(f"{name} does not match the Hub's sha256")
    if problems:
        return fail(f"{repo} in {target} is incomplete or corrupt ({problems[0]}); rerun `make model`.")
    record = {
        "repo": repo,
        "revision": revision,
        "verified": "size and LFS sha256 against the Hub",
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "files": {name: {"size": (target / name).stat().st_size} for name in sorted(files)},
    }
    tmp = marker.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=1) + "\n")
    tmp.replace(marker)
    total = sum(m["size"] for m in record["files"].values())
    report_context(target)
    say(
        f"{repo} revision {revision}: {len(files)} files, {total} bytes verified in {time.monotonic() - started:.0f} s."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
