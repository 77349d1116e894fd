"""`polarstack routers matrix`: upstream issue #52's bisection as one command, rerunnable when a router ships.

Every release runs on loopback in front of the engine emulator (the default) or the real pinned sglang on the CPU
(`--engine sglang`, issue 21), and is measured on the same questions as ../shared/reference/router-behavior.md.
A release that cannot install or start is a row saying so.

What reached the engine is read from the emulator's own request log; the real engine keeps none, so there the
router's worker is a recording relay in front of it (polarstack.bench.tap), which also stands in for the
emulator's `always_extensions` fault by setting Polar's flags on the way to the engine.

`request_at_engine` (issue 32 point 10): for Polar's own request shapes (POLAR_SHAPES: the chat request as
contract.prepare_request builds it, and the smoke's unpadded tool request), the values that reached the engine
against the values sent, so a router that changes a value shows (smg from 1.8.0 strips SGLang fields whose value
is false or null; a key list, `request_keys_at_engine`, shows a dropped key but never a rewritten value).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import httpx

from polarstack.bench import tap
from polarstack.checks import tool_exchange
from polarstack.checks.measure import (
    ENGINE_LOG,
    ISSUE_52_BODY,
    carries_polar_flags,
    generate_body,
    generate_keeps_tokens,
    interleaved_latency,
    latency_summary,
    machine,
)
from polarstack.engine.emulator.engine import DEFAULT_MODEL
from polarstack.errors import ExitCode, StackError
from polarstack.paths import cache_dir
from polarstack.polar import contract
from polarstack.polar.contract import POLAR_REQUEST_FLAGS
from polarstack.processes import child_env, free_port, startup_seconds, stop_pid, wait_http
from polarstack.routers import worker_api
from polarstack.routers.catalog import PACKAGES, RouterRelease, version_tuple
from polarstack.routers.harness import install, is_installed
from polarstack.routers.harness import start as start_router
from polarstack.stack import real_sglang
from polarstack.stack.engines import stack_parser, start_emulator

ENGINES = ("emulator", "sglang")

SGLANG_ROUTER_RANGE = ((0, 1, 0), (0, 3, 2))  # the range issue #52 swept
COLUMNS = [
    ("release", "release"),
    ("installs", "installs"),
    ("starts", "starts"),
    ("chat_flags_reach_engine", "chat return_* flags reach engine"),
    ("chat_fields_reach_client", "prompt_token_ids/meta_info reach client"),
    ("fields_survive_when_emitted", "fields survive if engine always emits them"),
    ("generate_keeps_tokens", "/generate output_ids + meta_info"),
    ("completions_flags_reach_engine", "/v1/completions extra flags reach engine"),
    ("post_workers", "POST /workers registration"),
    ("startup_s", "startup s"),
    ("added_median_ms", "added median ms"),
    ("added_p99_ms", "added p99 ms"),
]


def available_releases(package: str) -> list[str]:
    """Every version of `package` the package index lists (`pip index versions`)."""
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "index", "versions", package, "--disable-pip-version-check"],
        capture_output=True,
        text=True,
        env=child_env(),
    )
    for line in proc.stdout.splitlines():
        if line.strip().startswith("Available versions:"):
            return [v.strip() for v in line.split(":", 1)[1].split(",") if v.strip()]
    raise StackError(
        f"could not list {package} releases from the package index; check that PyPI is reachable.", ExitCode.ENVIRONMENT
    )


def default_releases() -> list[RouterRelease]:
    """sglang-router 0.1.0-0.3.2 and every smg release, oldest first."""
    releases = []
    lo, hi = SGLANG_ROUTER_RANGE
    for version in available_releases("sglang-router"):
        if lo <= version_tuple(version) <= hi:
            releases.append(RouterRelease("sglang-router", version))
    releases += [RouterRelease("smg", v) for v in available_releases("smg")]
    return sorted(releases, key=lambda r: (PACKAGES.index(r.package), version_tuple(r.version)))


def served_model(settings: Mapping[str, str]) -> str:
    """The model name the matrix's requests carry and its engines serve: the stack's SERVED_MODEL_NAME in `settings`
    (the caller's stack settings: the site's, profiles.stack_settings)."""
    return settings.get("SERVED_MODEL_NAME") or DEFAULT_MODEL


@dataclass
class Engines:
    """The worker the router fronts (`url`, whose request log is at `log_path`) and a spare worker for the
    registration question. `engine`: emulator, or sglang (then both URLs are recording relays to one real server)."""

    engine: str
    url: str
    spare_url: str
    log_path: str
    timeout: float  # seconds per request: the real engine on a shared 2-core CPU needs more than the emulator
    model: str  # the model they serve, which the matrix's requests carry (served_model)

    def received(self, http: httpx.Client, path: str) -> list[dict[str, Any]]:
        return http.get(f"{self.url}{self.log_path}", params={"path": path}).json()["requests"]

    def forget(self, http: httpx.Client) -> None:
        http.delete(f"{self.url}{self.log_path}")

    def emit_unasked(self, http: httpx.Client, on: bool) -> None:
        """Make the engine answer with Polar's token fields although the request through the router lacks the
        flags: the emulator's fault, or the relay setting the flags on the way to the real engine."""
        if self.engine == "emulator":
            http.post(f"{self.url}/_emulator/fault", json={"mode": "always_extensions" if on else "none"})
        else:
            http.post(f"{self.url}{tap.MODE}", json={"add_flags": on}).raise_for_status()


