"""Start a harness Ray head beside busy sessions, with and without its session favoured: how the measurement in
docs/tests.md was made. `python scripts/tools/ray_head_under_load.py SESSIONS TRIES [--nice N]`.

SESSIONS spinning processes, each in a session of its own (under the kernel's autogroup, one CPU share each, as the
suite's servers and other suites' sessions are), start first; after 20 s each of TRIES heads is started by
`polarstack.stack.ray_head.start` (the harness's start, as test_exposure and test_shared_probe call it) with
`session_nice=N` when given, stopped by its pid, and its outcome printed with the load average. The spinners are
stopped by their pids at the end, whatever happened. Needs the pinned Ray under the cache (`make test-deps`).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from polarstack.errors import StackError
from polarstack.processes import free_port, stop_pid
from polarstack.stack import ray_head


def load() -> str:
    return Path("/proc/loadavg").read_text().split()[0]


def one_try(bin_dir: Path, nice: int | None) -> str:
    base = Path(tempfile.mkdtemp(prefix="ps-rl-", dir="/tmp"))  # Ray's sockets need a short path
    gcs, dashboard = free_port(), free_port()
    command = ray_head.head_command(gcs_port=gcs, dashboard_port=dashboard, num_gpus=0, block=True)
    started = time.monotonic()
    try:
        head = ray_head.start(
            command,
            dict(ray_head.LOOPBACK_ENV),
            bin_dir=bin_dir,
            temp_dir=base,
            dashboard_port=dashboard,
            timeout=240,
            session_nice=nice,
        )
    except StackError as exc:
        return f"FAILED after {time.monotonic() - started:.0f} s: {exc.message[:160]}"
    else:
        head.stop()
        return f"up in {time.monotonic() - started:.0f} s"
    finally:
        shutil.rmtree(base, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sessions", type=int, help="busy sessions to start beside the heads")
    parser.add_argument("tries", type=int, help="heads to start, one after the other")
    parser.add_argument("--nice", type=int, default=None, help="the heads' session_nice (default: none)")
    args = parser.parse_args(argv)
    bin_dir, _ = ray_head.install()
    spinners = [
        subprocess.Popen([sys.executable, "-S", "-c", "while True: pass"], start_new_session=True)
        for _ in range(args.sessions)
    ]
    try:
        time.sleep(20)
        for index in range(args.tries):
            outcome = one_try(bin_dir, args.nice)
            print(f"try {index + 1}: session_nice={args.nice} load={load()}: {outcome}", flush=True)
    finally:
        for spinner in spinners:
            stop_pid(spinner.pid, spinner)
    return 0


if __name__ == "__main__":
    sys.exit(main())
