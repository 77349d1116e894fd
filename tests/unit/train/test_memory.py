"""Issue 26 point 1: the plan's memory per trainer GPU, engine GPU and host, and the check against the node.

- The estimate moves with TP, DP, max_tokens_per_gpu and the model (the 7B, and the rehearsal's 3B: tied embeddings,
  vocab 151,936), each term recomputed here from the formula the module states.
- engine-direct does not fit a 140 GB card without offload, so slime's offload flags are added; the router profiles
  fit without; 48 GB refuses every profile, naming the numbers; 80 GB offloads where only the offloaded estimate fits.
- `make train DRY_RUN=1` prints the estimate term by term for every working profile; GPU_MEMORY_GB=48 refuses.
- The fake node's nvidia-smi memory.total (MiB) and /proc/meminfo (kB) are read and converted to decimal GB, so
  140 GB and 48 GB nodes, and a host too small for the offloaded states, are covered; `make up` refuses before
  Compose starts anything.
"""

import copy
import json

import pytest

import fake_node
from polarstack.cli.main import main
from polarstack.errors import ExitCode, StackError
from polarstack.paths import load_defaults
from polarstack.stack import profiles
from polarstack.stack.cluster import load as load_cluster
from polarstack.train import memory, preflight
from polarstack.train.plan import build_plan

pytestmark = pytest.mark.unit
P7 = 7_615_616_512  # slime's qwen2.5-7B.sh, computed (README)
P3 = 3_085_938_688  # slime's qwen2.5-3B.sh, computed (README)
WORKING = [n for n in profiles.available() if profiles.load(n).expect == "pass"]


@pytest.fixture(autouse=True)
def no_node(tmp_path, monkeypatch):
    monkeypatch.setenv("POLARSTACK_RUN_DIR", str(tmp_path / "run"))
    for knob in ("GPU_MEMORY_GB", "HOST_MEMORY_GB", "MODEL_DIR"):
        monkeypatch.delenv(knob, raising=False)


def cap(gpu: float, host: float | None = None) -> memory.Capacity:
    return memory.Capacity(gpu, host, "test")


def terms(plan: memory.MemoryPlan) -> dict[str, float]:
    return {t.name.split(":")[0].split(",")[0]: t.gb for t in plan.trainer}


def est(config, name="engine-direct", tp=1, offload=False, gpu=140.0):
    return memory.estimate(config, profiles.load(name), tp, offload=offload, capacity=cap(gpu), mem_fraction=0.8)


def test_static_memory_follows_tp_and_dp():
    config = load_defaults()
    direct = terms(est(config))  # TP 1, DP 3
    router = terms(est(config, "patched-router", tp=2))  # TP 2, DP 1
    router_tp1 = terms(est(config, "patched-router", tp=1))  # TP 1, DP 2
    assert direct["actor weights"] == pytest.approx(2 * P7 / 1e9)
    assert direct["gradients"] == pytest.approx(4 * P7 / 1e9)
    assert direct["optimizer states (fp32 master"] == pytest.approx(12 * P7 / 3 / 1e9)
    assert router["actor weights"] == pytest.approx(2 * P7 / 2 / 1e9)
    assert router["optimizer states (fp32 master"] == pytest.approx(12 * P7 / 2 / 1e9)
    assert router_tp1["optimizer states (fp32 master"] == pytest.approx(12 * P7 / 2 / 1e9)
    assert router_tp1["gradients"] == pytest.approx(4 * P7 / 1e9)
    # the figures: (2 + 4 + 12/DP) x P / TP ~ 76 GB at TP 1 / DP 3 and ~ 69 GB at TP 2 / DP 1
    static = lambda t: t["actor weights"] + t["gradients"] + t["optimizer states (fp32 master"]  # noqa: E731
    assert round(static(direct)) == 76 and round(static(router)) == 69


def test_logits_and_checkpoints_follow_max_tokens_per_gpu_and_tp():
    small = terms(est(load_defaults(["grpo.max_tokens_per_gpu=16384"])))
    full = terms(est(load_defaults()))
    tp2 = terms(est(load_defaults(), "patched-router", tp=2))
    assert full["logits"] == pytest.approx(32768 * 152064 * 4 / 1e9) == pytest.approx(2 * small["logits"])
    assert full["softmax kept for backward"] == full["logits"] and tp2["logits"] == pytest.approx(full["logits"] / 2)
    assert full["recompute checkpoints"] == pytest.approx(28 * 32768 * 3584 * 2 / 1e9)
    assert tp2["recompute checkpoints"] == pytest.approx(full["recompute checkpoints"] / 2)  # sequence parallel