# What the relay needs to answer /health through itself on a quiet machine, with a margin: the base of the rule.
TAP_START_SECONDS = 30.0


def start_tap(upstream: str, timeout: float | None = None) -> tuple[subprocess.Popen, str]:
    """A recording relay on 127.0.0.1 in front of `upstream`; (process, url) once /health answers through it (within
    `timeout`, by default processes.startup_seconds(TAP_START_SECONDS): the machine's rule)."""
    if timeout is None:
        timeout = startup_seconds(TAP_START_SECONDS)
    port = free_port()
    cmd = [sys.executable, "-m", "polarstack.bench.tap", "--port", str(port), "--upstream", upstream]
    log_path = cache_dir() / "logs" / f"tap-{port}.log"  # a relay's own failure shows here, not only as a 502
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "wb") as log:
        process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=child_env())
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(url, timeout, process)
    except BaseException:
        stop_pid(process.pid, process)
        raise
    return process, url


def check_real_engine(url: str) -> None:
    """Refuse an --engine-url that is not the pinned real sglang: nothing answering, the emulator (which would be
    reported as sglang), or another sglang version (its GET /get_server_info `version`)."""
    pinned = real_sglang.version()
    with httpx.Client(timeout=10, trust_env=False) as http:
        try:
            http.get(f"{url}/health").raise_for_status()
            info = http.get(f"{url}/get_server_info")
            emulated = http.get(f"{url}{ENGINE_LOG}").status_code == 200
        except httpx.HTTPError:
            raise StackError(
                f"no real sglang server answers /health at {url}; start one or drop --engine-url.",
                ExitCode.UNREACHABLE,
            ) from None
    if emulated:
        raise StackError(
            f"{url} is the engine emulator (it answers {ENGINE_LOG}); --engine-url names a real sglang server, "
            "or drop --engine sglang to measure in front of the emulator.",
            ExitCode.USAGE,
        )
    try:
        version = info.json().get("version") if info.is_success else None
    except ValueError:
        version = None
    if version != pinned:
        raise StackError(
            f"the server at {url} reports sglang {version or '(no version)'} on /get_server_info, not the pinned "
            f"{pinned}; start the pinned one (polarstack up --engine sglang) or drop --engine-url.",
            ExitCode.ENVIRONMENT,
        )


