"""`polarstack smoke`: send Polar-shaped requests down the configured path and prove trainable tokens.

Two routes (../shared/reference/polar-contract.md, "Which URL Polar actually calls"):
- `base`: every request goes to the given URL, as older Polar revisions (upstream issue #52) do;
- `polar`: resolve the URL the way current Polar's InferenceClient does (src/polar/gateway/proxy.py,
  `_regular_worker_urls` / `_completion_url`): `GET <base>/workers`; if it lists workers and none is a
  prefill/decode worker, requests go round-robin straight to the regular workers' /v1/chat/completions,
  bypassing the router; otherwise (error, non-2xx, no list) they go to the base URL.

Go/no-go comes from polar_model (Polar's own pipeline on the raw answer bytes): 0 when Polar would extract
trainable tokens from every answer; otherwise the most fundamental failure wins (unreachable, HTTP error, a body
Polar's orjson parser rejects = MALFORMED, token fields dropped on the path = TOKENS_MISSING, fields present but
Polar extracts nothing = INVARIANT). Findings Polar does not enforce are warnings (exit 4 with strict=True);
answers Polar could train on only by re-tokenizing text are refused with RETOKENIZED unless allow_retokenized.
See docs/polar-verdict.md. After the plain requests, one Polar-shaped request carrying a tool schema goes to every
target and is judged the same way, then for its tool call (toolcheck; docs/tool-calls.md).
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import time
from dataclasses import dataclass, field
from typing import Any

from polarstack import contract, polar_findings, polar_model, polar_opinion, retokenize, toolcheck, worker_api
from polarstack.errors import ExitCode, StackError
from polarstack.http import client, error_message, request

WORKING_PROFILES = "engine-direct, router-passthrough or patched-router"
SINGLE_PROMPTS = (
    "Write a Python function that returns the sum of a list of integers.",
    "Explain in one sentence what a unit test is.",
    "Write a Python function is_palindrome(s) that ignores case.",
    "List three uses of a hash map.",
)
FOLLOW_UPS = ("Now add a docstring.", "Add a test for the empty input.", "Make it handle None.", "Summarize the change.")


@dataclass
class Resolution:
    route: str  # "base" or "polar"
    base_url: str
    targets: list[str]  # URLs chat requests go to (round-robin)
    bypassed: bool = False  # Polar sends straight to the workers the router lists
    note: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {"route": self.route, "base_url": self.base_url, "targets": self.targets,
                "router_bypassed": self.bypassed, "note": self.note}


@dataclass
class SmokeReport:
    resolution: Resolution
    model: str
    exchanges: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    code: ExitCode = ExitCode.OK
    message: str = ""
    fields_missing: list[str] = field(default_factory=list)
    elapsed: float = 0.0
    strict: bool = False  # findings Polar does not enforce fail with INVARIANT
    allow_retokenized: bool = False
    tokenizer_name: str | None = None  # the builder tokenizer of the guarded Polar config (None: no re-tokenization)
    tokenizer: Any = None
    engine_urls: list[str] = field(default_factory=list)  # engine-direct URLs for the drift measurement
    findings: list[dict[str, str]] = field(default_factory=list)
    polar_verdict: str = ""
    drift: dict[str, Any] | None = None
    tool_check: dict[str, Any] | None = None  # toolcheck.exchange_tools' summary (issue 10 point 4)

    @property
    def trainable_tokens(self) -> int:
        """Polar's count (polar_model), the only basis of the verdict."""
        return sum(e["polar"]["polar_trainable_tokens"] for e in self.exchanges if "polar" in e)

    @property
    def ok(self) -> bool:
        return self.code == ExitCode.OK

    def as_dict(self) -> dict[str, Any]:
        return {
            "verdict": "pass" if self.ok else "fail",
            "exit_code": int(self.code),
            "code": self.code.name,
            "message": self.message,
            "trainable_tokens": self.trainable_tokens,
            "polar_verdict": self.polar_verdict,
            "polar_trainable_tokens": self.trainable_tokens,
            "strict": self.strict,
            "retokenization": {"tokenizer_name_or_path": self.tokenizer_name, "allowed": self.allow_retokenized,
                               "drift": self.drift},
            "findings": self.findings,
            "installed_polar": ("not importable" if not any("installed_polar" in e for e in self.exchanges) else
                                "disagrees" if self.code == ExitCode.INTERNAL else "agrees"),
            "fields_missing": self.fields_missing,
            "tool_calls": self.tool_check,
            "model": self.model,
            **self.resolution.as_dict(),
            "requests": self.exchanges,
            "warnings": self.warnings,
            "elapsed_seconds": round(self.elapsed, 4),
        }


