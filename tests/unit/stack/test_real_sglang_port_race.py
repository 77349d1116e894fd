"""A real sglang server whose HTTP port another process took between the choice and the bind.

Seen in `make test`'s real-engine tier on a loaded machine: uvicorn logged "[Errno 98] error while attempting to bind
on address ('127.0.0.1', PORT): address already in use", sglang's launcher kept waiting on its scheduler, and the
tier's fixture waited out its whole readiness timeout (780 s) for a server that could never answer. The wait now reads
the log between short polls and ends at once (PortTaken); `start` retries a port it chose itself on a fresh one, and
never changes a port the caller passed."""

import subprocess
import sys
import time

import pytest

from polarstack.errors import ExitCode, StackError
from polarstack.processes import free_port, stop_pid
from polarstack.stack import real_sglang

pytestmark = pytest.mark.unit

BIND_LINE = (
    "[2026-12-07 17:11:58] ERROR:    [Errno 98] error while attempting to bind on address ('127.0.0.1', {port}): "
    "address already in use\n[2026-12-07 17:11:58] INFO:     Waiting for application shutdown.\n"
)


@pytest.fixture
def lingering():
    """A process that stays alive and never answers, as sglang's launcher does after the failed bind."""
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    yield process
    stop_pid(process.pid, process, 5)


def test_a_taken_port_ends_the_wait_at_once_naming_it(tmp_path, lingering):
    port = free_port()
    log = tmp_path / "sglang.log"
    log.write_text("INFO:     Application startup complete.\n" + BIND_LINE.format(port=port))
    started = time.monotonic()
    with pytest.raises(real_sglang.PortTaken) as caught:
        real_sglang.wait_ready(f"http://127.0.0.1:{port}", 60, lingering, log)
    assert time.monotonic() - started < 15  # not the 60 s timeout
    assert caught.value.code == ExitCode.ENVIRONMENT
    assert (
        f"could not bind http://127.0.0.1:{port}" in caught.value.message and "another process" in caught.value.message
    )


def test_without_the_bind_failure_the_wait_keeps_its_timeout_and_sentence(tmp_path, lingering):
    port = free_port()
    log = tmp_path / "sglang.log"
    log.write_text("INFO:     Started server process\n")
    started = time.monotonic()
    with pytest.raises(StackError) as caught:
        real_sglang.wait_ready(f"http://127.0.0.1:{port}", 3, lingering, log)
    assert time.monotonic() - started >= 3
    assert not isinstance(caught.value, real_sglang.PortTaken)
    assert caught.value.code == ExitCode.ENVIRONMENT
    assert f"did not become ready (http://127.0.0.1:{port}/health did not answer 2xx within 3 s.)" in (
        caught.value.message
    )


def test_start_retries_a_port_it_chose_and_keeps_one_it_was_given(monkeypatch):
    monkeypatch.setattr(real_sglang, "prepare", lambda progress: None)
    tried: list[int] = []

    def once(name, parser, port, log_path, timeout):
        tried.append(port)
        if len(tried) < 2:
            raise real_sglang.PortTaken(f"port {port} taken", ExitCode.ENVIRONMENT)
        return f"engine on {port}"

    monkeypatch.setattr(real_sglang, "_start_once", once)
    assert real_sglang.start(served_model_name="m", tool_call_parser=None, progress=lambda m: None).startswith(
        "engine on "
    )
    assert len(tried) == 2 and tried[0] != tried[1]

    tried.clear()
    monkeypatch.setattr(
        real_sglang,
        "_start_once",
        lambda *a: (tried.append(a[2]), (_ for _ in ()).throw(real_sglang.PortTaken("taken", ExitCode.ENVIRONMENT))),
    )
    with pytest.raises(real_sglang.PortTaken):
        real_sglang.start(served_model_name="m", tool_call_parser=None, port=34327, progress=lambda m: None)
    assert tried == [34327]  # a given port: no retry on another

    tried.clear()
    with pytest.raises(real_sglang.PortTaken):
        real_sglang.start(served_model_name="m", tool_call_parser=None, progress=lambda m: None)
    assert len(tried) == real_sglang.PORT_RACE_ATTEMPTS