@contextlib.contextmanager
def engines_for(
    engine: str,
    progress: Callable[[str], None] = print,
    engine_url: str | None = None,
    *,
    settings: Mapping[str, str],
) -> Iterator[Engines]:
    """Start the matrix's engines, and stop them by pid afterwards whichever way the sweep ends. The emulator: two
    emulators. sglang: one real server (about 4 GB) with two relays in front of it, so the spare worker is a second
    address of the same engine and everything the router sends goes through a relay. `engine_url`: a real server
    already running (serving the stack's SERVED_MODEL_NAME) to put the relays in front of instead of starting one.
    `settings`: the stack's settings (the site's): the model the engines serve and their tool-call parser."""
    if engine not in ENGINES:
        raise StackError(f"unknown engine {engine!r}; use one of {', '.join(ENGINES)}.", ExitCode.USAGE)
    if engine_url and engine != "sglang":
        raise StackError(
            "--engine-url names a running real sglang server; use it with --engine sglang.", ExitCode.USAGE
        )
    stops: list[Callable[[], None]] = []
    try:
        if engine == "emulator":
            urls = []
            for seed in (0, 1):
                process, port = start_emulator(
                    seed=seed, model=served_model(settings), tool_call_parser=stack_parser(settings)
                )
                stops.append(lambda p=process: stop_pid(p.pid, p))
                urls.append(f"http://127.0.0.1:{port}")
            yield Engines(engine, urls[0], urls[1], ENGINE_LOG, timeout=10.0, model=served_model(settings))
            return
        if engine_url:
            upstream = engine_url.rstrip("/")
            check_real_engine(upstream)
        else:
            server = real_sglang.start(
                served_model_name=served_model(settings),
                tool_call_parser=stack_parser(settings),  # as the engines run (compose.yaml)
                progress=progress,
            )
            stops.append(server.stop)
            progress(f"routers matrix: real {real_sglang.spec()} on {server.url}, ready in {server.startup_seconds} s")
            upstream = server.url
        relays = []
        for _ in range(2):
            process, url = start_tap(upstream)
            stops.append(lambda p=process: stop_pid(p.pid, p))
            relays.append(url)
        yield Engines(
            engine, relays[0], relays[1], tap.LOG, timeout=real_sglang.SMOKE_TIMEOUT, model=served_model(settings)
        )
    finally:
        for stop in reversed(stops):
            stop()


# Request fields whose values are too long for a row: recorded as a digest of the value (equal digests, equal values).
BULKY_FIELDS = ("messages", "tools")


def polar_shapes(model: str) -> dict[str, dict[str, Any]]:
    """Polar's recorded request shapes as the engine should get them: a chat request (contract.prepare_request:
    stream false, logprobs true, both return_* flags true) and the smoke's unpadded tool request (the agent's 12
    tools, tool_choice auto, temperature 0), each with a small max_tokens."""
    chat = contract.prepare_request(
        {"model": model, "messages": [{"role": "user", "content": "Say hi in 5 words"}], "max_tokens": 8}
    )
    return {"chat": chat, "tools": tool_exchange.tool_request(model, max_tokens=8)}


def _digest(value: Any) -> str:
    return "sha256:" + hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:16]


def value_record(sent: dict[str, Any], received: dict[str, Any] | None) -> dict[str, Any]:
    """What reached the engine, by value: every field's value (BULKY_FIELDS as digests) and, against what was
    sent, the fields dropped, added and changed (a changed value is listed with both values)."""
    if received is None:
        return {"reached": False}

    def shown(body: dict[str, Any]) -> dict[str, Any]:
        return {k: _digest(v) if k in BULKY_FIELDS else v for k, v in sorted(body.items())}

    return {
        "reached": True,
        "values": shown(received),
        "dropped": sorted(set(sent) - set(received)),
        "added": sorted(set(received) - set(sent)),
        "changed": {
            k: {"sent": shown(sent)[k], "at_engine": shown(received)[k]}
            for k in sorted(set(sent) & set(received))
            if sent[k] != received[k]
        },
    }


def _shapes_at_engine(http: httpx.Client, router_url: str, engines: "Engines", model: str) -> dict[str, Any]:
    out = {}
    for name, body in polar_shapes(model).items():
        engines.forget(http)
        reply = _retrying_post(http, f"{router_url}/v1/chat/completions", body)
        received = engines.received(http, "/v1/chat/completions")
        record = value_record(body, received[-1]["body"] if received else None)
        record["status"] = getattr(reply, "status_code", None)
        out[name] = record
    return out


def _yes(value: bool | None) -> str:
    return {True: "yes", False: "no", None: "n/a"}[value]


