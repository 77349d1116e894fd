"""Pins issue 32, point 2 (docker tier): inside the CPU trainer container, run by Compose with the trainer service's
own security options, devices and environment (`docker compose run --no-deps trainer`: root without CAP_SYS_ADMIN,
seccomp and AppArmor lifted, Docker's read-only /proc/sys kept), the namespace shape apptainer gives Polar's sessions there (a user
namespace mapping uid 0 alone, reproduced with `unshare --user --map-root-user --mount --fork`,
configs/upstream/apptainer-userns.json) gets real verdicts: the task template's test_command passes HumanEval/0's
canonical answer and fails a wrong and a forged one, the package API of the trainer's own polarstack does the same
with isolation on, and the adversarial programs, the probes and the capability sets read from outside are what
tests/sandbox/test_verifier_one_uid.py requires on the host (its test functions are called on these results).
And, since the sessions' uid 0 is the node's root and apptainer binds the trainer's /proc into them (no PID
namespace, configs/upstream/apptainer-userns.json): root in that shape gets a read-only file system (or EACCES)
writing /proc/sys/kernel/core_pattern's own value back (with systempaths=unconfined, the compose.yaml before the
node-path review, the write went through: code run as the node's root)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from docker_env import TIER_PORTS, cpu_environment

from polarstack.cli.main import main
from polarstack.reward import tasks
from polarstack.reward.verifier import bundle
from polarstack.stack import cluster as cluster_mod
from polarstack.stack import compose, profiles, ray_auth

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "sandbox"))
import test_verifier_one_uid as one_uid  # noqa: E402

pytestmark = [pytest.mark.docker, pytest.mark.timeout(2400)]
PROJECT = "polarstack-tier-shape"
PROFILE = "engine-direct"
CAP_SYS_ADMIN = 21

# Run by the trainer's python3 inside the container: lays out eval/ and workspace/ as Polar's session does, runs the
# test_command and the package API driver in the reproduced shape, reports everything as one JSON line.
INSIDE = r"""
import json, os, subprocess, sys, tempfile
spec = json.loads(sys.stdin.read())
root = tempfile.mkdtemp(prefix="polarstack-shape-")
evaldir, workdir = os.path.join(root, "eval"), os.path.join(root, "workspace")
os.makedirs(evaldir)
os.makedirs(workdir)
open(os.path.join(evaldir, "verifier.py"), "w").write(spec["bundle"])
open(os.path.join(evaldir, "problem.json"), "w").write(json.dumps(spec["problem"]))
status = dict(line.split(":", 1) for line in open("/proc/self/status").read().splitlines())
result = {"euid": os.geteuid(), "cap_eff": status["CapEff"].strip(), "uid_map": open("/proc/self/uid_map").read().split()}
command = spec["command"].replace(spec["evaldir"], evaldir).replace(spec["workdir"], workdir)
env = {"PATH": "/usr/local/bin:/usr/bin:/bin"}
for name, source in spec["solutions"].items():
    open(os.path.join(workdir, "solution.py"), "w").write(source)
    proc = subprocess.run(spec["shape"] + ["/bin/sh", "-c", command], env=env, capture_output=True, text=True)
    result["cli_" + name] = [proc.returncode, proc.stdout, proc.stderr[-2000:]]
proc = subprocess.run(spec["shape"] + ["python3", "-I", "-c", spec["driver"], json.dumps(spec["api"])],
                      env=dict(env, HOME=root), capture_output=True, text=True, cwd=root)
result["api"] = [proc.returncode, proc.stdout, proc.stderr[-3000:]]
proc = subprocess.run(spec["shape"] + ["python3", "-I", "-c", spec["core_pattern"]], env=env, capture_output=True,
                      text=True)
result["core_pattern"] = [proc.returncode, proc.stdout.strip(), proc.stderr[-2000:]]
print(json.dumps(result))
"""


# Writes /proc/sys/kernel/core_pattern's current value back (harmless if it succeeds), prints the errno's name, or
# `written`, and the uid map it ran under.
CORE_PATTERN = r"""
import errno, os
path = "/proc/sys/kernel/core_pattern"
value = open(path).read()
try:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)
    outcome = "written"
except OSError as exc:
    outcome = errno.errorcode.get(exc.errno, str(exc.errno))