def test_the_rehearsal_model_has_its_own_shape():
    config = preflight.train_config(preflight.preflight_config())
    small = terms(est(config))
    assert small["actor weights"] == pytest.approx(2 * P3 / 1e9)  # tied embeddings counted once
    assert small["logits"] == pytest.approx(32768 * 151936 * 4 / 1e9)
    assert small["recompute checkpoints"] == pytest.approx(36 * 32768 * 2048 * 2 / 1e9)
    assert est(config).trainer_gb < est(load_defaults()).trainer_gb


def test_offload_moves_the_optimizer_states_to_the_host():
    config = load_defaults()
    plain, off = est(config), est(config, offload=True)
    assert plain.trainer_gb - off.trainer_gb > 12 * P7 / 3 / 1e9  # the states and their share of the allowance
    host = {t.name.split(":")[0]: t.gb for t in off.host}
    assert host["offloaded optimizer states"] == pytest.approx(12 * P7 / 1e9)
    # slime's pinned backups of the actor and reference weights: every rank's shard, bf16, two tags
    assert host["weight backups (actor and reference), pinned, bf16"] == pytest.approx(2 * 2 * P7 * 3 / 1e9)
    assert "offloaded optimizer states" not in {t.name.split(":")[0] for t in plain.host}


def test_engine_direct_offloads_on_140_gb_and_the_router_profiles_do_not():
    config = load_defaults()
    direct = memory.decide(config, profiles.load("engine-direct"), 1, cap(140.0))
    assert direct.offload and direct.trainer_gb <= 140 and "slime's offload flags added" in direct.decision
    assert memory.train_args(direct, config)[:3] == memory.OFFLOAD_ARGS
    for name in ("patched-router", "router-passthrough"):
        plan = memory.decide(config, profiles.load(name), 2, cap(140.0))
        assert not plan.offload and plan.trainer_gb <= 140
        assert memory.train_args(plan, config) == ["--log-probs-chunk-size", "1024"]


def test_48_gb_cards_refuse_and_80_gb_offload_only_where_that_fits():
    config = load_defaults()
    for name, tp in (("engine-direct", 1), ("patched-router", 2)):
        with pytest.raises(StackError) as exc:
            memory.decide(config, profiles.load(name), tp, cap(48.0))
        assert exc.value.code == ExitCode.ENVIRONMENT and "48.0 GB" in exc.value.message
    with pytest.raises(StackError):  # 117.7 GB offloaded does not fit 80
        memory.decide(config, profiles.load("engine-direct"), 1, cap(80.0))
    router = memory.decide(config, profiles.load("patched-router"), 2, cap(80.0))
    assert router.offload and router.trainer_gb <= 80


def test_a_host_too_small_for_the_offloaded_states_refuses():
    with pytest.raises(StackError) as exc:
        memory.decide(load_defaults(), profiles.load("engine-direct"), 1, cap(140.0, host=128.0))
    assert "the host needs" in exc.value.message and "128.0 GB" in exc.value.message


