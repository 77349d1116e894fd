"""Issue 26 point 5: checkpoints must not fill the disk.

- One save is 14 B x parameters (bf16 weights + fp32 master + exp_avg + exp_avg_sq): 106.6 GB for the 7B, computed;
  slime saves every save_interval rollouts and keeps them all (recorded: save_model, no retention option).
- `checkpoint.keep_last` (default 2): launch.sh prunes older iter_* beside the job and once after it, never the
  iteration a resumed job started from, never one newer than the tracker (a save being written).
- `make train` refuses (exit 8) when keep_last + 1 saves do not fit the checkpoints volume's free space.
- Polar's saved results (rollout.save_dir under /logs, pruned by nothing; node-path review finding 3) are not in that
  check: `make train` says so, and gives the logs volume's free space when it sits on another filesystem.
"""

import copy
import subprocess
from pathlib import Path

import pytest

from polarstack.cli.main import main
from polarstack.errors import ExitCode, StackError
from polarstack.paths import load_defaults
from polarstack.stack import profiles
from polarstack.stack.cluster import load as load_cluster
from polarstack.train import memory, retention
from polarstack.train.plan import build_plan
from train_fakes import fake_node_for_train

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[3]
P7 = 7_615_616_512


def saves(tmp_path, *iterations, tracker=None):
    for i in iterations:
        (tmp_path / f"iter_{i:07d}").mkdir()
    if tracker is not None:
        (tmp_path / retention.TRACKER).write_text(f"{tracker}\n")
    return tmp_path


def left(directory):
    return retention.iterations(directory)


def test_one_save_and_the_plans_saves():
    config = load_defaults()
    assert retention.save_gb(config) == pytest.approx(14 * P7 / 1e9) and round(retention.save_gb(config), 1) == 106.6
    assert retention.saves_in_plan(200, 5) == 40 and retention.saves_in_plan(3, 2) == 2
    assert retention.peak_saves(config) == 3  # keep_last 2 + the one being written
    assert retention.peak_saves(load_defaults(["checkpoint.keep_last=0"])) == 40


def test_prune_keeps_the_newest_and_the_resumed_one(tmp_path):
    directory = saves(tmp_path, 4, 9, 14, 19, 24, tracker=19)  # iter 24 is being written: newer than the tracker
    assert retention.prune(directory, 2, protect=4) == [9]
    assert left(directory) == [4, 14, 19, 24]
    assert retention.prune(directory, 2) == [4]
    assert left(directory) == [14, 19, 24]


def test_prune_touches_nothing_without_a_complete_save(tmp_path):
    directory = saves(tmp_path, 4, 9, 14)
    assert retention.prune(directory, 1) == [] and left(directory) == [4, 9, 14]  # no tracker
    (directory / retention.TRACKER).write_text("29\n")  # the tracker names a save that is not there
    assert retention.prune(directory, 1) == [] and left(directory) == [4, 9, 14]
    (directory / retention.TRACKER).write_text("14\n")
    assert retention.prune(directory, 0) == []  # keep_last 0 keeps every save, as slime does
    assert retention.main(["--dir", str(directory), "--keep-last", "1", "--protect", "4"]) == 0
    assert left(directory) == [4, 14]


def test_launch_sh_prunes_beside_the_job_and_after_it():
    plan = build_plan(
        "humaneval", profiles.load("engine-direct"), run_id="r", config=load_defaults(), cluster=load_cluster()
    )
    script = plan.files["launch.sh"]
    tracker = f"{plan.checkpoint_dir}/latest_checkpointed_iteration.txt"
    assert f"protect=$(cat {tracker} 2>/dev/null || echo -1)" in script
    watch = f"python3 -m polarstack.train.retention --dir {plan.checkpoint_dir} --keep-last 2 --protect"
    assert f'{watch} "$protect" --watch' in script
    lines = script.splitlines()
    submit = next(i for i, line in enumerate(lines) if line.startswith("ray job submit"))
    assert lines[submit + 1] == 'wait "$submit_pid"'
    assert lines[submit + 2].startswith(watch) and "--watch" not in lines[submit + 2]
    assert lines.index(next(x for x in lines if x.startswith("protect="))) < submit  # read before the job saves
    off = build_plan(
        "humaneval",
        profiles.load("engine-direct"),
        run_id="r",
        config=load_defaults(["checkpoint.keep_last=0"]),
        cluster=load_cluster(),
    )
    assert "polarstack.train.retention" not in off.files["launch.sh"]
    assert any("keep_last 2: at most 3 on the volume (319.9 GB)" in x for x in plan.as_dict()["watch"])


