"""The training job as Ray runs it (issue 18 point 6): no --working-dir upload, nothing relative to a cwd.

configs/upstream/ray-job.json (scripts/tools/record_ray_job_facts.py, from the pinned ray's sources): the job
supervisor starts the entrypoint as a shell command without a cwd of its own (job_supervisor.py
`_exec_entrypoint`), and a --working-dir is zipped and uploaded to the GCS for every job, refused at the gRPC
message limit (packaging.py `_store_package_in_gcs`). slime is installed in the trainer image (pip install -e
/root/slime), so the job needs no working_dir: its entrypoint and every path it is given must be absolute.
"""

from __future__ import annotations

import json
from typing import Any

from polarstack.pins import pins, repo_root

RECORD = "configs/upstream/ray-job.json"


def record() -> dict[str, Any]:
    return json.loads((repo_root() / RECORD).read_text(encoding="utf-8"))


def problems(submit: list[str], facts: dict[str, Any] | None = None) -> list[str]:
    """Why `ray job submit ...` (a rendered command) depends on a working directory or uploads one; [] if not."""
    facts = facts or record()
    out = []
    if facts.get("ray_version") != pins().get("RAY_VERSION"):
        out.append(
            f"{RECORD} was recorded for ray {facts.get('ray_version')}; rerun scripts/tools/record_ray_job_facts.py"
        )
    split = submit.index("--") if "--" in submit else len(submit)
    options, entrypoint = submit[:split], submit[split + 1 :]
    if any(o == "--working-dir" or o.startswith("--working-dir=") for o in options) or any(
        '"working_dir"' in o for o in options
    ):
        limit = facts["working_dir_upload"]["max_bytes"] // (1024 * 1024)
        out.append(
            "the job passes a working_dir: Ray zips and uploads it to the GCS for every job and refuses it at "
            f"{limit} MiB ({facts['working_dir_upload']['file']}); slime is installed in the image, drop it"
        )
    script = next((t for t in entrypoint[1:2] if t.endswith(".py")), None) if entrypoint else None
    relative = [t for t in entrypoint[1:] if "/" in t and not t.startswith("/") and "://" not in t]
    if script is not None and not script.startswith("/"):
        relative.insert(0, script)
    if relative and not facts["entrypoint"]["sets_cwd"]:
        out.append(
            f"the job's entrypoint uses relative paths ({', '.join(dict.fromkeys(relative))}), but Ray starts it "
            f"without a working directory of its own ({facts['entrypoint']['file']}:{facts['entrypoint']['line']})"
        )
    return out


__all__ = ["RECORD", "problems", "record"]