def measure(release: RouterRelease, engines: Engines, latency_requests: int = 200) -> dict[str, Any]:
    row: dict[str, Any] = {
        "release": release.spec,
        "package": release.package,
        "version": release.version,
        "engine": engines.engine,
    }
    started = time.perf_counter()
    try:
        cached = is_installed(release)
        install(release)
        row["installs"] = True
        row["install_s"] = None if cached else round(time.perf_counter() - started, 2)
    except StackError as exc:
        row.update(installs=False, starts=None, note=exc.message)
        return row
    try:
        router = start_router(release, [engines.url])
    except StackError as exc:
        row.update(starts=False, note=exc.message)
        return row
    row.update(starts=True, startup_s=round(router.startup_seconds, 3))
    http = httpx.Client(timeout=engines.timeout, trust_env=False)
    step = "setup"
    try:
        step = "chat with Polar's flags"
        model = engines.model
        body = dict(ISSUE_52_BODY, model=model)
        engines.forget(http)
        reply = _retrying_post(http, f"{router.url}/v1/chat/completions", body)
        received = engines.received(http, "/v1/chat/completions")
        if reply is None or not reply.is_success:
            row["note"] = f"chat through the router failed: HTTP {getattr(reply, 'status_code', 'none')}"
            row["chat_flags_reach_engine"] = row["chat_fields_reach_client"] = None
        else:
            last = received[-1]["body"] if received else {}
            row["chat_flags_reach_engine"] = carries_polar_flags(last)
            keys = set(reply.json()["choices"][0])
            row["chat_fields_reach_client"] = {"prompt_token_ids", "meta_info"} <= keys
            row["choice_keys"] = sorted(keys)
            row["request_keys_at_engine"] = sorted(last)
        step = "Polar's request shapes at the engine"
        row["request_at_engine"] = _shapes_at_engine(http, router.url, engines, model)
        # Would the fields survive the response path if the engine emitted them unasked?
        step = "chat with fields emitted unasked"
        engines.emit_unasked(http, True)
        try:
            plain = {k: v for k, v in body.items() if k not in POLAR_REQUEST_FLAGS}
            reply = http.post(f"{router.url}/v1/chat/completions", json=plain)
            row["fields_survive_when_emitted"] = reply.is_success and {"prompt_token_ids", "meta_info"} <= set(
                reply.json()["choices"][0]
            )
        finally:
            engines.emit_unasked(http, False)
        step = "/generate"
        gen = http.post(f"{router.url}/generate", json=generate_body("hi"))
        row["generate_keeps_tokens"] = bool(generate_keeps_tokens(gen.json() if gen.is_success else {}))
        step = "/v1/completions"
        engines.forget(http)
        comp = http.post(
            f"{router.url}/v1/completions",
            json={
                "model": model,
                "prompt": "hi",
                "max_tokens": 4,
                "return_prompt_token_ids": True,
                "return_meta_info": True,
            },
        )
        seen = engines.received(http, "/v1/completions")
        row["completions_flags_reach_engine"] = comp.is_success and bool(seen) and carries_polar_flags(seen[-1]["body"])
        step = "POST /workers"
        row["post_workers"] = _registration(http, router.url, engines.spare_url, engines.timeout)
        step = "latency"
        row.update(_latency(http, engines.url, router.url, model, latency_requests))
    except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as exc:
        row["note"] = f"{step} failed: {type(exc).__name__}: {exc}"
    finally:
        http.close()
        router.stop()
    return row


def _retrying_post(http: httpx.Client, url: str, body: dict[str, Any], tries: int = 40) -> httpx.Response | None:
    """The first request right after startup may race the router's worker discovery: 5xx, or a 404 while the
    router does not know the worker's model yet (seen with smg 1.4.0). Retry those for up to ~10 s."""
    reply = None
    for _ in range(tries):
        reply = http.post(url, json=body)
        if reply.status_code < 500 and reply.status_code != 404:
            return reply
        time.sleep(0.25)
    return reply


def _registration(http: httpx.Client, router_url: str, worker_url: str, timeout: float) -> bool:
    # On its own connection: measured here, sglang-router 0.1.4 answers 404 to POST /workers and the next
    # request on that same keep-alive connection sometimes never gets an answer (a 10 s read timeout).
    reply = httpx.post(
        f"{router_url}{worker_api.PATH}",
        json=worker_api.registration(worker_url),
        headers={"Connection": "close"},
        timeout=timeout,
        trust_env=False,
    )
    if not reply.is_success:
        return False

    def listed() -> bool:
        listing = http.get(f"{router_url}{worker_api.PATH}")
        return worker_url in worker_api.by_url(worker_api.parse_list(listing.content) or [])

    return worker_api.poll_until(listed, 10)