def test_a_bad_keep_last_is_a_usage_error():
    with pytest.raises(StackError) as exc:
        build_plan(
            "humaneval",
            profiles.load("engine-direct"),
            run_id="r",
            config=load_defaults(["checkpoint.keep_last=-1"]),
            cluster=load_cluster(),
        )
    assert exc.value.code == ExitCode.USAGE and "keep_last" in exc.value.message


def test_the_disk_rule():
    config = load_defaults()
    assert retention.disk_problem(config, int(400e9), resume=False, weight_sync_on_disk=False) is None
    problem = retention.disk_problem(config, int(200e9), resume=False, weight_sync_on_disk=False)
    assert "200.0 GB free" in problem and "319.9 GB" in problem
    assert retention.disk_problem(config, int(200e9), resume=True, weight_sync_on_disk=False) is None  # next save fits
    assert "106.6 GB" in retention.disk_problem(config, int(50e9), resume=True, weight_sync_on_disk=False)


def test_the_disk_rule_counts_the_weight_sync_copy():
    """Finding B: each disk weight sync writes a full HF copy (2 B x 7,615,616,512 parameters = 15.2 GB) on the same
    Docker disk; the rule used to count only the saves, so 330 GB free passed for 319.9 GB of saves + 15.2 GB."""
    config = load_defaults()
    assert round(retention.weight_sync_gb(config), 1) == 15.2
    problem = retention.disk_problem(config, int(330e9), resume=False, weight_sync_on_disk=True)
    assert problem is not None and "335.1 GB" in problem and "weight-sync copy of 15.2 GB" in problem
    assert retention.disk_problem(config, int(330e9), resume=False, weight_sync_on_disk=False) is None
    assert retention.disk_problem(config, int(110e9), resume=True, weight_sync_on_disk=True) is not None
    assert retention.disk_problem(config, int(122e9), resume=True, weight_sync_on_disk=True) is None


def _docker_train(tmp_path, monkeypatch, free: str, devices: str = "66\n66\n", logs_free: str = "900000000000"):
    from polarstack.stack import compose

    fake_node_for_train(monkeypatch, tmp_path)
    ran = []

    def trainer(profile, args, **kw):
        if "df" in args:
            return subprocess.CompletedProcess(args, 0, f"     Avail\n{free}\n", "")
        if args[-2:-1] == ["-c"] and args[-1].startswith("stat -c %d /checkpoints /logs && df -B1 --output=avail"):
            return subprocess.CompletedProcess(args, 0, f"{devices}     Avail\n{logs_free}\n", "")
        ran.append(args[-1])
        return subprocess.CompletedProcess(args, 0, "", "")

    monkeypatch.setattr(compose, "run_compose", trainer)
    return main(["train", "--task", "humaneval", "--runtime", "docker", "--without-rehearsal"]), ran


def test_make_train_refuses_when_the_saves_cannot_fit_the_volume(tmp_path, monkeypatch, capsys):
    code, ran = _docker_train(tmp_path, monkeypatch, "250000000000")
    err = capsys.readouterr().err
    assert code == ExitCode.ENVIRONMENT and "250.0 GB free" in err and "335.1 GB" in err and "weight-sync copy" in err
    assert not [a for a in ran if a.endswith(".sh")]  # the job never started


def test_make_train_launches_when_they_fit(tmp_path, monkeypatch, capsys):
    code, ran = _docker_train(tmp_path, monkeypatch, "2000000000000")
    assert code == 0, capsys.readouterr().err
    assert any(a.endswith("launch.sh") for a in ran)


