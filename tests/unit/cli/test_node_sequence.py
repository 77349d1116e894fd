"""Issue 26 point 3: the documented sequence runs as written. The README's node table lists the steps in
docs/gpu-node.md's order (preflight needs the stack down and takes it down, so `make up` follows it and `make train`
comes after that), and each of its commands, run with `make` exactly as the table writes it against the fake node
(tests/fake_node.py; tests/node_sequence/sitecustomize.py answers for the engines and the jobs the fake runs none
of), exits 0. Before the fix, README ran `make up` before `make preflight`, which refuses while a stack is up (exit
9), and the following `make train` found no stack (preflight takes it down)."""

import json
import os
import re
import subprocess

import pytest

import fake_node
from polarstack.errors import ExitCode
from polarstack.pins import repo_root

pytestmark = pytest.mark.unit
ROOT = repo_root()


def readme_steps() -> list[str]:
    """The first `make ...` command of each row of README's node table, in order."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## On the GPU node") :]
    table = section[section.index("| step |") :].split("\n\n", 1)[0].splitlines()[2:]
    return [re.search(r"`(make [^`]+)`", row.split("|")[1]).group(1) for row in table]


def gpu_node_steps() -> list[str]:
    """The make commands of docs/gpu-node.md's "Steps from a fresh node", in order."""
    text = (ROOT / "docs" / "gpu-node.md").read_text()
    block = text[text.index("## Steps from a fresh node") :].split("```bash", 1)[1].split("```", 1)[0]
    return [line.split("#", 1)[0].strip() for line in block.splitlines() if line.startswith("make ")]


def test_the_readme_lists_the_steps_in_the_gpu_node_order():
    assert readme_steps() == gpu_node_steps()
    steps = [s.split()[1] for s in readme_steps()]
    assert steps.index("preflight") < steps.index("up") < steps.index("smoke") < steps.index("train")


def trainer_report() -> str:  # what `polarstack smoke --in-trainer --json` prints on a path that passes
    return json.dumps(
        {
            "verdict": "pass",
            "exit_code": 0,
            "code": ExitCode.OK.name,
            "message": "2 requests, 18 trainable tokens",
            "route": "base",
            "base_url": "http://127.0.0.1:30000",
            "model": "m",
            "polar_verdict": "trainable",
            "installed_polar": "agrees",
            "trainable_tokens": 18,
            "requests": [],
        }
    )


def test_each_step_of_the_readme_table_runs_as_written_on_the_fake_node(tmp_path, monkeypatch):
    fake_node.install(tmp_path, monkeypatch)
    monkeypatch.setenv("FAKE_VOLUME", "1")
    monkeypatch.setenv("FAKE_IMAGES", fake_node.IMAGES)
    monkeypatch.setenv("FAKE_RUNNING", "engine-0 trainer")  # what `compose ps` lists once the stack is up
    monkeypatch.setenv("FAKE_TRAINER_SMOKE", trainer_report())
    monkeypatch.setenv("POLARSTACK_FAKE_NODE_SEQUENCE", "1")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT / "tests" / "node_sequence"), str(ROOT / "tests")]))
    for name in ("PROFILE", "RUNTIME", "MODEL_NAME", "MODEL_PATH", "SERVED_MODEL_NAME", "ALLOW_NO_PREFLIGHT"):
        monkeypatch.delenv(name, raising=False)
    ran = []
    for step in readme_steps():
        proc = subprocess.run(["bash", "-c", step], cwd=ROOT, capture_output=True, text=True, timeout=300)
        ran.append((step, proc.returncode))
        assert proc.returncode == 0, f"{step} exited {proc.returncode} after {ran[:-1]}:\n{proc.stderr[-3000:]}"
    steps = [s.split()[1] for s in readme_steps()]
    assert "preflight" in steps and "train" in steps  # the sequence reached the rehearsal and the run
    run_dir = tmp_path / "run"
    assert json.loads((run_dir / "preflight" / "engine-direct.json").read_text())["passed"]
    assert json.loads((run_dir / "docker-state.json").read_text())["profile"] == "engine-direct"  # make up's record
