"""`make preflight` at NODES > 1: prove SHARED_DIR is one directory on every node, through Ray (issue 28 point 5).

Run as a Ray job from the head's trainer (polarstack.train.rehearsal_run): the driver (on the head) writes a fresh
nonce to SHARED_DIR/nodes/probe-<run>/head.txt, then runs one task on every alive node of the Ray cluster, each
pinned to its node by NodeAffinitySchedulingStrategy(soft=False). Each task reads the head's file on its node and
writes its own file, <node ip>.txt, holding the nonce it read; the driver then reads every node's file back. A node
that read another nonce, or whose file the head cannot read, does not share the directory: the disk weight sync
(every node writes a part of each copy, every engine reads all of it) and the checkpoints would silently diverge.
The result is one JSON line on stdout: {"nonce_sha256", "nodes": {ip: {"read": bool, "wrote": bool, "error"}}}; the
nonce itself is never printed. Only the standard library and ray are imported, so the file also runs as a script.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import secrets
import sys
from pathlib import Path
from typing import Any


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def node_side(directory: str, head_file: str, ip: str) -> dict[str, Any]:
    """On one node: read the head's nonce, write it back under this node's name. Returns what this node saw."""
    base = Path(directory)
    seen = _read(base / head_file)
    out = {"ip": ip, "pid": os.getpid(), "read_sha256": hashlib.sha256(seen.encode()).hexdigest() if seen else None}
    try:
        (base / f"{ip}.txt").write_text((seen or "") + "\n")
        out["wrote"] = True
    except OSError as exc:
        out["wrote"] = False
        out["error"] = f"{type(exc).__name__}: {exc.strerror}"
    return out


def probe(directory: Path, *, address: str | None = None) -> dict[str, Any]:
    # Deferred: ray, installed in the trainer image (and the pinned ray's venv), not in the host's package
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    directory.mkdir(parents=True, exist_ok=True)
    nonce = secrets.token_hex(16)
    (directory / "head.txt").write_text(nonce + "\n")
    digest = hashlib.sha256(nonce.encode()).hexdigest()
    ray.init(address=address or "auto", logging_level="ERROR", log_to_driver=False)
    try:
        task = ray.remote(num_cpus=0)(node_side)
        alive = [n for n in ray.nodes() if n.get("Alive")]
        refs = {
            n["NodeManagerAddress"]: task.options(
                scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=n["NodeID"], soft=False)
            ).remote(str(directory), "head.txt", n["NodeManagerAddress"])
            for n in alive
        }
        seen = {ip: ray.get(ref, timeout=120) for ip, ref in refs.items()}
    finally:
        ray.shutdown()
    nodes = {}
    for ip, row in seen.items():
        back = _read(directory / f"{ip}.txt")
        nodes[ip] = {
            "read": row.get("read_sha256") == digest,
            "wrote": bool(row.get("wrote")) and back == nonce,
            **({"error": row["error"]} if row.get("error") else {}),
        }
    return {"nonce_sha256": digest, "nodes": nodes}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", required=True, help="a directory under SHARED_DIR (created)")
    parser.add_argument("--address", default=None, help="the Ray cluster (default: auto, the job's own)")
    args = parser.parse_args(argv)
    print(json.dumps(probe(Path(args.dir), address=args.address), sort_keys=True))
    return 0


def problems(result: dict[str, Any] | None, addrs: list[str]) -> list[str]:
    """What the probe's result says is wrong, one sentence per node of NODE_ADDRS (rank order)."""
    if not result or "nodes" not in result:
        return ["the shared-directory probe gave no result (see job-shared-dir.log)"]
    out = []
    for rank, addr in enumerate(addrs):
        row = result["nodes"].get(addr)
        if row is None:
            out.append(f"node {rank} ({addr}) ran no probe task: it is not an alive node of the Ray cluster")
        elif not row.get("read"):
            out.append(f"node {rank} ({addr}) does not see the head's file in SHARED_DIR: it is not the same directory")
        elif not row.get("wrote"):
            out.append(
                f"node {rank} ({addr})'s file in SHARED_DIR did not reach the head"
                + (f" ({row['error']})" if row.get("error") else "")
            )
    return out


if __name__ == "__main__":
    sys.exit(main())
