"""Pins the root cause of upstream issue #52 with the REAL router wheels from PyPI, on loopback:
the pinned passthrough (sglang-router 0.1.x) and patched (smg >= 1.5) releases forward Polar's request fields
and smoke passes through them; the pinned stock release (slime's floor, sglang-router 0.3.x) drops them, smoke fails with TOKENS_MISSING naming both, and the engine's request log
shows the fields never arrived. Also: Polar's worker bypass, smg's model check, probe's diagnosis."""

import json

import pytest

from polarstack.cli.main import main
from polarstack.errors import ExitCode
from polarstack.pins import pin

pytestmark = pytest.mark.router

# The releases the profiles pin (configs/pins.env), so these tests follow a pin change.
PASSTHROUGH, PATCHED, STOCK = (
    f"{pin(k + '_PACKAGE')}=={pin(k + '_VERSION')}" for k in ("ROUTER_PASSTHROUGH", "ROUTER_PATCHED", "ROUTER_STOCK")
)


def smoke(capsys, url, *extra):
    code = main(["smoke", "--base-url", url, "--json", *extra])
    out, err = capsys.readouterr()
    return code, json.loads(out), err


@pytest.mark.parametrize("spec", [PASSTHROUGH, PATCHED])
def test_smoke_passes_through_forwarding_routers(engine, router_factory, capsys, spec):
    router = router_factory(spec, [engine.url])
    engine.clear()
    code, report, err = smoke(capsys, router.url)
    assert code == 0, err
    assert report["trainable_tokens"] > 0
    received = [r for r in engine.requests() if "tools" not in r["body"]]
    assert len(received) == 4
    assert all(r["body"]["return_prompt_token_ids"] is True and r["body"]["return_meta_info"] is True for r in received)
    # plus the smoke's two requests carrying the agent's tools (issue 10 point 4, issue 32 point 6: unpadded and
    # agent-length), answered with parsed tool_calls
    assert len([r for r in engine.requests() if "tools" in r["body"]]) == 2


def test_smoke_fails_through_stock_router_with_the_request_diagnosis(engine, router_factory, capsys):
    router = router_factory(STOCK, [engine.url])
    engine.clear()
    code, report, err = smoke(capsys, router.url)
    assert code == ExitCode.TOKENS_MISSING
    assert report["fields_missing"] == ["return_prompt_token_ids", "return_meta_info"]
    assert "return_prompt_token_ids" in err and "return_meta_info" in err and "dropped" in err
    received = engine.requests()
    assert received, "the router forwarded the chat requests"
    assert all("return_prompt_token_ids" not in r["body"] and "return_meta_info" not in r["body"] for r in received)


def test_smoke_direct_passes(engine, capsys):
    code, report, _ = smoke(capsys, engine.url)
    assert code == 0 and report["router_bypassed"] is False


def test_polar_route_bypasses_a_router_that_lists_workers(engine, router_factory, capsys):
    router = router_factory(STOCK, [engine.url])
    code, report, _ = smoke(capsys, router.url, "--route", "polar")
    assert code == 0
    assert report["router_bypassed"] is True and report["targets"] == [engine.url]
    assert any("cache-aware routing is lost" in w for w in report["warnings"])


def test_polar_route_keeps_a_router_without_worker_list(engine, router_factory, capsys):
    router = router_factory(PASSTHROUGH, [engine.url])  # 0.1.4 has no GET /workers
    code, report, _ = smoke(capsys, router.url, "--route", "polar")
    assert code == 0 and report["router_bypassed"] is False and report["targets"] == [router.url]


def test_smg_model_mismatch_is_an_http_error_naming_the_fix(engine, router_factory, capsys):
    router = router_factory(PATCHED, [engine.url])
    code, report, err = smoke(capsys, router.url, "--model", "not-served")
    assert code == ExitCode.HTTP_ERROR
    assert "--model" in err and "not-served" in err


