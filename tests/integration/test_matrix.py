"""Pins `polarstack routers matrix` on three real releases: the bisection's key rows are reproduced from the
engine's own request log (0.1.4 and smg 1.13.0 forward Polar's chat fields, 0.3.2 drops them; /generate keeps
its tokens everywhere; only the newer releases take slime's POST /workers)."""

import json

import pytest

from polarstack.bench import matrix, tap
from polarstack.cli.main import main
from polarstack.errors import ExitCode
from polarstack.processes import stop_pid
from polarstack.routers.catalog import RouterRelease
from polarstack.stack.profiles import stack_settings

pytestmark = pytest.mark.router


def test_matrix_over_three_releases(tmp_path, capsys):
    out_json, out_md = tmp_path / "m.json", tmp_path / "m.md"
    code = main(
        [
            "routers",
            "matrix",
            "--releases",
            "sglang-router==0.1.4",
            "sglang-router==0.3.2",
            "smg==1.13.0",
            "--latency-requests",  # the default (200 each way, test below) measures the same columns, slower
            "20",
            "--json",
            str(out_json),
            "--markdown",
            str(out_md),
        ]
    )
    assert code == 0
    rows = {r["release"]: r for r in json.loads(out_json.read_text())["rows"]}
    assert [r.get("note") for r in rows.values()] == [None, None, None]
    assert rows["sglang-router==0.1.4"]["chat_flags_reach_engine"] is True
    assert rows["sglang-router==0.1.4"]["chat_fields_reach_client"] is True
    assert rows["sglang-router==0.3.2"]["chat_flags_reach_engine"] is False
    assert rows["sglang-router==0.3.2"]["chat_fields_reach_client"] is False
    assert rows["sglang-router==0.3.2"]["fields_survive_when_emitted"] is True  # responses pass through
    assert rows["smg==1.13.0"]["chat_flags_reach_engine"] is True
    assert all(r["generate_keeps_tokens"] for r in rows.values())
    assert rows["sglang-router==0.1.4"]["post_workers"] is False
    assert rows["sglang-router==0.3.2"]["post_workers"] is True and rows["smg==1.13.0"]["post_workers"] is True
    assert all(r["latency_requests"] == 20 and "added_median_ms" in r for r in rows.values())
    text = out_md.read_text()
    assert "polarstack routers matrix" in text and "| sglang-router==0.3.2 | yes | yes | no | no |" in text


@pytest.mark.unit
@pytest.mark.parametrize("engine,default", [("emulator", 200), ("sglang", 20)])
def test_latency_requests_default_to_200_each_way_or_20_with_the_real_engine(monkeypatch, tmp_path, engine, default):
    asked = []

    def run_matrix(releases, latency_requests, **_kwargs):
        asked.append(latency_requests)
        return []

    monkeypatch.setattr(matrix, "run_matrix", run_matrix)
    monkeypatch.setattr(matrix, "write_outputs", lambda *args: None)
    assert main(["routers", "matrix", "--releases", "smg==1.13.0", "--engine", engine]) == 0
    assert asked == [default]


def test_uninstallable_release_is_a_row(tmp_path, capsys):
    out_json = tmp_path / "m.json"
    assert (
        main(["routers", "matrix", "--releases", "smg==0.0.0", "--json", str(out_json), "--latency-requests", "1"]) == 0
    )
    row = json.loads(out_json.read_text())["rows"][0]
    assert row["installs"] is False and "could not install smg==0.0.0" in row["note"]
    # stderr is no terminal here, so the live bar is replaced by a line per release (progress in a log file)
    assert "routers matrix: 1/1 smg==0.0.0 measured" in capsys.readouterr().err


BOOLEAN_COLUMNS = [key for key, _ in matrix.COLUMNS if key not in ("release", "startup_s") and "ms" not in key]


def test_the_relay_measures_what_the_engine_log_measures(engine_factory):
    """`--engine sglang` reads what reached the engine from a relay in front of it (the real engine keeps no log).
    In front of the emulator the relay's measurement must equal the emulator log's, column by column, on a release
    that forwards Polar's fields and one that drops them: the relay adds nothing a router would not. (The relays are
    put in front of an emulator by hand: `--engine-url` refuses the emulator.)"""
    upstream = engine_factory(seed=0)
    releases = [RouterRelease.parse("sglang-router==0.1.4"), RouterRelease.parse("sglang-router==0.3.2")]
    settings = stack_settings()
    via_log = matrix.run_matrix(
        releases, latency_requests=3, engine="emulator", progress=lambda m: None, settings=settings
    )
    relays = [matrix.start_tap(upstream.url) for _ in range(2)]
    try:
        model = matrix.served_model(settings)
        engines = matrix.Engines("sglang", relays[0][1], relays[1][1], tap.LOG, timeout=10.0, model=model)
        via_relay = [matrix.measure(release, engines, latency_requests=3) for release in releases]
    finally:
        for process, _ in relays:
            stop_pid(process.pid, process)
    for log_row, relay_row in zip(via_log, via_relay, strict=True):
        assert log_row.get("note") is None and relay_row.get("note") is None, (log_row, relay_row)
        assert {k: log_row[k] for k in BOOLEAN_COLUMNS} == {k: relay_row[k] for k in BOOLEAN_COLUMNS}
    assert [r["chat_flags_reach_engine"] for r in via_relay] == [True, False]
    assert [r["fields_survive_when_emitted"] for r in via_relay] == [True, True]
    # issue 32 point 10: Polar's request shapes by value, the same through the relay as in the engine's log
    for log_row, relay_row in zip(via_log, via_relay, strict=True):
        assert log_row["request_at_engine"] == relay_row["request_at_engine"]
    passthrough, stock = via_relay
    for shape in ("chat", "tools"):
        assert passthrough["request_at_engine"][shape]["dropped"] == []
        assert passthrough["request_at_engine"][shape]["changed"] == {}
        assert set(stock["request_at_engine"][shape]["dropped"]) >= {"return_prompt_token_ids", "return_meta_info"}
    assert via_relay[1]["engine"] == "sglang" and via_log[1]["engine"] == "emulator"


def test_engine_url_must_be_the_pinned_real_engine(engine, capsys):
    releases = ["--releases", "smg==1.13.0"]
    assert main(["routers", "matrix", *releases, "--engine-url", "http://127.0.0.1:9"]) == int(ExitCode.USAGE)
    assert "use it with --engine sglang" in capsys.readouterr().err
    dead = ["routers", "matrix", *releases, "--engine", "sglang", "--engine-url", "http://127.0.0.1:9"]
    assert main(dead) == int(ExitCode.UNREACHABLE)
    assert "no real sglang server answers /health at http://127.0.0.1:9" in capsys.readouterr().err
    # the emulator would be reported as the real sglang: refused before any router starts
    assert main(["routers", "matrix", *releases, "--engine", "sglang", "--engine-url", engine.url]) == int(
        ExitCode.USAGE
    )
    assert f"{engine.url} is the engine emulator" in capsys.readouterr().err
