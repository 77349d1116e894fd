"""Pins the router worker API client (polarstack.routers.worker_api) against an in-process fake router (httpx.MockTransport,
no network): slime's registration body, the sentences and exit codes of a refused or unreachable registration,
how GET /workers is read, waiting for asynchronous registration and removal, and that a temporary registration
removes exactly the workers it added."""

from __future__ import annotations

import json

import httpx
import pytest

from polarstack.errors import ExitCode, StackError
from polarstack.routers import worker_api

pytestmark = pytest.mark.unit

ROUTER = "http://router.test"
E1, E2 = "http://127.0.0.1:30000", "http://127.0.0.1:30010"


class FakeRouter:
    """A router's worker API: POST /workers adds a worker after `lag` further GETs (registration is asynchronous,
    202), DELETE /workers/{id} removes it after `lag` GETs; `refuse` answers every POST with 404."""

    def __init__(self, *, lag: int = 0, refuse: bool = False, healthy: bool = True, fail_gets: int = 0):
        self.workers: list[dict] = []
        self.pending: list[tuple[int, str, dict]] = []  # (GETs still to wait, "add"/"remove", worker)
        self.calls: list[tuple[str, str, object]] = []
        self.lag, self.refuse, self.healthy, self.fail_gets = lag, refuse, healthy, fail_gets
        self.next_id = 0

    def add(self, url: str) -> None:
        self.next_id += 1
        self.workers.append(
            {"id": f"w{self.next_id}", "url": url, "worker_type": "regular", "is_healthy": self.healthy}
        )

    def urls(self) -> list[str]:
        return [w["url"] for w in self.workers]

    def _later(self, op: str, worker: dict) -> None:
        self.pending.append((self.lag, op, worker))
        if self.lag == 0:
            self._tick()

    def _tick(self) -> None:
        due = [p for p in self.pending if p[0] <= 0]
        self.pending = [(n - 1, op, w) for n, op, w in self.pending if n > 0]
        for _, op, worker in due:
            if op == "add":
                self.workers.append(worker)
            else:
                self.workers.remove(worker)

    def handle(self, req: httpx.Request) -> httpx.Response:
        body = json.loads(req.content) if req.content else None
        self.calls.append((req.method, req.url.path, body))
        if req.method == "GET" and req.url.path == "/workers":
            if self.fail_gets > 0:
                self.fail_gets -= 1
                raise httpx.ConnectError("refused", request=req)
            self._tick()
            return httpx.Response(200, json={"workers": self.workers})
        if req.method == "POST" and req.url.path == "/workers":
            if self.refuse:
                return httpx.Response(404, text="Not Found")
            self.next_id += 1
            worker = {
                "id": f"w{self.next_id}",
                "url": body["url"],
                "worker_type": body["worker_type"],
                "is_healthy": self.healthy,
            }
            self._later("add", worker)
            return httpx.Response(202, json={"status": "accepted"})
        if req.method == "DELETE" and req.url.path.startswith("/workers/"):
            worker = next(w for w in self.workers if w["id"] == req.url.path.rsplit("/", 1)[1])
            self._later("remove", worker)
            return httpx.Response(202, json={"status": "accepted"})
        return httpx.Response(404)

    def client(self, timeout: float = 5.0) -> httpx.Client:
        return httpx.Client(transport=httpx.MockTransport(self.handle), timeout=timeout)


@pytest.fixture
def fake(monkeypatch):
    """A FakeRouter that every client the worker API opens talks to."""

    def make(**options) -> FakeRouter:
        router = FakeRouter(**options)
        monkeypatch.setattr(worker_api, "client", router.client)
        return router

    return make


def test_register_posts_slimes_body(fake):
    router = fake()
    worker_api.register(ROUTER, E1)
    assert router.calls == [("POST", "/workers", {"url": E1, "worker_type": "regular"})]
    assert router.urls() == [E1]


def test_a_router_without_the_api_is_an_http_error_naming_it(fake):
    fake(refuse=True)
    with pytest.raises(StackError) as caught:
        worker_api.register(ROUTER, E1)
    assert caught.value.code == ExitCode.HTTP_ERROR
    assert caught.value.message == (
        f"the router at {ROUTER} refused POST /workers for {E1} (HTTP 404: Not Found); "
        "it has no slime-compatible worker API."
    )


def test_an_unreachable_router_is_unreachable_naming_the_worker(monkeypatch):
    def refuse(req: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=req)

    monkeypatch.setattr(worker_api, "client", lambda timeout: httpx.Client(transport=httpx.MockTransport(refuse)))
    with pytest.raises(StackError) as caught:
        worker_api.register(ROUTER, E1)
    assert caught.value.code == ExitCode.UNREACHABLE
    assert caught.value.message.startswith(f"could not register {E1} with the router at {ROUTER}: nothing accepts")


