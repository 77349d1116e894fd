"""Pins Polar's worker-discovery switch and smoke's use of Polar's own client, against a stand-in package
shaped like Polar's `polar.gateway.proxy.InferenceClient` (GET /workers, then round-robin to regular workers).
The stand-in is written here, not copied: only the method names and the discovery contract match."""

import subprocess
import sys
import textwrap

import pytest

from polarstack.polar import switch as polar_switch

pytestmark = pytest.mark.unit

STANDIN = {
    "polar/__init__.py": "",
    "polar/gateway/__init__.py": "",
    "polar/gateway/engine.py": textwrap.dedent("""
        class _SGLang:
            name = "sglang"

        def get_engine(name):
            assert name == "sglang"
            return _SGLang()
    """),
    "polar/gateway/proxy.py": textwrap.dedent("""
        import httpx

        class InferenceClient:
            def __init__(self, base_url, engine):
                self.base_url = base_url.rstrip("/")
                self.engine = engine
                self._client = None
                self._next = 0

            async def _get_client(self):
                if self._client is None:
                    self._client = httpx.AsyncClient(base_url=self.base_url, timeout=5)
                return self._client

            async def _regular_worker_urls(self, client):
                response = await client.get("/workers")
                if not response.is_success:
                    return ()
                workers = response.json().get("workers", [])
                return tuple(w["url"] for w in workers if w.get("worker_type", "regular") == "regular")

            async def _completion_url(self, client):
                urls = await self._regular_worker_urls(client)
                if not urls:
                    return "/v1/chat/completions"
                url = urls[self._next % len(urls)]
                self._next += 1
                return url + "/v1/chat/completions"

            async def close(self):
                if self._client is not None:
                    await self._client.aclose()
    """),
}


@pytest.fixture
def standin(tmp_path):
    for rel, text in STANDIN.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


def run_python(code: str, standin, discovery: str) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(standin), "POLAR_WORKER_DISCOVERY": discovery}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)


PROBE = textwrap.dedent("""
    import asyncio, polarstack.polar.switch as s
    s.install_hook()
    from polar.gateway.proxy import InferenceClient
    class FakeClient:
        async def get(self, path):
            raise AssertionError("discovery must not run when it is off")
    print(asyncio.run(InferenceClient("http://r", None)._regular_worker_urls(FakeClient())))
""")


def test_switch_off_patches_at_import(standin):
    proc = run_python(PROBE, standin, "off")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "()"


def test_switch_on_leaves_polar_untouched(standin):
    proc = run_python(PROBE, standin, "on")
    assert proc.returncode != 0 and "discovery must not run" in proc.stderr


def test_switch_applies_to_an_already_imported_module(standin):
    code = PROBE.replace("s.install_hook()\n", "").replace(
        "from polar.gateway.proxy import InferenceClient\n",
        "from polar.gateway.proxy import InferenceClient\ns.install_hook()\n",
    )
    assert run_python(code, standin, "off").stdout.strip() == "()"


def test_pth_file_runs_the_hook(tmp_path):
    target = polar_switch.install_pth(tmp_path)
    assert target.read_text() == polar_switch.PTH_LINE
    assert target.read_text().startswith("import ")  # site.py executes .pth lines that start with import


@pytest.mark.emulator
def test_smoke_resolves_with_polars_own_client(standin, engine, capsys, monkeypatch):
    """With Polar importable, `--route polar` asks Polar's client; the switch keeps it on the base URL."""
    import json

    monkeypatch.syspath_prepend(str(standin))
    for name in [m for m in sys.modules if m == "polar" or m.startswith("polar.")]:
        monkeypatch.delitem(sys.modules, name)
    from polarstack.cli.main import main

    try:
        assert main(["smoke", "--base-url", engine.url, "--route", "polar", "--json"]) == 0
    finally:  # the stand-in's modules must not outlive the test: later smokes would resolve with "Polar" too
        for name in [m for m in sys.modules if m == "polar" or m.startswith("polar.")]:
            del sys.modules[name]
    report = json.loads(capsys.readouterr().out)
    assert "resolved with the installed polar.gateway.proxy" in report["note"]
    assert report["targets"] == [engine.url] and report["router_bypassed"] is False