print(outcome, "|", " ".join(open("/proc/self/uid_map").read().split()))
"""


@pytest.fixture(scope="module")
def inside(docker_engine):
    """The CPU trainer image built, then one `docker compose run` of the trainer service doing every case."""
    with pytest.MonkeyPatch.context() as mp:
        cpu_environment(mp, PROJECT, TIER_PORTS)
        assert main(["compose", "build", "--profile", PROFILE, "--service", "trainer"]) == 0, "the CPU trainer build"
        profile = profiles.load(PROFILE)
        ray_auth.prepare(compose.token_file(), head=cluster_mod.load().head)  # the trainer mounts the token file
        problem = next(p for p in tasks.load_humaneval() if p["task_id"] == "HumanEval/0")
        spec = {
            "bundle": bundle.source(),
            "problem": tasks.verifier_problem_of("humaneval", problem),
            "command": tasks.task_template("humaneval")["evaluator"]["config"]["test_command"],
            "evaldir": tasks.EVALDIR,
            "workdir": tasks.WORKDIR,
            "solutions": one_uid.cli_solutions(problem),
            "shape": one_uid.SHAPE,
            "driver": one_uid.DRIVER,
            "api": one_uid.api_spec(),
            "core_pattern": CORE_PATTERN,
        }
        run = ["run", "--rm", "--no-deps", "-T", "--entrypoint", "python3", "trainer", "-I", "-c", INSIDE]
        proc = subprocess.run(
            [*compose.compose_command(), *compose.compose_args(profile, cluster=cluster_mod.load(), cpu=True), *run],
            input=json.dumps(spec),
            capture_output=True,
            text=True,
            timeout=1200,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        result = json.loads(proc.stdout.strip().splitlines()[-1])
        code, stdout, stderr = result["api"]
        assert code == 0, stderr
        result["api"] = json.loads(stdout)
        return result


def _cli(inside: dict) -> dict:
    return {
        name[4:]: SimpleNamespace(returncode=value[0], stdout=value[1], stderr=value[2])
        for name, value in inside.items()
        if name.startswith("cli_")
    }


def test_the_trainer_is_root_without_cap_sys_admin(inside):
    assert inside["euid"] == 0 and not int(inside["cap_eff"], 16) & (1 << CAP_SYS_ADMIN), inside["cap_eff"]
    assert inside["uid_map"] == ["0", "0", "4294967295"], inside["uid_map"]  # the container's own, before unshare


def test_the_test_command_gives_real_verdicts_in_the_trainer(inside):
    runs = _cli(inside)
    one_uid.test_the_bundled_verifier_passes_the_canonical_answer_in_the_nodes_shape(runs)
    for name in ("wrong", "forged"):
        one_uid.test_the_bundled_verifier_fails_a_wrong_or_forging_answer_in_the_nodes_shape(runs, name)


def test_the_api_gives_real_verdicts_and_nothing_to_the_hacks_in_the_trainer(inside):
    api = inside["api"]
    one_uid.test_the_api_ran_in_the_shape_with_isolation_on(api)
    one_uid.test_the_api_passes_the_canonical_answer_and_fails_a_wrong_one(api)
    for name in sorted(one_uid.WRONG_BUT_EXITS_ZERO) + ["thread_answers", "fork_answers"]:
        one_uid.test_reward_hacks_earn_nothing_in_the_shape(api, name)
    one_uid.test_a_fork_bomb_ends_at_its_first_fork(api)
    one_uid.test_nothing_one_run_writes_reaches_the_next(api)


def test_the_candidate_holds_nothing_in_the_trainer(inside):
    api = inside["api"]
    one_uid.test_the_candidate_holds_no_capability_read_from_outside(api)
    probes = one_uid.probes_of(api)
    one_uid.test_the_candidate_is_uid_0_without_capabilities_or_proc(probes)
    one_uid.test_no_process_thread_or_namespace_can_be_made(probes)
    one_uid.test_shared_inodes_and_kernel_settings_are_out_of_reach(probes)


def test_root_in_the_sessions_shape_cannot_write_the_nodes_sysctls(inside):
    """The sessions' uid 0 is the node's root with the trainer's /proc: /proc/sys stays read-only there."""
    code, out, err = inside["core_pattern"]
    assert code == 0, err
    outcome, uid_map = (part.strip() for part in out.split("|"))
    assert uid_map == "0 0 1", out  # the shape apptainer gives the sessions (apptainer-userns.json uid_map_for_root)
    assert outcome in ("EROFS", "EACCES"), out
