"""Issue 32 point 8: the rehearsal touches the 7B. Its CPU tests are the dry-run rendering of both 7B parts (the
train-only step on a synthetic rollout under slime's --load-debug-rollout-data, the reload into engine-0) with the
host-memory terms, and a format check of the synthetic rollout against slime's Sample at SLIME_COMMIT (recorded in
configs/upstream/rehearsal-keys.json); what only the node shows (the step's peak memory, the reload) is judged by
the report against fakes (tests/unit/train/test_rehearsal_run.py)."""

import copy
import json
import sys
import types

import pytest

from polarstack.checks import rehearsal_report
from polarstack.cli.main import main
from polarstack.offline import rehearsal_keys
from polarstack.stack import profiles
from polarstack.stack.cluster import load as load_cluster
from polarstack.train import preflight, synthetic_rollout

pytestmark = pytest.mark.unit
WORKING = ["engine-direct", "router-passthrough", "patched-router"]
SAMPLE = rehearsal_keys.record()["slime"]["sample"]


def _rows(**kw):
    shape = dict(prompts=3, per_prompt=2, seq_tokens=32768, prompt_tokens=2048) | kw
    return synthetic_rollout.samples(**shape)


def test_the_synthetic_rollout_is_in_the_format_slime_loads():
    rows = _rows()
    data = {"rollout_id": 0, "samples": rows}
    assert synthetic_rollout.format_problems(data, SAMPLE, count=6, seq_tokens=32768, vocab=152064) == []
    assert set(rows[0]) <= set(SAMPLE["fields"]) and rows[0]["status"] in SAMPLE["status_values"]
    assert [r["reward"] for r in rows] == [1.0, 0.0] * 3 and [r["group_index"] for r in rows] == [0, 0, 1, 1, 2, 2]
    assert all(len(r["tokens"]) == 32768 and r["response_length"] == 30720 == len(r["loss_mask"]) for r in rows)


@pytest.mark.parametrize(
    "breakage, expected",
    [
        (lambda d: d["samples"][0].update(status="ok"), "not a Sample.Status value"),
        (lambda d: d["samples"][1].update(reward_key=1), "are not fields of slime's Sample"),
        (lambda d: d["samples"][2].update(loss_mask=[1]), "loss mask length"),
        (lambda d: d["samples"][3]["tokens"].__setitem__(5, 152064), "outside 0..152063"),
        (lambda d: d["samples"].pop(), "5 samples, not n_samples_per_prompt x rollout_batch_size = 6"),
        (lambda d: [r.update(reward=1.0) for r in d["samples"]], "a group with one reward only"),
        (lambda d: d.update(data=d.pop("samples")), "slime writes and reads rollout_id and samples"),
    ],
)
def test_a_broken_synthetic_rollout_fails_the_format_check(breakage, expected):
    data = {"rollout_id": 0, "samples": copy.deepcopy(_rows(seq_tokens=64, prompt_tokens=8))}
    breakage(data)
    problems = synthetic_rollout.format_problems(data, SAMPLE, count=6, seq_tokens=64, vocab=152064)
    assert any(expected in p for p in problems), problems


def test_the_writer_saves_the_dict_slime_loads(tmp_path, monkeypatch):
    saved = {}
    fake_torch = types.SimpleNamespace(save=lambda obj, path: saved.update(obj=obj, path=path))
    monkeypatch.setitem(sys.modules, "torch", fake_torch)
    out = tmp_path / "synthetic-rollout-0.pt"
    argv = ["--out", str(out), "--prompts", "1", "--per-prompt", "2", "--seq-tokens", "64", "--prompt-tokens", "8"]
    assert synthetic_rollout.main(argv) == 0
    assert saved["path"] == out and set(saved["obj"]) == {"rollout_id", "samples"}
    assert synthetic_rollout.format_problems(saved["obj"], SAMPLE, count=2, seq_tokens=64, vocab=152064) == []


