"""Polar's control-plane token in the rendered launch.sh, checked for what the recorded facts make of it
(configs/upstream/polar-facts.json control_plane, configs/upstream/apptainer-starter-env.json; review point 6):

- a server that checks the token refuses what the other sends it without one, so each server that holds it needs
  the sender of every route it checks to hold it too (the gateway's registration, heartbeats and results to the
  rollout server; the rollout server's dispatches to the gateway): both or neither;
- the gateway starts every session with its own environment: holding the token, it must run with Polar's --cleanenv
  switch on, and apptainer's processes beside a session must keep only the computed environment;
- it reaches Polar's two servers alone: never exported, never in the trainer's or the Ray job's environment (the job's
  is on `ray job submit`'s command line, which every session's /proc shows), never a literal, used on no other line;
- the driver needs none: the bridge sends it only on task submission, which the rollout server checks only for the
  harnesses recorded; the task template's harness must not be one of them.
"""

from __future__ import annotations

import json
import shlex
from typing import Any

from polarstack.paths import repo_root
from polarstack.pins import pins
from polarstack.train import control_plane

STARTER_RECORD = "configs/upstream/apptainer-starter-env.json"
SERVERS = {"rollout": "polar serve_rollout", "gateway": "polar serve_gateway"}


def _prefix_env(line: str, command: str) -> dict[str, str]:
    """The assignments before `command` on a launch.sh line (`K=V cmd ...`), as bash gives them to its environment."""
    head = line.split(command, 1)[0]
    return dict(word.split("=", 1) for word in shlex.split(head) if "=" in word)


def problems(
    script: str,
    trainer_env: dict[str, Any],
    job_env: dict[str, Any],
    harness: str,
    where: str,
    record: dict[str, Any] | None = None,
    starter: dict[str, Any] | None = None,
) -> list[str]:
    record = record or control_plane.record()
    starter = starter or json.loads((repo_root() / STARTER_RECORD).read_text())
    env, found = record["env"], []
    if record["commit"] != pins()["POLAR_COMMIT"]:
        found.append(f"{control_plane.RECORD} control_plane was read at Polar {record['commit']}, not POLAR_COMMIT")
    if starter["apptainer_release"] != pins()["APPTAINER_RELEASE"]:
        found.append(f"{STARTER_RECORD} was read at apptainer {starter['apptainer_release']}, not APPTAINER_RELEASE")
    lines = script.splitlines()
    exported = dict(
        line.removeprefix("export ").split("=", 1) for line in lines if line.startswith("export ") and "=" in line
    )
    server_lines = {name: next((line for line in lines if command in line), "") for name, command in SERVERS.items()}
    given = {name: _prefix_env(line, SERVERS[name]) for name, line in server_lines.items()}
    holders = {name for name, values in given.items() if env in values}
    for source, text in (("exported by launch.sh", exported), ("in the trainer's environment", trainer_env)):
        if env in text:
            found.append(
                f"{where}: {env} is {source}: every process of the trainer would hold it, not Polar's servers alone"
            )
    if env in job_env or env in json.dumps(job_env):
        found.append(
            f"{where}: {env} is in the Ray job's runtime env, which `ray job submit`'s command line carries and every "
            "session's /proc shows; the driver needs none"
        )
    # both or neither: a holder checks routes that only the other server sends
    senders = {name: set(fact["routes"]) for name, fact in record["sent_by"].items() if fact["to_server"] in SERVERS}
    for server in holders:
        for route in record["checked_by"][server]["routes"]:
            sender = next((name for name, routes in senders.items() if route in routes), None)
            if sender in SERVERS and sender not in holders:
                found.append(
                    f"{where}: launch.sh gives {env} to Polar's {server} server but not its {sender}: the {server} "
                    f"then refuses (401) the {sender}'s {route}, which it sends with the token only when it holds it"
                )
    # never a literal, used nowhere else
    reference = f"${control_plane.VARIABLE}"
    for server in holders:
        if given[server][env] != reference:
            found.append(f"{where}: the {server} server's {env} is not the attempt's random token ({reference})")
    for line in lines:
        if control_plane.VARIABLE in line and line != control_plane.MAKE and line not in server_lines.values():
            found.append(
                f"{where}: launch.sh uses the control-plane token on a line of its own ({line.strip()[:80]!r}): it "
                "reaches Polar's two servers alone, never printed or written"
            )
    if holders and control_plane.MAKE not in lines:
        found.append(f"{where}: launch.sh gives {env} without making it fresh ({control_plane.MAKE})")
    # the sessions: the gateway's environment must not reach them
    if "gateway" in holders:
        gateway_env = {**trainer_env, **{k: v.strip("'\"") for k, v in exported.items()}, **given["gateway"]}
        switch = record["sessions"]["cleanenv_env"]
        if not control_plane.cleanenv(gateway_env):
            found.append(
                f"{where}: the gateway holds {env} but runs without {switch}: apptainer passes its environment into "
                "every agent session (polar-facts.json control_plane.sessions), so every agent could read the token"
            )
        if starter["caller_environment_kept_by_apptainer"] or starter["engine_config_environment"] != "computed":
            found.append(
                f"{where}: {STARTER_RECORD} says an apptainer process beside each session keeps the gateway's "
                "environment, which a session's uid 0 reads in /proc/<pid>/environ: --cleanenv would not keep the "
                f"token out; give {env} to no Polar server"
            )
    # the driver needs none
    required = record["checked_by"]["rollout"].get("routes_for_harness", {})
    bridge = set(record["sent_by"]["bridge"]["routes"])
    for route, harnesses in required.items():
        if route in bridge and harness in harnesses:
            found.append(
                f"{where}: harness {harness!r} makes the rollout server require {env} on the driver's {route}; the "
                "stack gives the driver no token (its runtime env is on `ray job submit`'s command line)"
            )
    return found


def check_plan(plan, trainer_env: dict[str, Any], where: str) -> list[str]:
    """problems() for one rendered training plan (launch.sh, the Ray job's env, the task template's harness)."""
    import yaml

    submit = plan.commands[-1]
    job_env = json.loads(next(a for a in submit if a.startswith("--runtime-env-json=")).split("=", 1)[1])
    harness = yaml.safe_load(plan.files["polar_config.yaml"])["polar_task_template"]["agent"]["harness"]
    return problems(plan.files["launch.sh"], trainer_env, job_env.get("env_vars") or {}, harness, where)


def detail(plan) -> str:
    holders = [
        name
        for name, command in SERVERS.items()
        if any(
            control_plane.record()["env"] + "=" in line.split(command, 1)[0]
            for line in plan.files["launch.sh"].splitlines()
            if command in line
        )
    ]
    return f"token given to: {', '.join(holders)}" if holders else "no token (the gateway's sessions would inherit it)"


__all__ = ["STARTER_RECORD", "check_plan", "detail", "problems"]
