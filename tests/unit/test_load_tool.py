"""Pins scripts/tools/load.py, the load generator the repository names for issue 34's loaded runs: its spinners run
while the command runs (in its session, each in a process group of its own), are gone by their pids after it, and the command's exit code
is its own."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

LOAD = Path(__file__).resolve().parents[2] / "scripts" / "tools" / "load.py"

# The command: the spinners are this process's siblings, children of load.py (its parent), each a group leader.
PROBE = r"""
import json, os, sys
parent = os.getppid()
kids = []
for entry in os.listdir("/proc"):
    if entry.isdigit() and int(entry) != os.getpid():
        try:
            stat = open("/proc/%s/stat" % entry).read()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        if int(fields[1]) == parent and fields[0] != "Z":
            kids.append({"pid": int(entry), "group": int(fields[2]), "session": int(fields[3])})
print(json.dumps({"kids": kids, "session": os.getsid(0), "group": os.getpgid(0)}))
sys.exit(int(sys.argv[1]))
"""


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2 :].split()[0] != "Z"


def test_spinners_run_beside_the_command_and_are_gone_after_it():
    proc = subprocess.run(
        [sys.executable, str(LOAD), "3", "--", sys.executable, "-c", PROBE, "7"], capture_output=True, text=True
    )
    assert proc.returncode == 7, proc.stderr  # the command's own exit code
    seen = json.loads(proc.stdout)
    spinners = seen["kids"]
    assert len(spinners) == 3, spinners
    # in the command's session (one CPU share each under autogroup), each leading a process group of its own
    assert all(s["session"] == seen["session"] and s["pid"] == s["group"] != seen["group"] for s in spinners), seen
    assert not any(_alive(s["pid"]) for s in spinners), spinners


def test_a_load_below_one_or_no_command_is_refused():
    for args in (["0", "--", "true"], ["2"]):
        proc = subprocess.run([sys.executable, str(LOAD), *args], capture_output=True, text=True)
        assert proc.returncode == 2 and "give a load of 1 or more" in proc.stderr, proc.stderr
