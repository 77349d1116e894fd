"""Pins that hostile or careless inputs end with a documented exit code and one sentence, never "internal
error" (exit 1), a traceback or a run without end (issue 12, points 11 and 12).

Each case is one named test: malformed URLs, non-finite or negative numbers, uncapped counts, deeply nested
JSON answers, non-UTF-8 profile files, bad NODE_GPUS, ports beyond 65535 or shared by two services, a closed
stdout pipe, task ids that collide or escape the tasks folder, and `make` hiding the real exit code.
"""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from polarstack.cli.main import BROKEN_PIPE, main
from polarstack.errors import ExitCode, StackError
from polarstack.pins import repo_root
from polarstack.reward import tasks
from polarstack.stack import profiles

pytestmark = pytest.mark.unit


def exit_code(argv: list[str]) -> int:
    """main()'s code, including argparse's rejections (SystemExit 2 = USAGE)."""
    try:
        return main(argv)
    except SystemExit as exc:
        return int(exc.code or 0)


def assert_usage(argv: list[str], capsys, needle: str) -> None:
    code = exit_code(argv)
    err = capsys.readouterr().err
    assert code == ExitCode.USAGE, err
    assert needle in err and "internal error" not in err and "Traceback" not in err


# --- URLs ----------------------------------------------------------------------------------------------------


def test_url_port_with_letters_is_usage(capsys):
    assert_usage(["smoke", "--base-url", "http://127.0.0.1:80a"], capsys, "--base-url")


def test_unclosed_ipv6_bracket_is_usage(capsys):
    assert_usage(["smoke", "--base-url", "http://[::1"], capsys, "--base-url")


def test_url_with_control_character_is_usage(capsys):
    assert_usage(["smoke", "--base-url", "http://127.0.0.1:9/\x07v1"], capsys, "control")
    assert_usage(["probe", "--direct", "http://127.0.0.1:9\n", "--via", "http://127.0.0.1:9"], capsys, "--direct")


def test_url_with_non_utf8_bytes_is_usage(capsys):
    undecodable = os.fsdecode(b"http://127.0.0.1:9/\xff")  # how Python hands a non-UTF-8 argv byte to argparse
    assert_usage(["smoke", "--base-url", undecodable], capsys, "UTF-8")


def test_url_port_out_of_range_is_usage(capsys):
    assert_usage(["smoke", "--base-url", "http://127.0.0.1:70000"], capsys, "--base-url")


# --- numbers -------------------------------------------------------------------------------------------------


def test_timeout_nan_is_usage(capsys):
    assert_usage(["smoke", "--base-url", "http://127.0.0.1:9", "--timeout", "nan"], capsys, "--timeout")
    assert_usage(["smoke", "--base-url", "http://127.0.0.1:9", "--timeout", "inf"], capsys, "--timeout")


def test_negative_timeouts_are_usage_not_task_data(capsys):
    assert_usage(["verify", "--task", "humaneval", "--timeout", "-1"], capsys, "--timeout")
    assert_usage(["smoke", "--base-url", "http://127.0.0.1:9", "--timeout", "-1"], capsys, "--timeout")
    assert_usage(["up", "--profile", "engine-direct", "--timeout", "0"], capsys, "--timeout")


def test_turns_are_capped(capsys):
    assert_usage(["smoke", "--base-url", "http://127.0.0.1:9", "--turns", "100000"], capsys, "--turns")
    assert_usage(["smoke", "--base-url", "http://127.0.0.1:9", "--requests", "100000"], capsys, "--requests")


def test_negative_max_tokens_is_usage(capsys):
    assert_usage(["smoke", "--base-url", "http://127.0.0.1:9", "--max-tokens", "-5"], capsys, "--max-tokens")


# --- answers -------------------------------------------------------------------------------------------------


