"""Pins the smoke's route resolution (polarstack.checks.route): `base` sends every request to the given URL;
`polar` asks the router's GET /workers as current Polar's InferenceClient does and, when it lists regular workers
only, sends round-robin straight to them (router bypassed); any other answer keeps the base URL. Also the URL
helpers (`/v1` never doubled) and the served model's discovery. Answers come from in-process transports."""

from __future__ import annotations

import httpx
import pytest

from polarstack.checks import route as smoke_route
from polarstack.errors import ExitCode, StackError

pytestmark = pytest.mark.unit
BASE = "http://router.invalid"


def client(
    workers_reply: httpx.Response | None = None,
    models_reply: httpx.Response | None = None,
    seen: list[str] | None = None,
) -> httpx.Client:
    def handler(request: httpx.Request) -> httpx.Response:
        if seen is not None:
            seen.append(str(request.url))
        if request.url.path.endswith("/workers") and workers_reply is not None:
            return workers_reply
        if request.url.path.endswith("/v1/models") and models_reply is not None:
            return models_reply
        return httpx.Response(404, json={"error": "not here"})

    return httpx.Client(transport=httpx.MockTransport(handler))


def workers(*entries: dict) -> httpx.Response:
    return httpx.Response(200, json={"workers": list(entries)})


@pytest.fixture(autouse=True)
def without_polar(monkeypatch):
    """Resolve as the host does (Polar not importable), whatever is installed."""
    monkeypatch.setattr(smoke_route, "polar_importable", lambda: False)


def test_v1_url_never_doubles_v1_and_root_url_strips_it():
    assert smoke_route.v1_url("http://h:1", "chat/completions") == "http://h:1/v1/chat/completions"
    assert smoke_route.v1_url("http://h:1/v1/", "models") == "http://h:1/v1/models"
    assert smoke_route.root_url("http://h:1/v1/") == "http://h:1"
    assert smoke_route.root_url("http://h:1/") == "http://h:1"


def test_base_route_sends_everything_to_the_base_url_without_asking():
    seen: list[str] = []
    res = smoke_route.resolve(BASE + "/", "base", client(seen=seen))
    assert (res.route, res.targets, res.bypassed) == ("base", [BASE], False) and seen == []
    assert res.as_dict() == {
        "route": "base",
        "base_url": BASE,
        "targets": [BASE],
        "router_bypassed": False,
        "note": "every request to the base URL (older Polar revisions)",
    }


def test_an_unknown_route_is_a_usage_error():
    with pytest.raises(StackError) as err:
        smoke_route.resolve(BASE, "direct", client())
    assert err.value.code == ExitCode.USAGE and "--route must be base or polar" in err.value.message


def test_polar_route_bypasses_the_router_to_its_regular_workers():
    seen: list[str] = []
    http = client(
        workers(
            {"url": "http://w1.invalid/", "worker_type": "regular"},
            {"url": "http://w2.invalid"},
            {"url": "http://w1.invalid"},
            {"url": "w3-no-scheme"},
        ),
        seen=seen,
    )
    res = smoke_route.resolve(BASE + "/v1", "polar", http)
    assert seen == [BASE + "/workers"]  # asked at the root, not under /v1
    assert res.targets == ["http://w1.invalid", "http://w2.invalid"] and res.bypassed
    assert "2 regular worker(s)" in res.note and "bypassed" in res.note


@pytest.mark.parametrize(
    "reply,note",
    [
        (httpx.Response(404, json={"error": "no"}), "GET /workers answered HTTP 404 without a worker list"),
        (httpx.Response(200, content=b"not json"), "GET /workers answered HTTP 200 without a worker list"),
        (
            workers(
                {"url": "http://p.invalid", "worker_type": "prefill"},
                {"url": "http://d.invalid", "worker_type": "decode"},
            ),
            "prefill/decode workers listed: Polar keeps the router",
        ),
        (workers(), "the router lists no regular worker"),
    ],
    ids=["404", "not_json", "prefill_decode", "empty"],
)
def test_polar_route_keeps_the_base_url_otherwise(reply, note):
    res = smoke_route.resolve(BASE, "polar", client(reply))
    assert res.targets == [BASE] and not res.bypassed and note in res.note


def test_discover_model_reads_the_first_id_or_says_default():
    listed = httpx.Response(200, json={"data": [{"id": "Qwen"}, {"id": "other"}]})
    assert smoke_route.discover_model(client(models_reply=listed), BASE) == "Qwen"
    assert smoke_route.discover_model(client(), BASE) == "default"
    assert smoke_route.discover_model(client(models_reply=httpx.Response(200, json={"data": []})), BASE) == "default"
    assert smoke_route.discover_model(client(models_reply=httpx.Response(200, content=b"[1]")), BASE) == "default"