def _v1(base: str, endpoint: str) -> str:
    """proxy.py `_v1_endpoint`: do not double `/v1` when the base URL already ends with it."""
    base = base.rstrip("/")
    return f"{base}/{endpoint}" if base.endswith("/v1") else f"{base}/v1/{endpoint}"


def _root(base: str) -> str:
    base = base.rstrip("/")
    return base[: -len("/v1")] if base.endswith("/v1") else base


def polar_importable() -> bool:
    try:
        return importlib.util.find_spec("polar.gateway.proxy") is not None
    except (ImportError, ValueError):
        return False


def resolve_with_polar(base_url: str, requests: int) -> Resolution:
    """Ask Polar's own InferenceClient where its chat requests go (inside the trainer, where Polar is installed).

    Calls `_completion_url` once per request, as `InferenceClient._completion` does, so round-robin and the
    worker-discovery switch (polar_switch) act exactly as in the gateway.
    """
    from polar.gateway.engine import get_engine
    from polar.gateway.proxy import InferenceClient

    async def ask() -> list[str]:
        client = InferenceClient(base_url, get_engine("sglang"))
        try:
            http = await client._get_client()
            return [await client._completion_url(http) for _ in range(max(requests, 1))]
        finally:
            await client.close()

    urls = asyncio.run(ask())
    targets = []
    for url in urls:
        target = url if url.startswith(("http://", "https://")) else base_url
        target = target.split("/v1/", 1)[0].rstrip("/") if "/v1/" in target else target.rstrip("/")
        targets.append(target)
    bypassed = any(t != base_url.rstrip("/") for t in targets)
    ordered = list(dict.fromkeys(targets))
    note = ("Polar's own client sends chat requests straight to the worker(s) the router lists, so the router is "
            "bypassed and its cache-aware routing is lost" if bypassed else
            "Polar's own client sends every chat request to the base URL")
    return Resolution("polar", base_url.rstrip("/"), ordered, bypassed=bypassed, note=note + " (resolved with the "
                      "installed polar.gateway.proxy)")


def resolve(base_url: str, route: str, http, requests: int = 1) -> Resolution:
    base_url = base_url.rstrip("/")
    if route == "base":
        return Resolution("base", base_url, [base_url], note="every request to the base URL (older Polar revisions)")
    if route != "polar":
        raise StackError(f"--route must be base or polar, not {route!r}.", ExitCode.USAGE)
    if polar_importable():
        return resolve_with_polar(base_url, requests)
    reply = request(http, "GET", f"{_root(base_url)}{worker_api.PATH}")
    workers = worker_api.parse_list(reply.body) if 200 <= reply.status < 300 else None
    if workers is None:
        return Resolution("polar", base_url, [base_url], note=f"GET /workers answered HTTP {reply.status} without a "
                          "worker list, so Polar sends every request to the base URL")
    types = {w.get("worker_type") for w in workers if isinstance(w, dict)}
    if types & {"prefill", "decode"}:
        return Resolution("polar", base_url, [base_url], note="prefill/decode workers listed: Polar keeps the router")
    urls: list[str] = []
    for worker in workers:
        url = worker.get("url") if isinstance(worker, dict) else None
        if (isinstance(worker, dict) and worker.get("worker_type", "regular") == "regular" and isinstance(url, str)
                and url.startswith(("http://", "https://")) and url.rstrip("/") not in urls):
            urls.append(url.rstrip("/"))
    if not urls:
        return Resolution("polar", base_url, [base_url], note="the router lists no regular worker: Polar uses the base URL")
    return Resolution("polar", base_url, urls, bypassed=True,
                      note=f"the router lists {len(urls)} regular worker(s): Polar sends each chat request straight to "
                      "a worker, round-robin, so the router is bypassed and its cache-aware routing is lost")


def discover_model(http, url: str) -> str:
    """The first model id of GET /v1/models, as a researcher's topology would name it; 'default' otherwise."""
    reply = request(http, "GET", _v1(url, "models"))
    if 200 <= reply.status < 300:
        try:
            data = json.loads(reply.body).get("data")
            if isinstance(data, list) and data and isinstance(data[0], dict) and isinstance(data[0].get("id"), str):
                return data[0]["id"]
        except (ValueError, AttributeError):
            pass
    return "default"


def _fail(report: SmokeReport, code: ExitCode, message: str) -> SmokeReport:
    report.code, report.message = code, message
    return report