class _NestedJSON(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 (http.server's naming)
        body = b"[" * 100000 + b"]" * 100000
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_deeply_nested_json_answer_is_malformed(capsys):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _NestedJSON)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        code = main(["smoke", "--base-url", f"http://127.0.0.1:{server.server_port}", "--timeout", "5"])
    finally:
        server.shutdown()
        server.server_close()
    err = capsys.readouterr().err
    assert code == ExitCode.MALFORMED, err
    assert "nested" in err and "internal error" not in err


# --- configuration -------------------------------------------------------------------------------------------


def _profile_copy(tmp_path: Path, name: str = "patched-router") -> Path:
    path = tmp_path / f"{name}.env"
    path.write_bytes((profiles.profiles_dir() / f"{name}.env").read_bytes())
    return path


def test_non_utf8_profile_file_is_usage(tmp_path):
    path = _profile_copy(tmp_path)
    path.write_bytes(path.read_bytes() + b"# caf\xe9\n")
    with pytest.raises(StackError) as exc:
        profiles.load("patched-router", path=path)
    assert exc.value.code == ExitCode.USAGE and "UTF-8" in exc.value.message


def test_node_gpus_not_a_number_is_usage(monkeypatch, capsys):
    monkeypatch.setenv("NODE_GPUS", "abc")
    code = exit_code(["train", "--task", "humaneval", "--profile", "engine-direct", "--runtime", "docker", "--dry-run"])
    err = capsys.readouterr().err
    assert code == ExitCode.USAGE and "NODE_GPUS" in err, err
    from polarstack.stack import cluster, compose

    with pytest.raises(StackError) as exc:
        compose.render_values(profiles.load("engine-direct", node_gpus=4), cluster.load(), cpu=False)
    assert exc.value.code == ExitCode.USAGE and "NODE_GPUS" in exc.value.message


def test_engine_port_base_beyond_65535_is_usage(monkeypatch):
    monkeypatch.setenv("ENGINE_PORT_BASE", "70000")
    with pytest.raises(StackError) as exc:
        profiles.load("engine-direct")
    assert exc.value.code == ExitCode.USAGE and "65535" in exc.value.message
    monkeypatch.setenv("ENGINE_PORT_BASE", "65530")  # engine-1 would be on 65540
    with pytest.raises(StackError):
        profiles.load("patched-router")


def test_router_port_equal_to_an_engine_port_is_usage(monkeypatch):
    monkeypatch.setenv("ROUTER_PORT", "30010")
    with pytest.raises(StackError) as exc:
        profiles.load("patched-router")
    assert exc.value.code == ExitCode.USAGE and "engine 1" in exc.value.message
    monkeypatch.setenv("ROUTER_PORT", "29999")  # its metrics port (ROUTER_PORT + 1) would be engine-0's
    with pytest.raises(StackError):
        profiles.load("patched-router")


# --- output ------------------------------------------------------------------------------------------------


def test_output_into_a_closed_pipe_is_broken_pipe_not_internal_error(tmp_path):
    """`polarstack ... | head`: the reader goes away; the CLI exits 141 (as a shell shows SIGPIPE) silently."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "polarstack", "routers", "catalog", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "HOME": str(tmp_path)},
    )
    proc.stdout.close()  # the reader is gone before the first line is written
    err = proc.stderr.read().decode()
    proc.wait(timeout=60)
    assert proc.returncode == BROKEN_PIPE, err
    assert "internal error" not in err and "Traceback" not in err and "Exception ignored" not in err


# --- task ids ----------------------------------------------------------------------------------------------


def _mbpp(tmp_path: Path, ids: list[object]) -> Path:
    base = json.loads((Path(__file__).parents[1] / "fixtures" / "mbpp_sample.jsonl").read_text().splitlines()[0])
    source = tmp_path / "tasks.jsonl"
    source.write_text("".join(json.dumps(dict(base, task_id=task_id)) + "\n" for task_id in ids))
    return source


def test_task_ids_that_differ_only_in_punctuation_get_their_own_workspace(tmp_path):
    out = tmp_path / "out"
    tasks.prepare("mbpp", out, source=_mbpp(tmp_path, ["a/b", "a_b", "a b"]))
    rows = [json.loads(line) for line in (out / "train.jsonl").read_text().splitlines()]
    names = [row["metadata"]["workspace"] for row in rows]
    assert len(set(names)) == 3, names
    for row in rows:  # each id's hidden tests are its own, none overwritten
        problem = json.loads((out / "eval" / row["metadata"]["workspace"] / "problem.json").read_text())
        assert problem == row["metadata"]["problem"]
    assert sorted(p.name for p in (out / "eval").iterdir() if p.is_dir()) == sorted(names)


@pytest.mark.parametrize("task_id", ["..", ".", " ", "../.."])
def test_task_ids_that_name_no_folder_never_write_outside_it(tmp_path, task_id):
    out = tmp_path / "out"
    try:
        tasks.prepare("mbpp", out, source=_mbpp(tmp_path, [task_id]))
    except StackError as exc:
        assert exc.code == ExitCode.TASK_DATA
        return
    for sub in ("workspaces", "eval"):  # accepted ids land in a folder of their own under each
        folders = [p for p in (out / sub).iterdir() if p.is_dir()]
        assert len(folders) == 1 and folders[0].parent == out / sub and folders[0].name not in (".", "..")
    assert not (out / "solution.py").exists() and not (out / "problem.json").exists()


def test_dot_dot_task_id_is_task_data(tmp_path):
    with pytest.raises(StackError) as exc:
        tasks.prepare("mbpp", tmp_path / "out", source=_mbpp(tmp_path, [".."]))
    assert exc.value.code == ExitCode.TASK_DATA


# --- make ----------------------------------------------------------------------------------------------------


def test_make_names_the_real_exit_code(tmp_path):
    """Through make, every failure exits 2; the recipe's stderr must name the CLI's own code (here 5)."""
    venv = Path(sys.executable).parent.parent
    proc = subprocess.run(
        ["make", "-o", f"{venv}/.installed", f"VENV={venv}", "smoke", "BASE_URL=http://127.0.0.1:9"],
        cwd=repo_root(),
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "POLARSTACK_RUN_DIR": str(tmp_path)},
    )
    assert proc.returncode == 2, proc.stderr
    assert f"polarstack exited with code {int(ExitCode.UNREACHABLE)} (UNREACHABLE)" in proc.stderr, proc.stderr


def test_a_closed_pipe_met_only_at_the_final_flush_is_still_broken_pipe(monkeypatch):
    """Short output (the router catalog is under stdout's 8 KiB buffer) reaches a closed pipe only when stdout is
    flushed; that flush happens inside the CLI, so it exits 141, not 120 from the interpreter's flush at exit (seen in
    CI under pytest -n 4)."""
    import io

    from polarstack.cli.main import BROKEN_PIPE, main

    class ClosedPipe(io.RawIOBase):
        def writable(self):
            return True

        def write(self, data):
            raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(io.BufferedWriter(ClosedPipe()), encoding="utf-8"))
    assert main(["routers", "catalog", "--json"]) == BROKEN_PIPE
