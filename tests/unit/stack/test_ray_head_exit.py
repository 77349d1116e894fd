"""`ray start --block` ending because one of its subprocesses died says which one and why.

Seen here on a loaded machine: `ray_client_server` gave up waiting for the raylet's registration (a fixed 30 s in ray
2.57.1) and `ray start` killed the rest and exited 1; the error said only ray's last line, "Remaining processes will be
killed.". The log below is ray's own output of that run, shortened."""

import sys

import pytest

from polarstack.errors import ExitCode, StackError
from polarstack.stack import ray_head

pytestmark = pytest.mark.unit

RAY_OUTPUT = (
    "2026-12-07 17:06:36,389\tERR scripts.py:1304 -- \x1b[31mSome Ray subprocesses exited unexpectedly:\x1b[39m\n"
    "2026-12-07 17:06:36,389\tERR scripts.py:86 -- \x1b[31m\x1b[1mray_client_server\x1b[22m\x1b[26m\x1b[39m\x1b[0m"
    "\x1b[2m [exit code=1]\x1b[22m\x1b[0m\n"
    "2026-12-07 17:06:36,390\tERR scripts.py:114 -- \x1b[31m----- BEGIN ray_client_server.err tail (exit code(s)=1) "
    "-----\x1b[39m\n"
    "Traceback (most recent call last):\n"
    '  File "ray/_private/services.py", line 649, in get_node_with_retry\n'
    "    raise RuntimeError(\n"
    "RuntimeError: Timed out waiting for node info for node_id=1475826c0f3e.\n"
    "2026-12-07 17:06:36,391\tERR scripts.py:127 -- \x1b[31m----- END ray_client_server.err tail (exit code(s)=1) "
    "-----\x1b[39m\n"
    "2026-12-07 17:06:36,391\tERR scripts.py:1312 -- \x1b[31mRemaining processes will be killed.\x1b[39m\n"
)


def test_the_reason_names_the_subprocess_and_its_error():
    reason = ray_head.exit_reason(RAY_OUTPUT)
    assert reason == (
        "its ray_client_server (exit code 1) exited with RuntimeError: Timed out waiting for node info for "
        "node_id=1475826c0f3e."
    )
    assert "\x1b" not in reason


def test_without_ray_s_lines_the_last_line_is_kept():
    assert ray_head.exit_reason("starting\nport 6379 is in use\n") == "port 6379 is in use"
    assert ray_head.exit_reason("") == "no output"


def test_start_says_it_when_ray_start_exits(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "ray"
    fake.write_text(f"#!{sys.executable}\nimport sys\nsys.stdout.write({RAY_OUTPUT!r})\nsys.exit(1)\n")
    fake.chmod(0o755)
    with pytest.raises(StackError) as caught:
        ray_head.start(
            ["ray", "start", "--head", "--block"], {}, bin_dir=bin_dir, temp_dir=tmp_path / "t", dashboard_port=1
        )
    assert caught.value.code == ExitCode.ENVIRONMENT
    message = caught.value.message
    assert message.startswith("`ray start` exited with code 1: its ray_client_server (exit code 1) exited with ")
    assert (
        "RuntimeError: Timed out waiting for node info" in message and str(tmp_path / "t" / "ray-start.log") in message
    )


def test_start_gives_the_head_s_session_the_share_asked_before_it_answers(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "ray"
    fake.write_text(f"#!{sys.executable}\nimport sys\nsys.exit(1)\n")
    fake.chmod(0o755)
    asked = []
    monkeypatch.setattr(ray_head, "favour_session", lambda pid, nice: asked.append((pid, nice)) or True)
    for nice in (None, -10):
        with pytest.raises(StackError):
            ray_head.start(
                ["ray", "start", "--head", "--block"],
                {},
                bin_dir=bin_dir,
                temp_dir=tmp_path / str(nice),
                dashboard_port=1,
                session_nice=nice,
            )
    assert [n for _, n in asked] == [-10] and asked[0][0] > 0  # only when asked, with the head's own pid
