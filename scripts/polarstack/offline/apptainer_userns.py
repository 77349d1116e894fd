"""The user namespace of Polar's sessions, as recorded from apptainer's source (configs/upstream/apptainer-userns.json,
issue 32), checked for what it means to this stack: the record is of APPTAINER_RELEASE; the verifier's host detection
classes the recorded uid map (`0 0 1`) as its one-uid shape (and a full map as not), so it isolates there with the
candidate as that uid 0; and nothing the stack ships or renders turns on what would change the shape (apptainer's
fakeroot, APPTAINER_FAKEROOT or SINGULARITY_FAKEROOT, or Polar's PID namespace, POLAR_APPTAINER_ISOLATE_PID), so the
reproduction the sandbox tests run (`unshare --user --map-root-user --mount --fork`) is the shape the node gives.
And what the shape means for the trainer's Docker grant (procfs_problems): the sessions' uid 0 is the node's global
root and, with no PID namespace, apptainer binds the trainer's /proc into them (container.addKernelMount), so the
trainer must keep Docker's read-only /proc/sys: never systempaths=unconfined (kernel.core_pattern would be writable
from a session, code run as the node's root). And what the sessions share with the trainer besides (dev_problems):
the trainer image sets apptainer's staged /dev (`mount dev = minimal`), so no session opens the trainer's GPUs,
/dev/fuse or the host's /dev/shm."""

from __future__ import annotations

import json
from typing import Any

from polarstack.checks.sandbox_probe import polar_exec_args
from polarstack.errors import StackError
from polarstack.offline.check import Check
from polarstack.paths import load_defaults
from polarstack.pins import pins, repo_root
from polarstack.reward.tasks import TASKS
from polarstack.reward.verifier import host
from polarstack.stack import assets, profiles
from polarstack.stack.cluster import Cluster
from polarstack.train.plan import build_plan

RECORD = "configs/upstream/apptainer-userns.json"
# What the stack ships that sets the environment or the command line of Polar's servers and sessions.
SHIPPED = ("compose/compose.yaml", "compose/compose.cpu.yaml", "images/trainer/Dockerfile")
FULL_MAP = "0 0 4294967295"


def _rendered_texts(profile: profiles.Profile, cluster: Cluster) -> dict[str, str]:
    """Every file and command line the training plan (on `cluster`) renders for each task (launch.sh, the Ray job's
    runtime env, Polar's config with its task template), plus the sandbox probe's `apptainer exec` line (Polar's own
    flags)."""
    texts: dict[str, str] = {}
    for task in TASKS:
        plan = build_plan(task, profile, run_id="verify", config=load_defaults(), cluster=cluster)
        texts.update({f"{task}: {name}": text for name, text in plan.files.items()})
        texts[f"{task}: commands"] = json.dumps(plan.commands)
        texts[f"{task}: Polar's apptainer exec"] = json.dumps(polar_exec_args("/s", "/c", "true", task))
    return texts


def problems(
    record: dict[str, Any] | None = None, texts: dict[str, str] | None = None, *, cluster: Cluster
) -> list[str]:
    """`texts`: what to search for the switches (default: what the stack ships and every profile's plan rendered on
    `cluster`, the site's)."""
    record = record or json.loads((repo_root() / RECORD).read_text())
    found = []
    release = pins()["APPTAINER_RELEASE"]
    if record["apptainer_release"] != release:
        found.append(f"{RECORD} was read at apptainer {record['apptainer_release']}, not APPTAINER_RELEASE={release}")
    mapped = host.map_holds_sandbox_uids(record["uid_map_for_root"])
    if not host.one_uid_shape(euid=0, maps_sandbox_uids=mapped):
        found.append(
            f"the verifier does not class the recorded uid map {record['uid_map_for_root']!r} as its one-uid shape "
            "(host.one_uid_shape): it would refuse, or switch to a uid that does not exist, in Polar's sessions"
        )
    if host.one_uid_shape(euid=0, maps_sandbox_uids=host.map_holds_sandbox_uids(FULL_MAP)):
        found.append("the verifier classes a full uid map as the one-uid shape: it would never use its sandbox uids")
    if texts is None:
        texts = {path: (repo_root() / path).read_text() for path in SHIPPED}
        for name in profiles.available():
            try:
                rendered = _rendered_texts(profiles.load(name), cluster)
            except StackError:  # a profile that cannot be rendered is check_profile's failure, named there
                continue
            texts.update({f"profile {name}, {k}": v for k, v in rendered.items()})
    switches = [*record["fakeroot_env"], "--fakeroot", record["pid_namespace_env"]]
    for where, text in texts.items():
        for switch in switches:
            if switch in text:
                found.append(
                    f"{where} sets {switch}: Polar's sessions would not be the recorded one-uid shape the sandbox "
                    f"tests reproduce ({' '.join(record['reproduced_by'])}); record the new shape and test it"
                )
    return found


def maps_global_root(uid_map: str) -> bool:
    """Whether a uid_map line set maps uid 0 inside to uid 0 outside (the node's root, in the trainer's container,
    whose own map is the identity: Docker without userns-remap)."""
    for line in uid_map.strip().splitlines():
        inside, outside, count = (int(v) for v in line.split())
        if inside <= 0 < inside + count and outside - inside == 0:
            return True
    return False