def test_the_logs_probe_reads_whether_the_results_share_the_checkpoints_filesystem():
    probe = retention.logs_probe("/checkpoints", "/logs")
    assert probe == "stat -c %d /checkpoints /logs && df -B1 --output=avail /logs"
    assert retention.parse_logs_probe("2049\n2049\n     Avail\n123\n") == (True, 123)
    assert retention.parse_logs_probe("2049\n64769\n     Avail\n123\n") == (False, 123)
    for broken in ("", "2049\n", "2049\n2049\n     Avail\n", "stat: cannot stat '/logs'\n"):
        assert retention.parse_logs_probe(broken) is None
    assert "not counted" in retention.logs_sentence(None, "/logs/polar-rollouts")


def test_make_train_says_the_results_share_the_checkpoints_filesystem(tmp_path, monkeypatch, capsys):
    code, _ = _docker_train(tmp_path, monkeypatch, "2000000000000")
    err = capsys.readouterr().err
    assert code == 0, err
    assert "/logs/polar-rollouts" in err and "share the checkpoints' filesystem but are not counted" in err


def test_make_train_gives_the_free_space_of_the_results_own_filesystem(tmp_path, monkeypatch, capsys):
    code, _ = _docker_train(tmp_path, monkeypatch, "2000000000000", devices="66\n67\n", logs_free="12300000000")
    err = capsys.readouterr().err
    assert code == 0, err
    assert "/logs/polar-rollouts" in err and "12.3 GB free on their own filesystem" in err


def test_the_results_dir_is_the_plans_save_dir():
    import yaml

    from polarstack.train import cluster_plan

    plan = build_plan(
        "humaneval", profiles.load("engine-direct"), run_id="r", config=load_defaults(), cluster=load_cluster()
    )
    assert yaml.safe_load(plan.files["topology.yaml"])["rollout"]["save_dir"] == cluster_plan.POLAR_RESULTS_DIR
    assert cluster_plan.POLAR_RESULTS_DIR.startswith(cluster_plan.LOGS_VOLUME + "/")
    compose = yaml.safe_load((ROOT / "compose" / "compose.yaml").read_text())
    assert f"logs:{cluster_plan.LOGS_VOLUME}" in compose["services"]["trainer"]["volumes"]


def test_verify_offline_reads_that_slime_keeps_every_save():
    from polarstack.offline import memory_facts

    data = copy.deepcopy(memory.record())
    assert data["slime"]["save_model"]["found"] and not data["slime"]["no_retention_option"]["matches"]
    data["slime"]["no_retention_option"]["matches"] = ['"--keep-last-checkpoints"']
    assert any("retention option" in p for p in memory_facts.fact_problems(data))
    data = copy.deepcopy(memory.record())
    data["slime"]["save_model"]["found"] = [{"line": 1, "text": "save(rollout_id, self.model)"}]
    assert any("optimizer's state" in p for p in memory_facts.fact_problems(data))


def test_verify_offline_reads_that_each_disk_weight_sync_writes_a_copy_removed_after_the_reload():
    from polarstack.offline import memory_facts

    assert not [p for p in memory_facts.fact_problems() if "weight_sync" in p]
    data = copy.deepcopy(memory.record())
    data["slime"]["weight_sync_full_hf_copy"]["found"] = [{"line": 1, "text": "save_delta_to_path("}]
    assert any("full HF copy" in p for p in memory_facts.fact_problems(data))
    data = copy.deepcopy(memory.record())
    data["slime"]["weight_sync_copy_removed"]["found"] = [{"line": 1, "text": "pass"}]
    assert any("removed after the reload" in p for p in memory_facts.fact_problems(data))


def test_verify_offline_sees_a_disk_check_that_ignores_the_weight_sync_copy(monkeypatch):
    from polarstack.offline import memory_facts

    plan = build_plan(
        "humaneval", profiles.load("engine-direct"), run_id="r", config=load_defaults(), cluster=load_cluster()
    )
    assert memory_facts.weight_sync_problems("engine-direct", plan, load_defaults()) == []
    real = retention.disk_problem
    monkeypatch.setattr(
        retention, "disk_problem", lambda c, f, r, *, weight_sync_on_disk: real(c, f, r, weight_sync_on_disk=False)
    )
    assert memory_facts.weight_sync_problems("engine-direct", plan, load_defaults())
