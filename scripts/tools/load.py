"""Run a command while this machine is kept loaded: `python scripts/tools/load.py N -- COMMAND...`.

The load generator of issue 34's acceptance ("make test green three times in a row on a machine kept at load 8"):
N processes that spin on the CPU, started before COMMAND and stopped by their pids after it, whatever it exits with;
a load average of about N (plus what COMMAND runs) follows within a minute. It prints the 1-minute load average every
60 s on stderr and exits with COMMAND's exit code (128 + N for a signal).

The spinners stay in this process's session, each in a process group of its own (a signal COMMAND's tests send to
their own group never reaches them). The session matters: where the kernel's autogroup is on
(/proc/sys/kernel/sched_autogroup_enabled, and the cpu cgroup is the root one), the CPU is shared between sessions
first and between tasks of a session second. Spinners in sessions of their own (this tool before 2026-12-04) each
took as much CPU as all of COMMAND: with 8 of them `make test` ran on about a ninth of the machine, not the share a
load of 8 implies, and was at 5% after 19 minutes. In COMMAND's session every spinner and every task of COMMAND get
one share each, which is what a load average of N means.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading


def spinners(count: int) -> list[subprocess.Popen]:
    """`count` spinning processes in this session, each in a process group of its own, at this priority."""
    return [
        subprocess.Popen(
            [sys.executable, "-S", "-c", "while True: pass"],
            process_group=0,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for _ in range(count)
    ]


def stop(processes: list[subprocess.Popen]) -> None:
    """SIGKILL each spinner by its pid (they hold nothing) and reap it."""
    for process in processes:
        if process.poll() is None:
            os.kill(process.pid, signal.SIGKILL)
        process.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("load", type=int, help="spinning processes to keep running (the load average it adds)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command to run, after --")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if args.load < 1 or not command:
        parser.error("give a load of 1 or more and a command after --")
    load = spinners(args.load)
    done = threading.Event()

    def report() -> None:
        while not done.wait(60):
            print(f"load.py: load average {os.getloadavg()[0]:.1f} ({args.load} spinners)", file=sys.stderr, flush=True)

    threading.Thread(target=report, daemon=True).start()
    try:
        returncode = subprocess.call(command)
    finally:
        done.set()
        stop(load)
    return returncode if returncode >= 0 else 128 - returncode


if __name__ == "__main__":
    sys.exit(main())
