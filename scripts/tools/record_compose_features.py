#!/usr/bin/env python3
"""Record which Docker Compose release first has each Compose feature the stack uses, and the minimum that follows
(configs/upstream/compose-features.json; the GPU-node review's finding 11: nothing checked that the node's Compose is
new enough, and an older one fails on compose.yaml or silently merges what it should replace).

  git clone --bare https://github.com/docker/compose /tmp/compose.git
  git clone --bare https://github.com/compose-spec/compose-go /tmp/compose-go.git
  python scripts/tools/record_compose_features.py /tmp/compose.git /tmp/compose-go.git \
      > configs/upstream/compose-features.json

Each feature is an exact substring (needle) of one file of docker/compose, or of compose-spec/compose-go (the
library that parses the Compose file): the first release tag (vX.Y.Z, sorted as versions) whose file holds it is the
feature's `since`. For a compose-go feature, `since` is the first docker/compose release whose go.mod requires a
compose-go at or after the first compose-go tag that holds it. The docs' release notes say the same for each (cited
in `release_notes`). The minimum is the highest `since` of the features used on one node, and of all of them at
NODES>1. `make up` and every other docker-runtime target refuse an older Compose (polarstack.stack.compose_version);
`make verify-offline` (polarstack.offline.compose_features) checks that each feature is still used where recorded,
that the features not recorded (`!reset`, `include`, `env_file` `required`) stay unused, and the minimum.
"""

from __future__ import annotations

import datetime
import json
import re
import subprocess
import sys

COMPOSE = "docker/compose"
COMPOSE_GO = "compose-spec/compose-go"
FEATURES = {  # name: (repository, file, needle, when, label, what the stack uses it for, release notes)
    "depends_on_required": (
        COMPOSE,
        "pkg/compose/convergence.go",
        "config.Required",
        "always",
        "`required: false` in the trainer's depends_on (compose/compose.yaml)",
        "compose/compose.yaml: the trainer's depends_on lists engine-1 and router with `required: false` (engine-direct "
        "runs neither). Compose up to 2.19.1 (compose-go 1.15.x, whose schema has no depends_on `required`) rejects "
        "the file; 2.20.0 and 2.20.1 (compose-go 1.16.0) accept the attribute and ignore it",
        "Docker Compose 2.20.2: 'Added support for the depends_on.required attribute' "
        "(docs.docker.com/compose/releases/release-notes/#2202, docker/compose PR #10792)",
    ),
    "override_tag": (
        COMPOSE_GO,
        "loader/reset.go",
        'node.Tag == "!override"',
        "NODES>1",
        "`!override` in the NODES>1 override (.run/compose/<profile>.cluster.yaml)",
        "the NODES>1 override .run/compose/<profile>.cluster.yaml (polarstack.stack.compose.cluster_override): "
        "`!override` replaces the router's profiles off the head and the head trainer's depends_on. compose-go before "
        "v2.0.0-rc.3 has no `!override`: Compose would merge those lists and mappings into compose.yaml's (sequences "
        "append, mappings merge: docs.docker.com/reference/compose-file/merge/) instead of replacing them",
        "compose-go PR #552 ('!override can be used to replace value'), first in compose-go v2.0.0-rc.3; Docker Compose "
        "2.24.4: 'Dependencies upgrade: bump compose-go to 2.0.0-rc.3' (docs.docker.com/compose/releases/"
        "release-notes/#2244)",
    ),
    "up_wait": (
        COMPOSE,
        "cmd/compose/up.go",
        'BoolVar(&up.wait, "wait"',
        "always",
        "`up --wait`",
        "make up and make preflight: `up --detach --wait` returns once every service is healthy or has completed",
        "docker/compose cmd/compose/up.go: the --wait flag (its first release is the one recorded)",
    ),
    "wait_one_shot_dependency": (
        COMPOSE,
        "pkg/compose/start.go",
        "getDependencyCondition(",
        "always",
        "`up --wait` past the one-shot model-download",
        "make up: `--wait` ends although model-download exits (the engines depend on it with "
        "service_completed_successfully); before, it waited for that one-shot to be running forever",
        "Docker Compose 2.7.0: 'Used appropriate dependency condition for one-shot containers when running "
        "compose up --wait' (docs.docker.com/compose/releases/release-notes/#270, docker/compose PR #9572)",
    ),
    "run_build": (
        COMPOSE,
        "cmd/compose/run.go",
        'BoolVar(&createOpts.Build, "build"',
        "always",
        "`run --build` (make model, make sif)",
        "make model and make sif: `run --rm --build` rebuilds the one-shot's image when a pin changed",
        "Docker Compose 2.13.0: 'Added a build option to run command' (docs.docker.com/compose/releases/"
        "release-notes/#2130, docker/compose#10003)",
    ),
}
NOT_USED = {  # feature: what verify-offline looks for in the stack's Compose files and rendered overrides
    "reset_tag": "!reset",
    "include": "include:",
    "env_file_required": "env_file:",
}
RELEASE = re.compile(r"^v(\d+)\.(\d+)\.(\d+)$")
TAG = re.compile(r"^v(\d+)\.(\d+)\.(\d+)(?:-([0-9A-Za-z.-]+))?$")


