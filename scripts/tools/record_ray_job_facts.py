#!/usr/bin/env python3
"""Record how the pinned Ray runs a submitted job's entrypoint and what `--working-dir` costs
(configs/upstream/ray-job.json; issue 18 point 6).

Run in an environment with ray[default]==RAY_VERSION installed:
  python scripts/tools/record_ray_job_facts.py > configs/upstream/ray-job.json
Facts come from the installed sources (inspect), each with its file and line:
- the job supervisor starts the entrypoint with subprocess.Popen(shell=True) and no cwd=, so a relative script
  path resolves against the supervisor actor's working directory, not where `ray job submit` ran;
- a working_dir is zipped and uploaded to the GCS, refused at GCS_STORAGE_MAX_SIZE (the gRPC message limit).
"""

from __future__ import annotations

import datetime
import inspect
import json
import sys


def line_of(obj, needle: str) -> tuple[str, int]:
    lines, start = inspect.getsourcelines(obj)
    for offset, text in enumerate(lines):
        if needle in text:
            return inspect.getsourcefile(obj), start + offset
    sys.exit(f"{obj!r} no longer contains {needle!r}; read the source again.")


def main() -> None:
    import ray
    from ray._private.runtime_env import packaging
    from ray.dashboard.modules.job.job_supervisor import JobSupervisor

    source = inspect.getsource(JobSupervisor._exec_entrypoint)
    popen_file, popen_line = line_of(JobSupervisor._exec_entrypoint, "subprocess.Popen(")
    call = source[source.index("subprocess.Popen(") :]
    call = call[: call.index(")\n")]
    _, limit_line = line_of(packaging._store_package_in_gcs, ">= GCS_STORAGE_MAX_SIZE")

    def relative(path: str) -> str:  # inside site-packages
        return path[path.rindex("/site-packages/") + len("/site-packages/") :]

    record = {
        "what": "How the pinned Ray runs a submitted job's entrypoint (its working directory) and what a "
        "--working-dir upload is limited by. Used by polarstack.train.plan (absolute entrypoint, no --working-dir) and "
        "make verify-offline.",
        "ray_version": ray.__version__,
        "recorded_on": datetime.date.today().isoformat(),
        "recorded_with": "scripts/tools/record_ray_job_facts.py",
        "entrypoint": {
            "file": relative(popen_file),
            "line": popen_line,
            "shell": "shell=True" in call,
            "sets_cwd": "cwd=" in call,
            "meaning": "JobSupervisor._exec_entrypoint starts the entrypoint as a shell command without cwd=, so it "
            "runs in the supervisor actor's working directory (the job's working_dir when one is given), never the "
            "directory `ray job submit` ran in",
        },
        "working_dir_upload": {
            "file": relative(inspect.getsourcefile(packaging)),
            "line": limit_line,
            "max_bytes": packaging.GCS_STORAGE_MAX_SIZE,
            "meaning": "a working_dir is zipped (honouring .gitignore/.rayignore) and stored in the GCS; a package of "
            "max_bytes or more is refused (ValueError 'Package size ... exceeds the maximum size'), and it is "
            "uploaded again for every submitted job",
        },
    }
    from ray.dashboard.modules.job import cli as job_cli
    from ray.dashboard.modules.job.common import JobStatus
    from ray.dashboard.modules.job.sdk import JobSubmissionClient

    stop_callback = inspect.unwrap(job_cli.stop.callback)
    stop_source = inspect.getsource(stop_callback)
    _, stop_wait_line = line_of(stop_callback, "while True:")
    record["job_status"] = {
        "file": relative(inspect.getsourcefile(JobStatus)),
        "line": inspect.getsourcelines(JobStatus)[1],
        "statuses": [s.value for s in JobStatus],
        "active": [s.value for s in JobStatus if not s.is_terminal()],
        "list_jobs": "list_jobs" in dir(JobSubmissionClient),
        "meaning": "a submitted job is PENDING (runtime env being set up) or RUNNING until it reaches a terminal "
        "status (STOPPED, SUCCEEDED, FAILED); JobSubmissionClient.list_jobs lists every job the cluster ran, each "
        "with submission_id and status",
    }
    record["job_stop"] = {
        "file": relative(inspect.getsourcefile(stop_callback)),
        "line": stop_wait_line,
        "waits_for_terminal": "client.stop_job(job_id)" in stop_source
        and "if no_wait:" in stop_source
        and "JobStatus.STOPPED, JobStatus.SUCCEEDED, JobStatus.FAILED" in stop_source,
        "meaning": "`ray job stop ID` asks the job to stop and, without --no-wait, polls until it is terminal",
    }
    json.dump(record, sys.stdout, indent=2)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