def _latency(http: httpx.Client, direct: str, via: str, model: str, count: int) -> dict[str, Any]:
    """`count` requests each way, interleaved so drift hits both sides equally; milliseconds."""
    body = {"model": model, "messages": [{"role": "user", "content": "ping"}], "max_tokens": 1}
    d, v = interleaved_latency(http, direct, via, count, lambda i: body)
    if len(d) < count or len(v) < count:
        return {"latency_note": f"only {len(v)}/{count} requests through the router succeeded"}
    return {"latency_requests": count, **{k: round(x, 3) for k, x in latency_summary(d, v).items()}}


def run_matrix(
    releases: list[RouterRelease],
    latency_requests: int = 200,
    on_row: Callable[[dict[str, Any]], None] | None = None,
    engine: str = "emulator",
    progress: Callable[[str], None] = print,
    engine_url: str | None = None,
    *,
    settings: Mapping[str, str],
) -> list[dict[str, Any]]:
    """Every release measured behind the matrix's engines (`settings`: the stack's, the site's: engines_for)."""
    rows = []
    with engines_for(engine, progress, engine_url, settings=settings) as engines:
        for release in releases:
            row = measure(release, engines, latency_requests)
            rows.append(row)
            if on_row:
                on_row(row)
    return rows


def cell(row: dict[str, Any], key: str) -> str:
    value = row.get(key)
    if isinstance(value, bool) or value is None:
        if key in ("installs", "starts") or value is not None:
            return _yes(value)
        return "-"
    return str(value)


def engine_sentence(engine: str) -> str:
    if engine == "sglang":
        return (
            f"Each release ran on 127.0.0.1 in front of the real {real_sglang.spec()} on the CPU (a tiny random "
            "Qwen2, `polarstack.stack.real_sglang`), through a recording relay (`polarstack.bench.tap`) that passes "
            'requests and answers unchanged. "reach engine" is read from the relay\'s log; for "fields survive if '
            "engine always emits them\" the relay sets Polar's two flags on the way to the engine. The spare worker "
            "of the registration question is a second relay to the same server."
        )
    return (
        "Each release ran on 127.0.0.1 in front of `polarstack emulate-engine` (sglang "
        'protocol models at the pinned version). "reach engine" is read from the engine\'s own request log.'
    )


def latency_sentence(engine: str, rows: list[dict[str, Any]]) -> str:
    direct = "direct (to the relay in front of the engine)" if engine == "sglang" else "direct"
    text = (
        f"Latency: interleaved sequential chat requests (max_tokens 1) {direct} and through the router, "
        'in the same run; "added" is through minus direct, so a negative value means the router\'s cost '
        "is below what this run can resolve."
    )
    counts = [r["latency_requests"] for r in rows if r.get("latency_requests")]
    if counts and min(counts) < 100:
        text += (
            f" With {min(counts)} requests each way the p99 is the slowest request of each side, so the added p99 is "
            "noise (a single slow forward pass), not a router's cost."
        )
    return text


def to_markdown(rows: list[dict[str, Any]], command: str, date: str, engine: str = "emulator") -> str:
    lines = [
        "# Router matrix" + (f" (real {real_sglang.spec()})" if engine == "sglang" else ""),
        "",
        f"Generated by `{command}` on {date}, on {machine()}.",
        engine_sentence(engine),
        latency_sentence(engine, rows),
        "",
        "| " + " | ".join(title for _, title in COLUMNS) + " | note |",
        "|" + "---|" * (len(COLUMNS) + 1),
    ]
    for row in rows:
        lines.append("| " + " | ".join(cell(row, key) for key, _ in COLUMNS) + f" | {row.get('note', '')} |")
    lines.append("")
    return "\n".join(lines)


def write_outputs(
    rows: list[dict[str, Any]],
    json_path: str | None,
    markdown_path: str | None,
    command: str,
    engine: str = "emulator",
) -> None:
    date = time.strftime("%Y-%m-%d")
    engine_name = real_sglang.spec() if engine == "sglang" else "polarstack emulate-engine"
    if json_path:
        Path(json_path).parent.mkdir(parents=True, exist_ok=True)
        record = {"generated": date, "machine": machine(), "command": command, "engine": engine_name, "rows": rows}
        Path(json_path).write_text(json.dumps(record, indent=2) + "\n")
    if markdown_path:
        Path(markdown_path).parent.mkdir(parents=True, exist_ok=True)
        Path(markdown_path).write_text(to_markdown(rows, command, date, engine))