def run_smoke(base_url: str, *, model: str | None = None, requests: int = 2, turns: int = 2, timeout: float = 10.0,
              route: str = "base", max_tokens: int = 16, register: list[str] | None = None, strict: bool = False,
              allow_retokenized: bool = False, tokenizer_name: str | None = None,
              engine_urls: list[str] | None = None) -> SmokeReport:
    verdict_options = {"strict": strict, "allow_retokenized": allow_retokenized, "tokenizer_name": tokenizer_name,
                       "engine_urls": engine_urls or list(register or [])}
    if register:
        try:
            with worker_api.registered(base_url.rstrip("/"), register, timeout):
                return run_smoke(base_url, model=model, requests=requests, turns=turns, timeout=timeout, route=route,
                                 max_tokens=max_tokens, **verdict_options)
        except StackError as exc:
            report = SmokeReport(Resolution(route, base_url.rstrip("/"), [base_url.rstrip("/")]), model or "")
            return _fail(report, exc.code, exc.message)
    """Send `requests` single-turn requests and one `turns`-turn session; never raises StackError for the
    path's failures (they become the report's code and message), only for bad arguments."""
    if requests < 0 or turns < 0 or requests + turns == 0:
        raise StackError("--requests and --turns must be >= 0 and not both 0.", ExitCode.USAGE)
    if timeout <= 0:
        raise StackError("--timeout must be positive.", ExitCode.USAGE)
    started = time.perf_counter()
    with client(timeout) as http:
        resolution = Resolution("base", base_url.rstrip("/"), [base_url.rstrip("/")])
        report = SmokeReport(resolution, model or "", strict=strict, allow_retokenized=allow_retokenized,
                             tokenizer_name=tokenizer_name, engine_urls=list(verdict_options["engine_urls"]))
        try:
            if tokenizer_name:
                report.tokenizer = retokenize.load(tokenizer_name)
            report.resolution = resolution = resolve(base_url, route, http, requests + turns)
            report.model = model or discover_model(http, resolution.targets[0])
            _exchange_all(report, http, requests, turns, max_tokens)
            # issue 10 point 4: one Polar-shaped request carrying a tool schema per target, judged like the others
            toolcheck.exchange_tools(report, http)
        except StackError as exc:
            report.code, report.message = exc.code, exc.message
        report.elapsed = time.perf_counter() - started
    if report.code == ExitCode.OK:
        _judge(report)
    if report.code == ExitCode.OK:  # issue 10 point 4: tool schemas must come back as parsed tool_calls
        toolcheck.judge_tool_calls(report)
    for entry in report.exchanges:
        entry.pop("_request", None)
    return report


def exchange(report: SmokeReport, http, url: str, body: dict[str, Any], kind: str, turn: int) -> dict[str, Any]:
    """POST one Polar-shaped request and record it as a smoke exchange judged by Polar's pipeline (polar_model);
    raises StackError for answers Polar cannot use at all (HTTP error, a body orjson rejects, not a completion).
    The tool-call check (toolcheck.exchange_tools) sends its requests through here too."""
    reply = request(http, "POST", url, body)
    entry: dict[str, Any] = {"kind": kind, "turn": turn, "url": url, "status": reply.status,
                             "elapsed_ms": round(reply.elapsed * 1000, 2), "bytes": len(reply.body)}
    report.exchanges.append(entry)
    if not 200 <= reply.status < 300:
        detail = error_message(reply.body)
        if reply.status == 404 and "model" in detail.lower():
            raise StackError(f"{url} does not serve model {report.model!r} (HTTP 404: {detail}); pass --model "
                             "with the engine's served model name.", ExitCode.HTTP_ERROR)
        raise StackError(f"{url} answered HTTP {reply.status} ({detail}); fix the engine or router before "
                         "training.", ExitCode.HTTP_ERROR)
    # Polar's pipeline on the raw bytes (polar_model): orjson first, as Polar's gateway parses.
    polar = polar_model.decide(reply.body, body, tokenizer=report.tokenizer)
    if polar.verdict == polar_model.UNPARSEABLE:
        raise StackError(f"{url} answered HTTP {reply.status} with a body {polar.reason}; Polar's request fails "
                         "and nothing is trained, so fix what produces these bytes.", ExitCode.MALFORMED)
    parsed = polar.response
    if not isinstance(parsed, dict) or not isinstance(parsed.get("choices"), list) or not parsed["choices"]:
        raise StackError(f"{url} answered HTTP {reply.status} with JSON that is not a chat completion (no "
                         "choices); check that the URL points at an OpenAI-compatible engine or router.",
                         ExitCode.MALFORMED)
    verdict = contract.analyze_response(parsed)
    entry["verdict"] = verdict.as_dict()
    entry["polar"] = polar.as_dict()
    if polar_opinion.available():  # inside the trainer: the installed Polar's own functions, a second opinion
        tokens, ended = polar_opinion.trainable_tokens(reply.body, body, report.tokenizer)
        entry["installed_polar"] = {"trainable_tokens": tokens, "ended": ended}
    entry["_prompt_ids"] = polar.prompt_ids or verdict.prompt_ids
    entry["_request"] = body
    return parsed