def test_the_engine_kv_pool_must_hold_one_trace():
    plan = est(load_defaults())
    assert plan.kv_tokens == int((0.8 * 140 - 2 * P7 / 1e9) * 1e9 // (4 * 256 * 28 * 2))
    tiny = memory.estimate(
        load_defaults(), profiles.load("engine-direct"), 1, offload=True, capacity=cap(18.0), mem_fraction=0.8
    )
    assert any("weights (15.2 GB) do not fit" in p for p in tiny.problems())  # 0.8 x 18 GB
    short = memory.estimate(
        load_defaults(), profiles.load("engine-direct"), 1, offload=True, capacity=cap(20.0), mem_fraction=0.8
    )
    assert any("fewer than one 32,768-token trace" in p for p in short.problems())


@pytest.mark.parametrize("name", WORKING)
def test_the_dry_run_prints_every_term_for_every_working_profile(name, capsys):
    assert main(["train", "--task", "humaneval", "--profile", name, "--dry-run"]) == 0
    out = capsys.readouterr().out
    for needle in ("memory per trainer GPU", "memory per engine GPU", "memory per host", "logits, fp32", "[slime/"):
        assert needle in out, needle
    assert "--log-probs-chunk-size 1024" in out
    data = json.loads(
        (main(["train", "--task", "humaneval", "--profile", name, "--dry-run", "--json"]), capsys.readouterr().out)[1]
    )["memory"]
    assert data["trainer_gpu"]["total_gb"] <= 140 and data["capacity"]["gpu_gb"] == 140


def test_gpu_memory_gb_48_refuses_the_dry_run(monkeypatch, capsys):
    monkeypatch.setenv("GPU_MEMORY_GB", "48")
    assert main(["train", "--task", "humaneval", "--dry-run"]) == ExitCode.ENVIRONMENT
    err = capsys.readouterr().err
    assert "does not fit this node's memory" in err and "48.0 GB" in err and "Traceback" not in err


def test_the_fake_node_reports_its_cards(tmp_path, monkeypatch):
    fake_node.install(tmp_path, monkeypatch)
    profile = profiles.load("engine-direct")
    fake_node.set_memory(tmp_path, monkeypatch, gpu_gb=140, host_gb=512)
    seen = memory.node_capacity(profile)
    assert seen.gpu_gb == pytest.approx(140, abs=0.01) and seen.host_gb == pytest.approx(512, abs=0.01)
    assert "nvidia-smi memory.total" in seen.source
    assert build_plan("humaneval", profile, run_id="t", cluster=load_cluster()).memory.offload
    fake_node.set_memory(tmp_path, monkeypatch, gpu_gb=48)
    with pytest.raises(StackError, match="48.0 GB"):
        build_plan("humaneval", profile, run_id="t", cluster=load_cluster())


def test_make_up_refuses_a_node_too_small_before_compose_starts(tmp_path, monkeypatch, capsys):
    log = fake_node.install(tmp_path, monkeypatch)
    monkeypatch.setenv("FAKE_VOLUME", "1")
    monkeypatch.setenv("FAKE_IMAGES", fake_node.IMAGES)
    fake_node.set_memory(tmp_path, monkeypatch, gpu_gb=48)
    assert main(["compose", "up", "--profile", "patched-router"]) == ExitCode.ENVIRONMENT
    assert "48.0 GB" in capsys.readouterr().err
    assert not any(" up --detach" in ln for ln in log.read_text().splitlines())
    fake_node.set_memory(tmp_path, monkeypatch, gpu_gb=140)
    assert main(["compose", "up", "--profile", "patched-router"]) == 0
    assert "memory per trainer GPU" in capsys.readouterr().err


def test_bad_memory_settings_are_usage_errors(monkeypatch):
    with pytest.raises(StackError) as exc:
        memory.decide(load_defaults(["memory.optimizer_offload=maybe"]), profiles.load("engine-direct"), 1, cap(140))
    assert exc.value.code == ExitCode.USAGE
    monkeypatch.setenv("GPU_MEMORY_GB", "lots")
    with pytest.raises(StackError) as exc:
        memory.node_capacity(profiles.load("engine-direct"))
    assert exc.value.code == ExitCode.USAGE and "GPU_MEMORY_GB" in exc.value.message


# --- verify-offline: the recorded upstream lines and the recomputed estimate (polarstack.offline.memory_facts) ---


def test_verify_offline_recomputes_the_estimate_from_the_recorded_facts():
    from polarstack.offline import memory_facts

    result = memory_facts.check(load_cluster())
    assert result.ok, result.problems
    assert "engine-direct: 117.7 GB per trainer GPU (offload on)" in result.detail
    for tp, dp, offload in ((1, 3, True), (1, 3, False), (2, 1, False)):
        profile = "engine-direct" if dp == 3 else "patched-router"
        mem = est(load_defaults(), profile, tp=tp, offload=offload)
        assert memory_facts.recomputed_trainer_gb(load_defaults(), tp, dp, offload) == pytest.approx(mem.trainer_gb)


@pytest.mark.parametrize(
    "key, text, needle",
    [
        ("distributed_optimizer", "args.use_distributed_optimizer = False", "sharded by DP"),
        ("gradient_reuses_softmax", "grad_input = log_prob_softmax.clone().neg_()", "built in the softmax's buffer"),
        ("logits_fp32", "logits = logits", "Megatron's get_model"),
        ("mem_fraction_static", "The argument mem_fraction_static is the KV cache pool only", "reserved share"),
    ],
)
def test_a_recorded_line_that_no_longer_says_it_is_a_finding(key, text, needle):
    import copy

    from polarstack.offline import memory_facts

    data = copy.deepcopy(memory.record())
    side = "sglang" if key in data["sglang"] else "slime"
    data[side][key]["found"] = [{"line": 1, "text": text}]
    assert any(needle in p for p in memory_facts.fact_problems(data))
    assert not memory_facts.fact_problems(memory.record())


def test_the_actors_fp32_logits_are_not_cited_from_the_critics_value_head():
    """Issue 32 point 9: memory-facts.json cited `logits = logits.float()` in model_provider.py, the critic's value head
    (LinearForLastLayer, built only for role == "critic"); the actor's fp32 logits come from Megatron's get_model
    (slime's model.py), and slime's own log-prob kernel computes in fp32. The old fact is refused, by name."""
    import copy

    from polarstack.offline import memory_facts

    data = memory.record()
    fact = data["slime"]["logits_fp32"]
    assert fact["file"] == "slime/backends/megatron_utils/model.py"
    assert {f["in"] for f in fact["found"]} == {"", "setup_model_and_optimizer"}
    assert "vocab_parallel_logits.float()" in data["slime"]["log_prob_kernel_fp32"]["found"][0]["text"]
    old = copy.deepcopy(data)  # f6ba232's record of it
    old["slime"]["logits_fp32"] = {
        "file": "slime/backends/megatron_utils/model_provider.py",
        "found": [{"line": 54, "text": "logits = logits.float()", "in": "LinearForLastLayer"}],
    }
    problems = memory_facts.fact_problems(old)
    assert any("critic's value head" in p for p in problems), problems
    assert any("logits_fp32: recorded in LinearForLastLayer, not in setup_model_and_optimizer" in p for p in problems)
    assert memory.source("logits_fp32") == "slime/backends/megatron_utils/model.py:24,294"


def test_the_chunk_size_reaches_the_training_pass_and_bounds_no_saved_softmax():
    """Issue 32 point 9: --log-probs-chunk-size was said to bound only the passes without gradients; slime's policy
    loss computes its log-probs through get_log_probs_and_entropy, which passes the chunk size on, and every chunk
    saves its own softmax for backward. A record where the training pass does not reach it is a finding."""
    import copy

    from polarstack.offline import memory_facts

    data = memory.record()
    calls = {f["in"] for f in data["slime"]["training_pass_calls_log_probs"]["found"]}
    assert "policy_loss_function" in calls
    assert data["slime"]["log_probs_chunk_size_in_loss"]["found"][0]["in"] == "get_log_probs_and_entropy"
    assert data["slime"]["chunk_saves_softmax"]["found"][0]["in"] == "_calculate_log_probs_and_entropy_chunk"
    assert not memory_facts.fact_problems(data)
    for key, function in (
        ("training_pass_calls_log_probs", "policy_loss_function"),
        ("log_probs_chunk_size_in_loss", "get_log_probs_and_entropy"),
    ):
        broken = copy.deepcopy(data)
        broken["slime"][key]["found"] = [f for f in broken["slime"][key]["found"] if f["in"] != function]
        assert any(f"{key}: recorded in" in p and function in p for p in memory_facts.fact_problems(broken))
    # the words the stack explains it with say the same (the docs, the config comment, the plan's docstring)
    from polarstack.pins import repo_root

    root = repo_root()
    for path in ("docs/gpu-node.md", "configs/train/defaults.yaml", "scripts/polarstack/train/memory.py"):
        text = " ".join((root / path).read_text().split())
        assert "without gradients only" not in text and "passes without gradients (reference" not in text, path
        assert "training pass" in text, path


def test_the_chunk_size_is_one_slimes_scripts_use():
    import copy

    from polarstack.offline import memory_facts

    data = copy.deepcopy(memory.record())
    data["slime"]["log_probs_chunk_size_used"]["found"] = [{"file": "x", "line": 1, "value": 4096}]
    assert any("log_probs_chunk_size=1024" in p for p in memory_facts.fact_problems(data))
    data = copy.deepcopy(memory.record())
    data["slime"]["offload_flags"]["found"] = data["slime"]["offload_flags"]["found"][:2]
    assert any("offload flags" in p for p in memory_facts.fact_problems(data))


def test_the_docs_table_shows_the_computed_totals():
    from polarstack.pins import repo_root

    text = (repo_root() / "docs" / "gpu-node.md").read_text()
    section = text[text.index("## Memory") : text.index("### Checkpoints on disk")]
    config = load_defaults()
    small = preflight.train_config(preflight.preflight_config())
    totals = [
        est(config).trainer_gb,
        est(config, offload=True).trainer_gb,
        est(config, "patched-router", tp=2).trainer_gb,
        est(small).trainer_gb,
    ]
    row = next(line for line in section.splitlines() if line.startswith("| **total"))
    assert [f"{t:.1f}" for t in totals] == [c.split(":")[0].strip("* ") for c in row.split("|")[2:6]]
    assert "computed" in section and "not measured" in section.replace("none is measured", "not measured")


def test_the_rehearsal_uses_the_real_runs_offload():
    """slime's offload flags change how the optimizer steps and saves, so the rehearsal (which fits without them on
    140 GB) runs them wherever the real run needs them: engine-direct, not the router profiles."""
    direct = preflight.build(profiles.load("engine-direct"), run_id="r", cluster=load_cluster())
    for _, phase in direct.phases:
        assert phase.memory.offload and all(flag in phase.train_args for flag in memory.OFFLOAD_ARGS)
    assert "memory.optimizer_offload=on" in direct.phases[0][1].memory.decision
    router = preflight.build(profiles.load("patched-router"), run_id="r", cluster=load_cluster())
    assert not router.phases[0][1].memory.offload
    assert not set(memory.OFFLOAD_ARGS) & set(router.phases[0][1].train_args)


def test_the_host_is_checked_against_memavailable_not_memtotal(tmp_path, monkeypatch):
    """Issue 32 point 8: a 512 GB host with 200 GB available cannot hold engine-direct's pinned backups and offloaded
    optimizer (about 253 GB); MemTotal would say it fits."""
    fake_node.install(tmp_path, monkeypatch)
    profile = profiles.load("engine-direct")
    fake_node.set_memory(tmp_path, monkeypatch, gpu_gb=140, host_gb=200, host_total_gb=512)
    seen = memory.node_capacity(profile)
    assert seen.host_gb == pytest.approx(200, abs=0.01) and "MemAvailable" in seen.source
    with pytest.raises(StackError, match="GB available") as info:
        build_plan("humaneval", profile, run_id="t", cluster=load_cluster())
    assert info.value.code == ExitCode.ENVIRONMENT
    fake_node.set_memory(tmp_path, monkeypatch, gpu_gb=140, host_gb=512, host_total_gb=512)
    assert build_plan("humaneval", profile, run_id="t", cluster=load_cluster()).memory.offload


def test_rays_object_store_is_set_by_the_stack_and_counted(monkeypatch):
    """Issue 32 point 8: RAY_OBJECT_STORE_GB reaches every `ray start` the stack renders and the host estimate."""
    from polarstack.offline import host_memory
    from polarstack.stack import cluster as cluster_mod
    from polarstack.stack import compose, ray_head

    monkeypatch.setenv("RAY_OBJECT_STORE_GB", "12.5")
    profile = profiles.load("engine-direct")
    capacity = memory.Capacity(140.0, None, "test")
    plan = build_plan("humaneval", profile, run_id="t", capacity=capacity, cluster=load_cluster())
    term = next(t for t in plan.memory.host if "--object-store-memory" in t.name)
    assert term.gb == 12.5
    assert "--object-store-memory=12500000000" in plan.commands[0]
    assert "--object-store-memory=12500000000" in plan.files["launch.sh"]
    assert compose.render_values(profile, cluster_mod.load(), cpu=False)["RAY_OBJECT_STORE_BYTES"] == "12500000000"
    values = profiles.stack_knobs()
    assert host_memory.check(plan.commands[0], plan.memory, values).ok
    unset = [a for a in plan.commands[0] if not a.startswith("--object-store-memory")]
    assert not host_memory.check(unset, plan.memory, values).ok  # a ray start that lets ray choose
    uncounted = copy.deepcopy(plan.memory)
    uncounted.host = [t for t in uncounted.host if t is not term and "--object-store-memory" not in t.name]
    assert host_memory.counted_problems(uncounted, values)
    monkeypatch.setenv("RAY_OBJECT_STORE_GB", "lots")
    with pytest.raises(StackError, match="RAY_OBJECT_STORE_GB") as info:
        ray_head.object_store_gb()
    assert info.value.code == ExitCode.USAGE


# --- issue 34 point 2: a stated margin beyond every term, allowances from stated figures ---------------------------


def test_a_plan_that_fits_by_20_mb_is_offloaded_not_launched():
    """Before issue 34 a 140 GiB card (nvidia-smi 143,360 MiB = 150.32 GB) took engine-direct without offload, 0.06 GB
    to spare; now any card that leaves less than the margin gets slime's offload flags (memory.optimizer_offload auto)."""
    config = load_defaults()
    plain = est(config)
    card = plain.trainer_gb + 0.02
    plan = memory.decide(config, profiles.load("engine-direct"), 1, cap(card))
    assert plan.offload and "margin" in plan.decision
    assert card - plan.trainer_gb >= plan.margin_gb == pytest.approx(0.05 * card)


def test_a_plan_under_the_margin_is_refused_when_offload_cannot_help():
    config = load_defaults()
    config["memory"]["optimizer_offload"] = "off"
    card = est(config).trainer_gb + 0.02
    with pytest.raises(StackError) as exc:
        memory.decide(config, profiles.load("engine-direct"), 1, cap(card))
    assert exc.value.code == ExitCode.ENVIRONMENT
    assert "leaving 0.02 GB, less than the" in exc.value.message and "memory.min_headroom_share" in exc.value.message


def test_the_shipped_plans_keep_the_margin_on_140_gb_cards():
    config = load_defaults()
    for name, tp in (("engine-direct", 1), ("patched-router", 2), ("router-passthrough", 2)):
        plan = memory.decide(config, profiles.load(name), tp, cap(140.0))
        assert 140.0 - plan.trainer_gb >= plan.margin_gb == pytest.approx(7.0), name


def test_the_nccl_allowance_comes_from_ncclss_recorded_buffer_sizes():
    nccl = memory.record()["nccl"]
    assert nccl["bytes_per_connection"] == {"simple": 4194304, "ll": 524288, "ll128": 4915200, "total": 9633792}
    term = next(t for t in est(load_defaults()).trainer if t.name.startswith("allowance: NCCL"))
    assert term.gb == pytest.approx(4 * nccl["max_channels"] * 2 * 9633792 / 1e9)
    assert "src/init.cc" in term.source and "MAXCHANNELS" in term.name


def test_the_dry_run_prints_the_headroom_and_the_margin(capsys):
    assert main(["train", "--task", "humaneval", "--dry-run", "--json"]) == 0
    trainer = json.loads(capsys.readouterr().out)["memory"]["trainer_gpu"]
    assert trainer["headroom_gb"] == pytest.approx(140.0 - trainer["total_gb"], abs=0.01)
    assert trainer["margin_gb"] == pytest.approx(7.0)


@pytest.mark.parametrize("value", [1, 1.5, -0.1, "x"])
def test_a_bad_margin_is_a_usage_error(value):
    config = load_defaults()
    config["memory"]["min_headroom_share"] = value
    with pytest.raises(StackError) as exc:
        memory.decide(config, profiles.load("engine-direct"), 1, cap(140.0))
    assert exc.value.code == ExitCode.USAGE and "min_headroom_share" in exc.value.message


def test_verify_offline_rereads_the_nccl_lines_the_allowance_rests_on():
    from polarstack.offline import memory_facts

    assert memory_facts.nccl_problems() == []
    assert memory_facts.nccl_bytes() == 64 * 2 * 9633792
    data = copy.deepcopy(memory.record())
    data["nccl"]["facts"]["DEFAULT_BUFFSIZE"]["found"][0]["text"] = "#define DEFAULT_BUFFSIZE (1 << 23) /* 8MiB */"
    assert any("DEFAULT_BUFFSIZE" in p for p in memory_facts.nccl_problems(data))
    data = copy.deepcopy(memory.record())
    data["nccl"]["facts"]["MAXCHANNELS"]["found"][0]["text"] = "#define MAXCHANNELS 128"
    assert any("the #define lines give" in p for p in memory_facts.nccl_problems(data))
    data = copy.deepcopy(memory.record())
    data["cuda_context"]["measured_mb"] = 2500
    assert any("cuda_context_gb is below" in p for p in memory_facts.nccl_problems(data))