def test_probe_tells_request_loss_from_response_loss(engine, router_factory, capsys):
    router = router_factory(STOCK, [engine.url])
    code = main(["probe", "--direct", engine.url, "--via", router.url, "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == ExitCode.TOKENS_MISSING
    assert report["diagnosis"] == "request fields dropped on the way in"
    assert report["via"]["engine_received_flags"] is False
    assert report["via"]["generate_meta_info_survives"] is True
    assert report["direct"]["bytes"] > report["via"]["bytes"]


def test_behind_sglang_router_0_1_9_the_smoke_reports_every_failure_most_fundamental_first(
    engine, router_factory, capsys
):
    """Issue 18 point 9: the real 0.1.9 wheel drops both request fields (the diagnosis of #52, exit 3) and also
    rejects Polar's tool request (tool_choice "auto") with HTTP 422; the smoke reports both, the token loss first."""
    router = router_factory("sglang-router==0.1.9", [engine.url])
    engine.clear()
    code, report, err = smoke(capsys, router.url)
    last = err.strip().splitlines()[-1]
    assert code == ExitCode.TOKENS_MISSING, err
    assert report["fields_missing"] == ["return_prompt_token_ids", "return_meta_info"]
    assert last.index("return_prompt_token_ids") < last.index("422")  # the dropped fields first, then the 422
    assert "it also found that" in last and "tool_choice" in last
    assert [f["name"] for f in report["failures"]] == ["TOKENS_MISSING", "HTTP_ERROR"]
    assert [r["status"] for r in report["requests"] if r["kind"] == "tools"] == [422]


def test_behind_sglang_router_0_1_5_the_tool_request_is_refused_and_named(engine, router_factory, capsys):
    """Measured with the emulator and with the real engine (tests/sglang/test_real_engine.py used to pin it there):
    sglang-router 0.1.5 refuses the smoke's tool request itself (HTTP 400, "untagged enum ToolChoice"); the smoke
    reports the dropped fields first (exit 3) and names that refusal."""
    router = router_factory("sglang-router==0.1.5", [engine.url])
    code, report, err = smoke(capsys, router.url)
    assert code == ExitCode.TOKENS_MISSING, err
    assert report["fields_missing"] == ["return_prompt_token_ids", "return_meta_info"]
    assert "untagged enum ToolChoice" in err.strip().splitlines()[-1]
    assert [r["status"] for r in report["requests"] if r["kind"] == "tools"] == [400]


def _held_port():
    import socket

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(1)
    return sock, sock.getsockname()[1]


def test_a_metrics_port_taken_after_the_choice_is_retried_on_fresh_ports(engine, router_factory, monkeypatch):
    """The TOCTOU between free_port and the router's bind (seen once in make test): the harness chose the metrics port,
    another process bound it, the router exits "Address already in use"; start retries on fresh ports."""
    from polarstack.processes import free_port
    from polarstack.routers import harness

    holder, taken = _held_port()
    chosen = iter([free_port(), taken])  # the first attempt: its HTTP port, then the metrics port someone holds
    monkeypatch.setattr(harness, "free_port", lambda: next(chosen, None) or free_port())
    try:
        router = router_factory(PATCHED, [engine.url])
    finally:
        holder.close()
    assert router.prometheus_port != taken
    assert "Address already in use" not in router.log_path.read_text(errors="replace")


def test_a_metrics_port_the_caller_passed_is_not_changed(engine, router_factory):
    from polarstack.errors import StackError

    holder, taken = _held_port()
    try:
        with pytest.raises(StackError) as caught:
            router_factory(PATCHED, [engine.url], prometheus_port=taken)
    finally:
        holder.close()
    assert caught.value.code == ExitCode.ENVIRONMENT
    assert f"metrics {taken}" in caught.value.message and "already in use" in caught.value.message


def test_an_smg_router_is_started_only_once_it_has_registered_its_workers(router_factory):
    """smg answers /health before it has registered the --worker-urls it was given (measured: smg 1.4.1, /v1/models
    503 "No models available" meanwhile; a smoke sent then got 404 "No worker available" in a cold CI run). The
    harness returns only once GET /v1/models lists a model: here the engine comes up 4 s after the router."""
    import threading

    import httpx

    from polarstack.processes import free_port, stop_pid
    from polarstack.stack.engines import stack_parser, start_emulator
    from polarstack.stack.profiles import stack_settings

    port = free_port()
    started = []
    parser = stack_parser(stack_settings())
    timer = threading.Timer(4.0, lambda: started.append(start_emulator(port=port, tool_call_parser=parser)))
    timer.start()
    try:
        router = router_factory(PATCHED, [f"http://127.0.0.1:{port}"], timeout=60.0)
        assert started, "the harness returned before the engine even existed"
        reply = httpx.get(f"{router.url}/v1/models", timeout=5, trust_env=False)
        assert reply.status_code == 200 and reply.json()["data"], reply.text
    finally:
        timer.join()
        for process, _ in started:
            stop_pid(process.pid, process)