def _exchange_all(report: SmokeReport, http, requests: int, turns: int, max_tokens: int) -> None:
    targets = report.resolution.targets
    counter = 0

    def send(messages: list[dict[str, Any]], kind: str, turn: int) -> dict[str, Any] | None:
        nonlocal counter
        target = targets[counter % len(targets)]
        counter += 1
        body = contract.prepare_request({"model": report.model, "messages": messages, "max_tokens": max_tokens})
        return exchange(report, http, _v1(target, "chat/completions"), body, kind, turn)

    for index in range(requests):
        send([{"role": "user", "content": SINGLE_PROMPTS[index % len(SINGLE_PROMPTS)]}], "single", 1)
    if turns:
        messages: list[dict[str, Any]] = [{"role": "user", "content": SINGLE_PROMPTS[0]}]
        previous: list[int] = []
        for turn in range(1, turns + 1):
            parsed = send(list(messages), "session", turn)
            prompt_ids = report.exchanges[-1].pop("_prompt_ids")
            if turn > 1:
                problem = contract.check_prefix(previous, prompt_ids)
                if problem:
                    report.warnings.append(problem.message)
            previous = prompt_ids
            content = ""
            if parsed:
                message = parsed["choices"][0].get("message") if isinstance(parsed["choices"][0], dict) else None
                content = message.get("content") or "" if isinstance(message, dict) else ""
            messages += [{"role": "assistant", "content": content},
                         {"role": "user", "content": FOLLOW_UPS[(turn - 1) % len(FOLLOW_UPS)]}]
    for entry in report.exchanges:
        entry.pop("_prompt_ids", None)