def git(git_dir: str, *args: str) -> str:
    return subprocess.run(["git", "--git-dir", git_dir, *args], capture_output=True, text=True).stdout


def version_key(tag: str) -> tuple:
    """Semantic-version order; a pre-release (v2.0.0-rc.3) sorts before its release."""
    major, minor, patch, pre = TAG.match(tag).groups()
    parts = tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in (pre or "").split(".")) if pre else ()
    return (int(major), int(minor), int(patch), 0 if pre else 1, parts)


def tags(git_dir: str, *, releases_only: bool) -> list[str]:
    pattern = RELEASE if releases_only else TAG
    return sorted((t for t in git(git_dir, "tag").split() if pattern.match(t)), key=version_key)


def first_with(git_dir: str, candidates: list[str], path: str, needle: str) -> tuple[str, int, str] | None:
    for tag in candidates:
        lines = git(git_dir, "show", f"{tag}:{path}").splitlines()
        found = [i for i, line in enumerate(lines, 1) if needle in line]
        if found:
            return tag, found[0], lines[found[0] - 1].strip()
    return None


def compose_go_of(compose_dir: str, tag: str) -> str | None:
    """The compose-go version docker/compose `tag` requires (go.mod), as a tag name (v1.x or v2.x)."""
    for line in git(compose_dir, "show", f"{tag}:go.mod").splitlines():
        parts = line.split()
        if parts and parts[0] in ("github.com/compose-spec/compose-go", "github.com/compose-spec/compose-go/v2"):
            return parts[1] if TAG.match(parts[1]) else None
    return None


def main() -> int:
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    compose_dir, compose_go_dir = sys.argv[1], sys.argv[2]
    releases = tags(compose_dir, releases_only=True)
    features = {}
    for name, (repo, path, needle, when, label, uses, notes) in FEATURES.items():
        if repo == COMPOSE:
            hit = first_with(compose_dir, releases, path, needle)
            if hit is None:
                raise SystemExit(f"no docker/compose release has {needle!r} in {path}")
            since, line, text = hit
            evidence = {"repository": repo, "file": path, "needle": needle, "tag": since, "line": line, "text": text}
        else:
            hit = first_with(compose_go_dir, tags(compose_go_dir, releases_only=False), path, needle)
            if hit is None:
                raise SystemExit(f"no compose-go tag has {needle!r} in {path}")
            go_tag, line, text = hit
            since = next(
                (t for t in releases if (v := compose_go_of(compose_dir, t)) and version_key(v) >= version_key(go_tag)),
                None,
            )
            if since is None:
                raise SystemExit(f"no docker/compose release requires compose-go {go_tag} or later")
            evidence = {
                "repository": repo,
                "file": path,
                "needle": needle,
                "tag": go_tag,
                "line": line,
                "text": text,
                "docker_compose_go_mod": {since: compose_go_of(compose_dir, since)},
            }
        features[name] = {
            "since": since.removeprefix("v"),
            "when": when,
            "label": label,
            "uses": uses,
            "release_notes": notes,
            "evidence": evidence,
        }

    def highest(names: list[str]) -> str:
        return max((features[n]["since"] for n in names), key=lambda v: version_key(f"v{v}"))

    record = {
        "what": "the first Docker Compose release with each Compose feature the stack uses, and the minimum that "
        "follows (record_compose_features.py; checked at every docker-runtime target by polarstack.stack."
        "compose_version)",
        "recorded_on": datetime.date.today().isoformat(),
        "sources": {
            COMPOSE: git(compose_dir, "rev-parse", "HEAD").strip(),
            COMPOSE_GO: git(compose_go_dir, "rev-parse", "HEAD").strip(),
        },
        "minimum": highest([n for n, f in features.items() if f["when"] == "always"]),
        "minimum_multi_node": highest(list(features)),
        "features": features,
        "not_used": NOT_USED,
    }
    json.dump(record, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
