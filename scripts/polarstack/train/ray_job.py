"""The training job as Ray runs it (issue 18 point 6): no --working-dir upload, nothing relative to a cwd.

configs/upstream/ray-job.json (scripts/tools/record_ray_job_facts.py, from the pinned ray's sources): the job
supervisor starts the entrypoint as a shell command without a cwd of its own (job_supervisor.py
`_exec_entrypoint`), and a --working-dir is zipped and uploaded to the GCS for every job, refused at the gRPC
message limit (packaging.py `_store_package_in_gcs`). slime is installed in the trainer image (pip install -e
/root/slime), so the job needs no working_dir: its entrypoint and every path it is given must be absolute.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from polarstack.pins import pins, repo_root

RECORD = "configs/upstream/ray-job.json"
# One job at a time (the third review's finding A): slime waits for its placement group without a bound
# (slime/ray/placement_group.py at SLIME_COMMIT), so a second job on a cluster whose GPUs a first job holds hangs.
ACTIVE = ("PENDING", "RUNNING")  # Ray's non-terminal JobStatus values (ray-job.json job_status)
SUBMISSION_ID = "@SUBMISSION_ID@"  # in plan.commands' submit; launch.sh puts "$submission_id" (<run>-<attempt>) there


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


def job_control_problems(submit: list[str], script: str, facts: dict[str, Any] | None = None) -> list[str]:
    """Why a rendered launch.sh could leave its job running or hang behind another one; [] if it cannot."""
    facts = facts or record()
    out = []
    if facts.get("job_status", {}).get("active") != list(ACTIVE):
        out.append(
            f"{RECORD} job_status: the pinned Ray's non-terminal statuses are "
            f"{facts.get('job_status', {}).get('active')}, polarstack refuses a second job while one is {list(ACTIVE)}"
        )
    if not facts.get("job_stop", {}).get("waits_for_terminal"):
        out.append(f"{RECORD} job_stop: `ray job stop` no longer waits until the job is terminal")
    if f"--submission-id={SUBMISSION_ID}" not in submit:
        out.append("ray job submit has no --submission-id, so nothing can stop this attempt's job by its id")
    if "ray job stop" not in script or "trap cleanup EXIT" not in script:
        out.append("launch.sh's EXIT trap does not `ray job stop` the attempt's job")
    for signal in ("INT", "TERM", "HUP"):
        if f"trap 'exit {128 + SIGNALS[signal]}' {signal}" not in script:
            out.append(f"launch.sh does not exit (running its EXIT trap) on SIG{signal}")
    return out


SIGNALS = {"HUP": 1, "INT": 2, "TERM": 15}


def active_jobs(address: str) -> list[dict[str, str]]:
    """The jobs of the Ray cluster at `address` that are PENDING or RUNNING (inside the trainer). The client sends the
    stack's token itself: under RAY_AUTH_MODE=token (the trainer's environment) the pinned SDK adds the Authorization
    header read from RAY_AUTH_TOKEN_PATH (ray/dashboard/modules/dashboard_sdk.py, SubmissionClient.__init__ with
    get_auth_headers_if_auth_enabled; configs/upstream/ray-auth.json)."""
    from ray.job_submission import JobSubmissionClient  # only the trainer image has ray (the host has none)

    jobs = JobSubmissionClient(address).list_jobs()
    return [{"submission_id": str(j.submission_id), "status": str(j.status)} for j in jobs if str(j.status) in ACTIVE]


def active_sentence(jobs: list[dict[str, str]], address: str) -> str:
    names = ", ".join(f"{j['submission_id']} ({j['status']})" for j in jobs)
    return (
        f"the trainer's Ray cluster still has job {names}, and a second job would wait for its GPUs forever "
        "(slime's placement group has no timeout): let it end, or stop it with `docker compose exec trainer ray job "
        f"stop --address={address} {jobs[0]['submission_id']}`, then rerun"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="print the Ray cluster's PENDING or RUNNING jobs as JSON")
    parser.add_argument("--address", required=True, help="the Ray dashboard, http://127.0.0.1:PORT")
    args = parser.parse_args(argv)
    try:
        jobs = active_jobs(args.address)
    except Exception as exc:  # the dashboard not answering (yet): the caller says it could not check
        print(f"polarstack: the Ray jobs at {args.address} could not be listed ({exc})", file=sys.stderr)
        return 1
    print(json.dumps(jobs))
    return 0


if __name__ == "__main__":
    sys.exit(main())


__all__ = [
    "ACTIVE",
    "RECORD",
    "SUBMISSION_ID",
    "active_jobs",
    "active_sentence",
    "job_control_problems",
    "problems",
    "record",
]
