"""Pins the CLI's wiring (issue 14 point 2): handlers take the command line from `main`'s arguments (never
sys.argv), so a report that records its command (bench, routers matrix) records the one that was run, also
in-process; and the render module draws the bench table from the same cells the Markdown report uses."""

import argparse
import json
import sys

import pytest

from polarstack.bench import compare
from polarstack.cli import bench as cli_bench
from polarstack.cli.main import build_parser

pytestmark = pytest.mark.unit


def test_the_recorded_command_is_the_one_main_was_given(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["pytest", "-q", "something-else"])  # what sys.argv holds in-process
    args = build_parser().parse_args(["bench", "--routing", "--out", str(tmp_path), "--json"])
    args.command_words = ["bench", "--routing", "--out", str(tmp_path), "--json"]
    seen = {}

    def write(data, out, command):
        seen["command"], seen["out"] = command, out
        return {}

    assert cli_bench.write_and_show(args, {"x": 1}, write, lambda data, paths: None) == 0
    assert seen["command"] == f"polarstack bench --routing --out {tmp_path} --json"
    assert seen["out"] == tmp_path and json.loads(capsys.readouterr().out) == {"x": 1}
    args = argparse.Namespace(command_words=["bench"], out=str(tmp_path), json=False)
    cli_bench.write_and_show(args, {}, write, lambda data, paths: None)
    assert seen["command"] == "polarstack bench"


def test_spread_is_median_and_range():
    assert compare.spread({"median": 1.23456, "min": 1.0, "max": 2.0}) == "1.235 (1.000-2.000)"
    assert compare.spread({"median": 10.4, "min": 9.6, "max": 11.5}, 0) == "10 (10-12)"


def test_progress_lines_reach_a_pipe_while_the_command_still_runs():
    """`make demo ENGINE=sglang | tee demo.log` prints progress for minutes: each line must arrive when printed.
    A command whose handler prints one line and then works for 300 s must show that line long before it ends; with
    stdout block-buffered (a pipe's default) the line would come only at exit, after the 60 s this test waits."""
    import os
    import select
    import subprocess
    from pathlib import Path

    from polarstack.processes import stop_pid

    script = (
        "import sys, time\n"
        "import polarstack.cli.local as local\n"
        "def slow(args):\n"
        "    print('demo: first profile')\n"
        "    time.sleep(300)\n"
        "    return 0\n"
        "local._cmd_demo = slow  # looked up when the parser is built, below\n"
        "from polarstack.cli.main import main\n"
        "sys.exit(main(['demo']))\n"
    )
    scripts = Path(__file__).resolve().parents[3] / "scripts"
    # without PYTHONUNBUFFERED (set on some machines), a pipe is block-buffered unless the CLI says otherwise
    env = {**{k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}, "PYTHONPATH": str(scripts)}
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, env=env)
    try:
        ready, _, _ = select.select([proc.stdout], [], [], 60)
        assert ready, "no line within 60 s: stdout is not line-buffered"
        assert proc.stdout.readline() == b"demo: first profile\n"
        assert proc.poll() is None  # the handler still sleeps: the line came when printed, not at exit
    finally:
        stop_pid(proc.pid, proc)
        proc.stdout.close()