@pytest.mark.parametrize("name", WORKING)
def test_make_preflight_dry_run_shows_the_7b_parts_and_the_host_memory_terms(name, capsys):
    assert main(["preflight", "--profile", name, "--dry-run"]) == 0
    out = capsys.readouterr().out
    for needle in (
        "the 7B's train-only step (launch-7b-step.sh)",
        "in slime's --load-debug-rollout-data format",
        "POST http://127.0.0.1:30000/update_weights_from_disk model_path=/models/Qwen2.5-7B-Instruct",
        "the 7B's parts add about",
        "(an estimate from sizes and stated rates, not measured) to the 15-minute goal",
        "Ray's object store: ray start --object-store-memory",
        "memory per host",
        "--load-debug-rollout-data",
        "nvidia-smi --query-gpu=index,memory.used",
        "# the 7B's parts (the real run's model and memory plan):",
        "memory (computed from the plan, not measured; decimal GB): Qwen2.5-7B-Instruct",
        "the 7B's parts' added time (an estimate from sizes and stated rates, not measured):",
    ):
        assert needle in out, needle
    assert out.count("memory per host") == 2  # the small model's and the 7B's
    plan = json.loads((main(["preflight", "--profile", name, "--dry-run", "--json"]), capsys.readouterr().out)[1])
    seven = plan["seven_b"]
    assert seven["model"] == "Qwen2.5-7B-Instruct" and seven["synthetic_rollout"]["tokens_per_sample"] == 32768
    assert "--load-debug-rollout-data" in seven["train_step"] and "--save-interval" not in seven["train_step"]
    assert "slime_bridge" not in seven["train_step"] and "train_async.py" in seven["train_step"]
    assert 0 < seven["estimate_per_trainer_gpu_gb"] <= 140 and seven["added_seconds_estimate"]["total"] > 0


@pytest.mark.parametrize("name", WORKING)
def test_make_train_dry_run_shows_the_rehearsals_7b_parts_and_the_host_memory_terms(name, capsys):
    assert main(["train", "--task", "humaneval", "--profile", name, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "make preflight's 7B parts" in out and "update_weights_from_disk" in out
    assert "Ray's object store: ray start --object-store-memory" in out and "--object-store-memory=8000000000" in out


def test_the_7b_plan_means_what_slimes_lines_say():
    plan = preflight.build(profiles.load("engine-direct"), run_id="t", cluster=load_cluster())
    assert preflight.seven_b_problems(plan.seven_b) == []
    keys = copy.deepcopy(rehearsal_keys.record())
    keys["slime"]["sample"]["fields"].remove("rollout_log_probs")  # a slime whose Sample lacks a field we write
    assert any("not fields of slime's Sample" in p for p in preflight.seven_b_problems(plan.seven_b, keys))
    keys = copy.deepcopy(rehearsal_keys.record())
    keys["slime"]["facts"]["debug_load_sets_train_only"]["text"] = "args.debug_train_only = False"
    assert any("no longer turns on debug-train-only" in p for p in preflight.seven_b_problems(plan.seven_b, keys))
    keys = copy.deepcopy(rehearsal_keys.record())
    keys["slime"]["facts"]["debug_train_only_no_rollout_gpus"]["text"] = "return actor_num_gpus, actor_num_gpus"
    assert any("takes no rollout GPUs" in p for p in preflight.seven_b_problems(plan.seven_b, keys))
    broken = copy.deepcopy(plan.seven_b)
    broken.train_args = [a for a in broken.train_args if a != "--load-debug-rollout-data"]
    assert any("would start rollout servers" in p for p in preflight.seven_b_problems(broken))


def test_the_report_judges_the_7b_step_against_the_estimate():
    import rehearsal_fakes as fakes

    e = fakes.passing_evidence()
    assert {v.name: v.verdict for v in rehearsal_report.judge(e)}["seven_b_step"] == "pass"
    e["seven_b"] = fakes.seven_b_evidence(peak=120.0)  # above the 117.7 GB estimate, below the card
    v = next(v for v in rehearsal_report.judge(e) if v.name == "seven_b_step")
    assert v.verdict == "warn" and "GPU 0" in v.change and rehearsal_report.report(e)["passed"]
    e["seven_b"] = fakes.seven_b_evidence(peak=141.0)
    assert rehearsal_report.report(e)["first_failure"] == "seven_b_step"
    del e["seven_b"]
    assert rehearsal_report.report(e)["first_failure"] == "seven_b_step"


def test_the_reload_posts_what_sglangs_update_weights_from_disk_reads():
    from polarstack.engine import tool_parser

    text = tool_parser.wheel_text("sglang/srt/managers/io_struct.py")
    assert rehearsal_keys.reload_problems(text) == []
    renamed = text.replace(
        "    weight_version: Optional[str] = None\n    # Whether to update weights asynchronously",
        "    version: Optional[str] = None\n    # Whether to update weights asynchronously",
    )
    assert renamed != text
    assert any("has no ['weight_version']" in p for p in rehearsal_keys.reload_problems(renamed))