def _judge(report: SmokeReport) -> None:
    """Go/no-go from Polar's count alone (polar_model); contract.py's reasons only name what is missing."""
    verdicts = [e["verdict"] for e in report.exchanges]
    polars = [e["polar"] for e in report.exchanges]
    report.warnings += [p["message"] for v in verdicts for p in v["problems"] if p["kind"] == contract.WARNING]
    if report.resolution.bypassed:
        report.warnings.append(report.resolution.note)
    disagree = [e for e in report.exchanges if "installed_polar" in e
                and e["installed_polar"]["trainable_tokens"] != e["polar"]["polar_trainable_tokens"]]
    if disagree:
        entry = disagree[0]
        _fail(report, ExitCode.INTERNAL,
              f"polarstack's verdict model disagrees with the installed Polar on the answer from {entry['url']} "
              f"({entry['polar']['polar_trainable_tokens']} trainable tokens vs Polar's "
              f"{entry['installed_polar']['trainable_tokens']}, which ended at {entry['installed_polar']['ended']}); "
              "the verdict cannot be trusted, so the gate refuses: report this polarstack bug.")
        return
    zero = [(e, p) for e, p in zip(report.exchanges, polars) if p["polar_trainable_tokens"] == 0]
    retokenized = [p for p in polars if p["polar_verdict"] == polar_model.RETOKENIZED]
    report.polar_verdict = (polar_model.NOT_TRAINABLE if zero else polar_model.RETOKENIZED if retokenized
                            else polar_model.TRAINABLE)
    seen: set[tuple[str, str]] = set()
    for polar in polars:
        for finding in polar["warnings"]:
            if (finding["code"], finding["path"]) not in seen:
                seen.add((finding["code"], finding["path"]))
                report.findings.append(finding)
                report.warnings.append(f"{finding['code']}: {finding['message']}")
    where = ", ".join(sorted({e["url"] for e in report.exchanges}))
    if zero:
        # Which fields the zero-token answers lack (a path may drop them only on some requests, e.g. with tools).
        keys = [set(e["verdict"]["choice_keys"]) for e, _ in zero]
        where = ", ".join(sorted({e["url"] for e, _ in zero}))
        lost = []
        if not any("prompt_token_ids" in k or "input_token_ids" in k for k in keys):
            lost.append("return_prompt_token_ids")
        if not any("meta_info" in k for k in keys):
            lost.append("return_meta_info")
        report.fields_missing = lost
        if lost:
            answers = " and ".join(f"`{'prompt_token_ids' if f == 'return_prompt_token_ids' else 'meta_info'}`"
                                   for f in lost)
            # With a builder tokenizer Polar re-tokenizes what it can; name the requests it could not rebuild
            # (tool requests: sglang renders its own dump of the tools, see docs/tool-calls.md).
            kinds = sorted({e["kind"] for e, _ in zero})
            rebuilt = (f" (Polar's re-tokenization with {report.tokenizer_name!r} cannot rebuild the {'/'.join(kinds)} "
                       f"request(s) either: {zero[0][1]['polar_reason']})" if report.tokenizer is not None else "")
            _fail(report, ExitCode.TOKENS_MISSING,
                  f"zero trainable tokens: every request set {' and '.join(lost)} but no response from {where} carries "
                  f"{answers}{rebuilt}, so something on the path dropped those request fields before the engine "
                  f"(sglang-router 0.1.5-0.3.2 and smg <= 1.4.1 do); use the {WORKING_PROFILES} profile, and run "
                  "`polarstack probe` to confirm.")
        else:
            entry, polar = zero[0]
            detail = next((p["message"] for p in entry["verdict"]["problems"] if p["kind"] == contract.MISSING), "")
            _fail(report, ExitCode.INVARIANT,
                  f"Polar would extract zero trainable tokens from {entry['url']} although the token fields are "
                  f"there: {polar['polar_reason']} (at Polar's {polar['polar_stage']} step"
                  f"{'; ' + detail if detail else ''}); fix the engine before training.")
        return
    if retokenized:
        _measure_drift(report)
        measured = report.drift or {}
        drift = (f"measured drift on this smoke's requests: {measured['differing_positions']} of "
                 f"{measured['sampled_tokens']} tokens differ" if measured.get("sampled_tokens") is not None
                 else "drift not measured: no engine-direct URL answered with token ids")
        if not report.allow_retokenized:
            _fail(report, ExitCode.RETOKENIZED,
                  f"Polar would train only on ids its builder re-tokenizes from text with {report.tokenizer_name!r}, "
                  f"because the path to {where} drops the token ids; {retokenize.RISK} ({drift}); use a profile that "
                  "keeps the ids, or pass --allow-retokenized to accept the risk.")
            return
        report.warnings.append(f"retokenized: Polar trains on ids re-tokenized from text ({drift}); allowed by "
                               "--allow-retokenized")
    fatal = [f for f in report.findings if f["code"] in polar_findings.TRAINER_FATAL]
    if fatal:
        _fail(report, ExitCode.INVARIANT,
              f"Polar would keep the answers from {where}, but the trainer cannot: {fatal[0]['message']} (at "
              f"{fatal[0]['path']}); no batch holding such an id is trained on, so fix the engine or the path first.")
        return
    if report.strict and report.findings:
        first = report.findings[0]
        _fail(report, ExitCode.INVARIANT,
              f"--strict: {first['message']} (at {first['path']}; {len(report.findings)} finding(s) Polar does not "
              "enforce); fix the engine or drop --strict.")
        return
    report.code = ExitCode.OK
    report.message = (f"{report.trainable_tokens} trainable tokens (Polar's count) from {len(verdicts)} responses via "
                      f"{', '.join(report.resolution.targets)}"
                      + (f"; {len(report.findings)} warning(s) Polar does not enforce" if report.findings else ""))


def _measure_drift(report: SmokeReport) -> None:
    """Send the smoke's own requests straight to an engine that keeps the ids and compare them with the ids
    re-tokenized from the same answer's text (retokenize.drift)."""
    if report.tokenizer is None or not report.engine_urls:
        return
    totals = {"responses": 0, "sampled_tokens": 0, "differing_positions": 0, "engine_urls": report.engine_urls}
    with client(30.0) as http:
        for index, entry in enumerate(report.exchanges):
            body = entry.get("_request")
            if body is None:
                continue
            url = _v1(report.engine_urls[index % len(report.engine_urls)], "chat/completions")
            try:
                reply = request(http, "POST", url, body)
                parsed = json.loads(reply.body) if 200 <= reply.status < 300 else None
            except (StackError, ValueError):
                continue
            measured = retokenize.drift(report.tokenizer, parsed) if isinstance(parsed, dict) else None
            if measured is None:
                continue
            totals["responses"] += 1
            totals["sampled_tokens"] += measured["sampled_tokens"]
            totals["differing_positions"] += measured["differing_positions"]
    if totals["responses"]:
        report.drift = totals
