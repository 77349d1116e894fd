"""Pins issue 10 points 2, 6 and 7 without a GPU: the training launch uses only Polar bridge entry points whose slime
API exists at the pinned slime (today's --data-source-path CeilEpochRolloutDataSourceWithBuffer does not); the
recorded facts are complete and regenerable (scripts/tools/record_bridge_api.py on synthetic sources); checkpoints
are saved (--save-interval), dropout is 0.0 and `make train RESUME=1` loads the run's own save directory, refused
inside the trainer when there is no checkpoint; the weight-sync transport is a knob whose meaning verify-offline
checks (disk: one volume at one path in trainer and engines; nccl: host network and IPC)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from polarstack.checks import bridge as bridge_check
from polarstack.cli.main import main
from polarstack.errors import ExitCode, StackError
from polarstack.offline import meaning
from polarstack.paths import load_defaults
from polarstack.pins import pins, repo_root
from polarstack.stack import profiles
from polarstack.stack.cluster import load as load_cluster
from polarstack.train.plan import RESUME_REFUSED, build_plan, checkpoint_guard

pytestmark = pytest.mark.unit
CEIL = "slime_bridge.data_source.CeilEpochRolloutDataSourceWithBuffer"
DELEGATE = "slime_bridge.rollout.generate_rollout_polar_async"


@pytest.fixture(autouse=True)
def no_local_state(tmp_path, monkeypatch):
    monkeypatch.setenv("POLARSTACK_RUN_DIR", str(tmp_path / "run"))


def plan(profile="engine-direct", **kwargs):
    return build_plan("humaneval", profiles.load(profile), run_id="t", cluster=load_cluster(), **kwargs)


def record_tool():
    path = repo_root() / "scripts" / "tools" / "record_bridge_api.py"
    spec = importlib.util.spec_from_file_location("record_bridge_api", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# --- point 2: the bridge vs the pinned slime ----------------------------------------------------------------


def test_todays_data_source_needs_slime_api_the_pin_lacks():
    args = plan().train_args
    assert "--data-source-path" not in args
    problems = bridge_check.check([*args, "--data-source-path", CEIL], DELEGATE)
    assert problems and all("--data-source-path" in p for p in problems)
    joined = " ".join(problems)
    for missing in ("_state_lock", "_cursor_state_locked", "_restore_checkpoint_state_locked"):
        assert f"RolloutDataSourceWithBuffer.{missing}" in joined
    assert "falls back to slime's default data source" in joined


@pytest.mark.parametrize("profile", profiles.PROFILE_ORDER)
def test_the_launch_needs_only_slime_api_the_pin_defines(profile):
    assert bridge_check.check(plan(profile).train_args, load_defaults()["gate"]["delegate"]) == []


def test_an_unrecorded_bridge_entry_point_is_refused():
    problems = bridge_check.check(["--custom-rm-path", "slime_bridge.reward.other_func"], DELEGATE)
    assert any("slime_bridge.reward.other_func is not recorded" in p for p in problems)


def test_recorded_facts_are_complete_and_follow_the_pins():
    bridge, slime = bridge_check.facts()
    assert bridge["polar_commit"] == pins()["POLAR_COMMIT"] and slime["slime_commit"] == pins()["SLIME_COMMIT"]
    needed = {
        r["symbol"]
        for rec in bridge["entry_points"].values()
        for r in rec["requires"]
        if r["symbol"].startswith("slime")
    }
    assert needed <= set(slime["symbols"]), needed - set(slime["symbols"])
    # the rollout's fallback: slime's default data source has get_samples, not the reservation API
    default = slime["options"]["--data-source-path"]["default"]
    assert default == "slime.rollout.data_source.RolloutDataSourceWithBuffer"
    assert slime["symbols"][f"{default}.get_samples"]["exists"]
    assert not slime["symbols"][f"{default}.get_samples_with_reservation"]["exists"]
    assert set(slime["options"]["--update-weight-transport"]["choices"]) == set(profiles.WEIGHT_SYNC_TRANSPORTS)


def _git_repo(root: Path, files: dict[str, str]) -> str:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    env = {
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t",
        "PATH": "/usr/bin:/bin",
        "HOME": str(root),
    }
    for cmd in (["git", "init", "-q"], ["git", "add", "-A"], ["git", "commit", "-qm", "x"]):
        subprocess.run(cmd, cwd=root, check=True, env=env)
    return subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=root, check=True, capture_output=True, text=True
    ).stdout.strip()


def test_record_tool_regenerates_the_facts_from_sources(tmp_path):
    """Synthetic sources in the shapes the tool reads (written here, not upstream code)."""
    tool = record_tool()
    polar = tmp_path / "polar"
    (polar / "src" / "bridge").mkdir(parents=True)
    (polar / "src" / "bridge" / "__init__.py").write_text("")
    (polar / "src" / "bridge" / "ds.py").write_text(
        "from slime.data import Base\n"
        "class Mine(Base):\n"
        "    KEY = 1\n"
        "    def __init__(self, args):\n"
        "        super().__init__(args)\n"
        "        self.own = 0\n"
        "    def take(self, n):\n"
        "        with self._lock:\n"
        "            return super().take(n) + [self.own, self.cursor, self.KEY]\n"
    )
    (polar / "src" / "bridge" / "fn.py").write_text(
        "def entry(args, rollout_id, data_source):\n"
        "    from slime.types import Out\n"
        "    getter = getattr(data_source, 'take_reserved', None)\n"
        "    return Out(data_source.take(1))\n"
    )
    bridge = tool.record_polar(polar, "p" * 40, ["bridge.ds.Mine", "bridge.fn.entry"])
    mine = {r["symbol"]: r for r in bridge["entry_points"]["bridge.ds.Mine"]["requires"]}
    assert set(mine) == {
        "slime.data.Base._lock",
        "slime.data.Base.take",
        "slime.data.Base.cursor",
        "slime.data.Base.__init__",
    }
    assert mine["slime.data.Base._lock"]["where"] == "take"
    entry = {r["symbol"]: r["need"] for r in bridge["entry_points"]["bridge.fn.entry"]["requires"]}
    assert entry == {
        "slime.types.Out": "required",
        "<data_source>.take": "required",
        "<data_source>.take_reserved": "optional",
    }

    slime = tmp_path / "slime"
    commit = _git_repo(
        slime,
        {
            "slime/__init__.py": "",
            "slime/types.py": "class Out:\n    pass\n",
            "slime/data.py": "class Root:\n    def __init__(self, args):\n        self.cursor = 0\n"
            "class Base(Root):\n    def take(self, n):\n        return []\n",
            "slime/utils/arguments.py": "def add(parser):\n    parser.add_argument('--data-source-path', type=str, "
            "default='slime.data.Base')\n",
        },
    )
    facts = tool.record_slime(slime / ".git", commit, bridge, ["--data-source-path"])
    exists = {s: f["exists"] for s, f in facts["symbols"].items()}
    assert exists["slime.data.Base.take"] and exists["slime.data.Base.cursor"] and exists["slime.types.Out"]
    assert exists["slime.data.Base.__init__"]  # inherited from Root
    assert not exists["slime.data.Base._lock"] and not exists["slime.data.Base.take_reserved"]
    assert facts["options"]["--data-source-path"]["default"] == "slime.data.Base"
    assert facts["slime_commit"] == commit


def test_record_tool_runs_as_a_script(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(repo_root() / "scripts" / "tools" / "record_bridge_api.py"), "--help"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0 and "polar" in proc.stdout and "slime" in proc.stdout


# --- point 6: checkpoints, dropout, resume ------------------------------------------------------------------------


def test_checkpoints_dropout_and_a_stable_save_dir():
    first, second = (
        plan().train_args,
        build_plan("humaneval", profiles.load("engine-direct"), run_id="other", cluster=load_cluster()).train_args,
    )
    save = first[first.index("--save") + 1]
    assert save == second[second.index("--save") + 1] == "/checkpoints/polarstack/humaneval-engine-direct"
    assert first[first.index("--save-interval") + 1] == str(load_defaults()["checkpoint"]["save_interval"]) == "5"
    assert first[first.index("--attention-dropout") + 1] == "0.0" == first[first.index("--hidden-dropout") + 1]
    assert "--load" not in first and meaning.hygiene_problems(first) == []
    resumed = plan(resume=True).train_args
    assert resumed[resumed.index("--load") + 1] == save and meaning.hygiene_problems(resumed) == []


def test_the_old_launch_fails_the_hygiene_check():
    args = plan().train_args
    for flag in ("--save-interval", "--attention-dropout", "--hidden-dropout"):
        i = args.index(flag)
        args = args[:i] + args[i + 2 :]
    problems = " ".join(meaning.hygiene_problems(args))
    assert "--save-interval" in problems and "--attention-dropout" in problems and "--hidden-dropout" in problems


def _guard(tmp_path: Path, resume: bool, checkpoint: bool) -> subprocess.CompletedProcess:
    config = load_defaults([f"model.save={tmp_path}"])
    p = build_plan(
        "humaneval", profiles.load("engine-direct"), run_id="t", config=config, resume=resume, cluster=load_cluster()
    )
    if checkpoint:
        Path(p.checkpoint_dir).mkdir(parents=True)
        (Path(p.checkpoint_dir) / "latest_checkpointed_iteration.txt").write_text("20\n")
    script = "set -euo pipefail\n" + "\n".join(checkpoint_guard(p)) + "\necho launched\n"
    assert "\n".join(checkpoint_guard(p)) in p.files["launch.sh"]
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True)


@pytest.mark.parametrize(
    "resume,checkpoint,refused", [(True, False, True), (True, True, False), (False, False, False), (False, True, True)]
)
def test_launch_guard_inside_the_trainer(tmp_path, resume, checkpoint, refused):
    proc = _guard(tmp_path, resume, checkpoint)
    assert proc.returncode == (RESUME_REFUSED if refused else 0), proc.stderr
    assert ("launched" in proc.stdout) != refused
    if refused:
        assert len(proc.stderr.strip().splitlines()) == 1
        assert ("RESUME=1 found no checkpoint" if resume else "RESUME=1 continues it") in proc.stderr


def test_resume_flag_reaches_the_plan(capsys):
    assert main(["train", "--task", "humaneval", "--dry-run", "--json", "--resume"]) == 0
    p = json.loads(capsys.readouterr().out)
    assert p["resume"] is True and f"--load {p['checkpoint_dir']}" in p["commands"][-1]
    assert any("latest_checkpointed_iteration.txt" in line for line in p["watch"])


def test_makefile_passes_resume():
    text = (repo_root() / "Makefile").read_text()
    assert "RESUME ?=" in text and "$(if $(filter 1 yes true,$(RESUME)),--resume)" in text
    assert '$(foreach s,$(SET),--set "$(s)")' in text  # the guard's advice (SET=checkpoint.run_name=NEW) works


# --- point 7: weight sync across containers ---------------------------------------------------------------------


def _services(engine_mount="/shared/weight-updates", ipc="host"):
    def svc(mount):
        return {
            "network_mode": "host",
            "ipc": ipc,
            "volumes": [{"type": "volume", "source": "weight-updates", "target": mount}] if mount else [],
        }

    return {"trainer": svc("/shared/weight-updates"), "engine-0": svc(engine_mount)}


def test_disk_is_the_default_and_needs_one_shared_mount():
    args = plan().train_args
    assert args[args.index("--update-weight-transport") + 1] == "disk"
    assert args[args.index("--update-weight-disk-dir") + 1] == "/shared/weight-updates"
    assert meaning.weight_sync_problems(args, _services()) == []
    assert "engine-0 does not mount /shared/weight-updates" in meaning.weight_sync_problems(args, _services(None))[0]
    assert "not one shared volume at one path" in " ".join(meaning.weight_sync_problems(args, _services("/shared")))


def test_nccl_is_a_knob_that_needs_host_network_and_ipc(monkeypatch):
    monkeypatch.setenv("WEIGHT_SYNC_TRANSPORT", "nccl")
    args = plan().train_args
    assert args[args.index("--update-weight-transport") + 1] == "nccl" and "--update-weight-disk-dir" not in args
    assert meaning.weight_sync_problems(args, _services()) == []
    assert any("ipc=" in p for p in meaning.weight_sync_problems(args, _services(ipc="private")))


def test_nccl_is_the_slime_default_when_nothing_is_passed():
    problems = meaning.weight_sync_problems(["--save", "/x"], _services(ipc="private"))
    assert problems and "NCCL" in problems[0]


def test_unknown_transport_is_refused(monkeypatch):
    monkeypatch.setenv("WEIGHT_SYNC_TRANSPORT", "carrier-pigeon")
    with pytest.raises(StackError) as exc:
        profiles.load("engine-direct")
    assert exc.value.code == ExitCode.USAGE and "WEIGHT_SYNC_TRANSPORT=carrier-pigeon" in exc.value.message


SLIME_GIT = Path(__import__("os").environ.get("SLIME_GIT_DIR", "/work/.mirror/THUDM+slime/repo"))


@pytest.mark.skipif(not SLIME_GIT.exists(), reason=f"needs a slime git directory (SLIME_GIT_DIR, default {SLIME_GIT})")
def test_slime_api_json_is_what_the_tool_records_from_the_pinned_slime():
    bridge, committed = bridge_check.facts()
    fresh = record_tool().record_slime(SLIME_GIT, pins()["SLIME_COMMIT"], bridge, list(committed["options"]))
    assert fresh["symbols"] == committed["symbols"] and fresh["options"] == committed["options"]
