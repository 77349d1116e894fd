"""Pins the local runtime: `up` starts a profile's topology on 127.0.0.1 (emulated engines + the real router),
`smoke` finds the base URL in the run state, `up` twice refuses, `down` stops exactly the recorded pids (routers
that retitle themselves included) and `down` with nothing up is a clear no-op. Also runs `make demo`'s profiles, and `up` on ports a stopped stack left in TIME_WAIT."""

import json
import sys
from pathlib import Path

import pytest

from polarstack import processes
from polarstack.cli.main import main
from polarstack.errors import ExitCode
from polarstack.stack import local, profiles

pytestmark = pytest.mark.router


@pytest.fixture
def run_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("POLARSTACK_RUN_DIR", str(tmp_path / "run"))
    yield tmp_path / "run"
    local.down(directory=tmp_path / "run")  # never leave processes behind, even when a test fails


def test_up_smoke_down_patched_router(run_dir, capsys):
    assert main(["up", "--profile", "patched-router", "--json"]) == 0
    state = json.loads(capsys.readouterr().out)
    roles = [p["role"] for p in state["processes"]]
    assert roles == ["engine-0", "engine-1", "router"]
    assert state["base_url"] == state["processes"][-1]["url"]
    assert all(p["url"].startswith("http://127.0.0.1:") for p in state["processes"])

    assert main(["up", "--profile", "engine-direct"]) == ExitCode.STATE
    assert "already up" in capsys.readouterr().err

    assert main(["smoke", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["base_url"] == state["base_url"] and report["route"] == "base"

    pids = [p["pid"] for p in state["processes"]]
    assert main(["down"]) == 0
    capsys.readouterr()
    assert all(processes.start_time(pid) is None for pid in pids), "down left a process running"
    assert main(["down"]) == 0
    assert "nothing is up" in capsys.readouterr().err


def test_smoke_without_state_or_url_is_a_usage_error(run_dir, capsys):
    assert main(["smoke"]) == ExitCode.USAGE
    assert "make up" in capsys.readouterr().err


def test_stale_state_is_replaced(run_dir, capsys):
    assert main(["up", "--profile", "engine-direct"]) == 0
    state = local.read_state()
    for proc in state.processes:
        from polarstack.processes import stop_pid

        stop_pid(proc["pid"])
    assert main(["up", "--profile", "engine-direct"]) == 0  # the dead topology does not block a new one
    assert main(["down"]) == 0


def test_demo_profiles_behave_as_documented(capsys):
    code = main(["demo", "--json"])
    result = json.loads(capsys.readouterr().out)
    rows = {row["profile"]: row for row in result["rows"]}
    assert code == 0, rows
    for name in ("router-passthrough", "engine-direct", "patched-router"):
        assert rows[name]["verdict"] == "pass" and rows[name]["trainable_tokens"] > 0
        # issue 19: the part of make preflight's report the local runtime measures, the rest left to the node
        part = {v["class"]: v["verdict"] for v in rows[name]["rehearsal"]}
        assert part.pop("trainable_tokens") == "pass" and part.pop("tool_calls") == "pass"
        assert set(part.values()) == {"node"}
    stock = rows["stock-router"]
    assert stock["verdict"] == "TOKENS_MISSING"
    assert stock["fields_missing"] == ["return_prompt_token_ids", "return_meta_info"]


@pytest.mark.parametrize(
    "profile,code,needle",
    [
        ("stock-router", ExitCode.GATE, "refusing to launch humaneval on stock-router: zero trainable tokens"),
        ("engine-direct", ExitCode.ENVIRONMENT, "the gate passed, but training needs the GPU stack"),
    ],
)
def test_train_is_gated_by_the_smoke(run_dir, capsys, profile, code, needle):
    assert main(["up", "--profile", profile]) == 0
    capsys.readouterr()
    assert main(["train", "--task", "humaneval"]) == code
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err
    assert not (run_dir / "train").exists()  # nothing was rendered for a launch


def test_up_right_after_down_binds_the_ports_left_in_time_wait(run_dir, capsys, monkeypatch):
    """Issue 34: a stack stopped a moment ago leaves its ports in TIME_WAIT. The probe of both runtimes
    (processes.port_taken) calls them free, and the local runtime's emulated engines and real router really listen
    there at once (each binds with SO_REUSEADDR, as the probe does)."""
    from polarstack.processes import free_port, port_taken
    from polarstack.stack import stack_faults

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import time_wait

    left = [time_wait.leave_time_wait() for _ in range(3)]  # engine-0, engine-1, the router
    assert not any(port_taken(port) for port in left)
    monkeypatch.setenv("ENGINE_PORT_BASE", str(left[0]))
    for key in ("RAY_GCS_PORT", "RAY_DASHBOARD_PORT"):
        monkeypatch.setenv(key, "0")
    from polarstack.stack import ports

    monkeypatch.setattr(ports, "ray_fixed_ports", lambda data=None: {})  # a Ray head of another test may hold them
    stack_faults.refuse_taken_ports(profiles.load("engine-direct"))  # `make up`'s check passes on them
    handed = iter(left)  # the local runtime at NODES=1 picks free ports: hand it the ones in TIME_WAIT first
    monkeypatch.setattr(local, "free_port", lambda: next(handed, None) or free_port())
    assert main(["up", "--profile", "patched-router", "--json"]) == 0
    state = json.loads(capsys.readouterr().out)
    assert [(p["role"], p["port"]) for p in state["processes"]] == [
        ("engine-0", left[0]),
        ("engine-1", left[1]),
        ("router", left[2]),
    ]
    assert all(port_taken(port) for port in left)  # listening there now
    assert main(["smoke", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["trainable_tokens"] > 0