def procfs_problems(
    security_opt: list[str], environment: dict[str, Any], record: dict[str, Any] | None = None
) -> list[str]:
    """The trainer's security_opt against the sessions' shape (verify-offline check_assets): lifting Docker's
    read-only /proc/sys (systempaths=unconfined) while the sessions' uid 0 is the global root and no PID namespace
    is asked gives every agent the node's sysctls, kernel.core_pattern among them."""
    record = record or json.loads((repo_root() / RECORD).read_text())
    fact = record["facts"].get("proc_bound_without_pid_namespace")
    lifted = record.get("proc_sys_lifted_by", "systempaths=unconfined")
    pid_asked = str(environment.get(record["pid_namespace_env"]) or "").strip().lower() in {"1", "true", "yes", "on"}
    if fact is None or not maps_global_root(record["uid_map_for_root"]) or pid_asked:
        if lifted in security_opt:  # a shape this check was not written for: refuse until it is recorded and read
            return [f"the trainer sets {lifted} and {RECORD} does not record how the sessions' /proc is made there"]
        return []
    if lifted not in security_opt:
        return []
    return [
        f"the trainer sets {lifted}, which makes /proc/sys writable in the container, while Polar's sessions run "
        f"as the node's root (uid map {record['uid_map_for_root']!r}) with the trainer's /proc bound in (no PID "
        f"namespace: {fact['file']}:{fact['line']}): an agent could write kernel.core_pattern, code run as the "
        f"node's root; drop it from compose.yaml's trainer ({RECORD})"
    ]


def session_environment(
    launcher_env: dict[str, Any], command_env: dict[str, Any], cleanenv: bool, record: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The environment apptainer gives a session (configs/upstream/apptainer-userns.json environment_without_cleanenv
    and environment_with_cleanenv), from the environment of the process that runs apptainer (`launcher_env`: Polar's
    server) and the `env K=V` of the command line (`command_env`), which is set last."""
    rule = (record or json.loads((repo_root() / RECORD).read_text()))["environment"]
    found: dict[str, Any] = dict(rule["cleanenv_sets"]) if cleanenv else {}
    for key, value in launcher_env.items():
        if key in rule["always_passed"] or not (
            cleanenv
            or key in rule["always_omitted"]
            or any(key.startswith(p) for p in [*rule["prefixes_not_forwarded"], *rule["override_prefixes"]])
        ):
            found[key] = value
    for key, value in launcher_env.items():  # APPTAINERENV_X=V sets X=V, with or without --cleanenv
        prefix = next((p for p in rule["override_prefixes"] if key.startswith(p)), None)
        if prefix and key[len(prefix) :] and key[len(prefix) :] not in rule["always_omitted"]:
            found[key[len(prefix) :]] = value
    return {**found, **command_env}


def secret_problems(
    secrets: list[str], launcher_env: dict[str, Any], command_env: dict[str, Any], where: str
) -> list[str]:
    """The pass-through secrets (`secrets`: the variables compose.yaml hands the trainer from the caller, never
    written) a session would get when Polar runs with `launcher_env` (its --cleanenv switch included)."""
    cleanenv = "--cleanenv" in assets.runtime_flags(launcher_env)
    reaching = sorted(set(secrets) & set(session_environment(launcher_env, command_env, cleanenv)))
    return [
        f"{name}, passed through to the trainer, reaches every agent session Polar starts from {where} (apptainer "
        f"without --cleanenv passes Polar's environment on: {RECORD} environment_without_cleanenv)"
        for name in reaching
    ]


def dev_problems(dockerfile: str | None = None, record: dict[str, Any] | None = None) -> list[str]:
    """The trainer image's apptainer.conf `mount dev` against the sessions (configs/upstream/apptainer-userns.json
    dev_bound_by_default, dev_minimal): with the default, apptainer binds the trainer's /dev, its GPUs, /dev/fuse and
    the host's /dev/shm, into every session; the image must set the staged /dev and check that it did."""
    record = record or json.loads((repo_root() / RECORD).read_text())
    dev = record["mount_dev"]
    text = dockerfile if dockerfile is not None else (repo_root() / "images/trainer/Dockerfile").read_text()
    line = f"{dev['directive']} = {dev['stack_sets']}"
    sets = f"s/^{dev['directive']} = .*/{line}/' {dev['conf']}" in text
    checks = f"grep -qx '{line}' {dev['conf']}" in text
    found = []
    if dev["stack_sets"] == dev["default"] or not (sets and checks):
        fact = record["facts"]["dev_bound_by_default"]
        found.append(
            f"images/trainer/Dockerfile does not set and check `{line}` in {dev['conf']}: apptainer then binds the "
            f"trainer's /dev into every agent session ({fact['file']}:{fact['line']}), its GPUs, /dev/fuse and the "
            "host's /dev/shm (NCCL's, the engines') open to the session's uid 0"
        )
    leaked = [d for d in dev["minimal_devices"] if d.startswith(("/dev/nvidia", "/dev/fuse", "/dev/shm"))]
    if leaked:
        found.append(f"{RECORD} lists {', '.join(leaked)} in apptainer's staged /dev: read addDevMount again")
    return found


def check(cluster: Cluster) -> Check:
    found = problems(cluster=cluster) + dev_problems()
    return Check(
        f"Polar's sessions run in the user namespace recorded in {RECORD}, and the verifier isolates there",
        not found,
        "uid map 0 0 1 -> one-uid shape; no fakeroot; no PID namespace (a fresh procfs cannot mount under Docker's "
        "masked /proc: the sessions share the trainer's PIDs, docs/gpu-node.md); staged /dev",
        found,
    )