@pytest.mark.parametrize(
    "body,expected",
    [
        (b'{"workers": []}', []),
        (b'{"workers": [{"url": "http://a/"}]}', [{"url": "http://a/"}]),
        (b'{"workers": {"url": "http://a"}}', None),  # not a list
        (b'{"urls": []}', None),
        (b"[]", None),
        (b"<html>", None),
    ],
)
def test_parse_list(body, expected):
    assert worker_api.parse_list(body) == expected


def test_by_url_strips_slashes_and_filters_unhealthy():
    workers = [
        {"url": "http://a/", "id": "1"},
        {"url": "http://b", "id": "2", "is_healthy": False},
        "junk",
        {"url": None, "id": "3"},
        {"url": "http://c"},
    ]
    assert worker_api.by_url(workers) == {"http://a": "1", "http://b": "2", "http://c": ""}
    assert worker_api.by_url(workers, healthy_only=True) == {"http://a": "1", "http://c": ""}


@pytest.mark.parametrize("status,body", [(404, b'{"workers": [{"url": "http://a"}]}'), (200, b"not json")])
def test_list_workers_reads_only_a_2xx_worker_list(status, body):
    http = httpx.Client(transport=httpx.MockTransport(lambda req: httpx.Response(status, content=body)))
    assert worker_api.list_workers(http, ROUTER) == {}


def test_wait_listed_waits_for_asynchronous_registration(fake):
    router = fake(lag=3)
    worker_api.register(ROUTER, E1)
    assert router.urls() == []  # accepted, not yet listed
    assert worker_api.wait_listed(router.client(), ROUTER, [E1], timeout=5) == set()
    assert router.urls() == [E1]


def test_wait_listed_returns_what_is_missing_after_the_timeout(fake):
    router = fake()
    router.add(E1)
    assert worker_api.wait_listed(router.client(), ROUTER, [E1, E2], timeout=0.3) == {E2}


def test_unhealthy_workers_count_as_missing_only_when_asked(fake):
    router = fake(healthy=False)
    router.add(E1)
    assert worker_api.wait_listed(router.client(), ROUTER, [E1], timeout=0.2) == set()
    assert worker_api.wait_listed(router.client(), ROUTER, [E1], timeout=0.2, healthy_only=True) == {E1}


def test_failed_polls_are_retried_only_when_tolerated(fake):
    router = fake(fail_gets=2)
    router.add(E1)
    with pytest.raises(StackError) as caught:
        worker_api.wait_listed(router.client(), ROUTER, [E1], timeout=2)
    assert caught.value.code == ExitCode.UNREACHABLE
    router.fail_gets = 2
    assert worker_api.wait_listed(router.client(), ROUTER, [E1], timeout=2, tolerate_errors=True) == set()


def test_wait_gone_waits_for_asynchronous_removal(fake):
    router = fake(lag=2)
    router.add(E1)
    http = router.client()
    worker_api.deregister(http, ROUTER, "w1")
    assert router.urls() == [E1]  # accepted, still listed
    assert worker_api.wait_gone(http, ROUTER, [E1], timeout=5) == set()
    assert router.urls() == []


def test_register_all_waits_until_healthy(fake):
    router = fake(lag=2)
    worker_api.register_all(ROUTER, [E1, E2], timeout=5)
    assert sorted(router.urls()) == [E1, E2]


def test_register_all_names_the_engines_never_listed_healthy(fake):
    fake(healthy=False)
    with pytest.raises(StackError) as caught:
        worker_api.register_all(ROUTER, [E1, E2], timeout=0.3)
    assert caught.value.code == ExitCode.ENVIRONMENT
    assert caught.value.message == (
        f"the router at {ROUTER} did not list {[E1, E2]} as healthy workers within 0.3 s after POST /workers."
    )


def test_temporary_registration_removes_exactly_what_it_added(fake):
    router = fake(lag=1)
    router.add(E1)  # registered by someone else: it stays
    with worker_api.registered(ROUTER, [E1, E2], timeout=5) as added:
        assert added == [E2]
        assert sorted(router.urls()) == [E1, E2]
    assert router.urls() == [E1]
    posts = [c for c in router.calls if c[0] == "POST"]
    deletes = [c for c in router.calls if c[0] == "DELETE"]
    assert posts == [("POST", "/workers", {"url": E2, "worker_type": "regular"})]
    assert [c[1] for c in deletes] == ["/workers/w2"]


def test_poll_until():
    answers = iter([False, False, True])
    assert worker_api.poll_until(lambda: next(answers), timeout=5, interval=0.01)
    assert not worker_api.poll_until(lambda: False, timeout=0.05, interval=0.01)
