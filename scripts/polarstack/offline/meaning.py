"""verify-offline, meaning: what the rendered flags DO for this stack (issue 10 points 2, 4, 6, 7), not only that they parse.

Each check reads the Compose model `docker compose config` renders for a profile and the training launch
`train.build_plan` renders per task, and argues from facts recorded from the pinned upstreams:
- bridge: every slime API the configured Polar entry points need exists at SLIME_COMMIT (polarstack.checks.bridge,
  configs/upstream/polar-bridge.json + slime-api.json);
- tool calls: every engine runs `--tool-call-parser` with a name the pinned sglang accepts, when the task
  template's agent harness acts through tool calls (polarstack.engine.tool_parser);
- hygiene: --save with --save-interval (slime never saves without it), dropout 0.0, a resume loads the run's own
  save directory;
- weight sync: disk transport => the directory is one volume mounted at the same path in trainer and every engine;
  nccl => trainer and engines share the host network and IPC namespace;
- sampling: the engines sample from the distribution slime's loss scores (configs/upstream/sampling-defaults.json):
  where the pinned sglang's `--sampling-defaults` default is "model" (every field a request leaves out comes from the
  weights' generation_config.json: Qwen2.5's top_p/top_k/repetition_penalty), every engine passes "openai", and the
  launch's `--rollout-temperature` is the OpenAI default 1.0 the engines then use.
"""

from __future__ import annotations

import json
from typing import Any

from polarstack.checks import bridge as bridge_check
from polarstack.checks.bridge import facts
from polarstack.engine import tool_parser
from polarstack.offline.check import Check
from polarstack.paths import load_defaults
from polarstack.pins import repo_root
from polarstack.reward import tasks
from polarstack.stack.cluster import Cluster
from polarstack.stack.profiles import Profile
from polarstack.train.plan import build_plan


def _opt(args: list[str], flag: str) -> str | None:
    return args[args.index(flag) + 1] if flag in args else None


def _after(tokens: list[str], marker: list[str]) -> list[str]:
    for i in range(len(tokens) - len(marker) + 1):
        if tokens[i : i + len(marker)] == marker:
            return tokens[i + len(marker) :]
    return []


def engine_tokens(service: dict[str, Any]) -> list[str]:
    import shlex

    extra = (service.get("environment") or {}).get("ENGINE_EXTRA_ARGS") or ""
    return _after(service.get("command") or [], ["-m", "sglang.launch_server"]) + shlex.split(extra)


def tool_parser_problems(engines: dict[str, list[str]], harness: str) -> list[str]:
    """{service: sglang tokens} -> one sentence per engine that cannot return parsed tool calls."""
    if harness not in tool_parser.HARNESSES_NEEDING_TOOL_CALLS:
        return []
    choices = tool_parser.parser_choices()
    problems = []
    for name, tokens in sorted(engines.items()):
        values = [tokens[i + 1] for i, t in enumerate(tokens[:-1]) if t == tool_parser.FLAG] + [
            t.split("=", 1)[1] for t in tokens if t.startswith(tool_parser.FLAG + "=")
        ]
        if not values or not values[-1]:
            problems.append(
                f"{name} runs without {tool_parser.FLAG}: sglang then never fills message.tool_calls, so the "
                f"{harness} harness cannot call a tool and every reward is 0; set "
                f"{tool_parser.PARSER_KNOB} (configs/stack.env or the profile)."
            )
        elif values[-1] not in choices:
            problems.append(
                f"{name}: {tool_parser.FLAG} {values[-1]} is not a parser of the pinned sglang; choose one "
                f"of {', '.join(choices)} ({tool_parser.PARSER_KNOB})."
            )
    return problems


def hygiene_problems(args: list[str]) -> list[str]:
    problems = []
    save, interval = _opt(args, "--save"), _opt(args, "--save-interval")
    if not save:
        problems.append("the launch passes no --save: nothing is ever checkpointed")
    if not interval or not interval.isdigit() or int(interval) <= 0:
        problems.append(
            "the launch passes no positive --save-interval: slime v0.3.1 never saves periodically "
            "(train_async.py, should_run_periodic_action returns False for None)"
        )
    for flag in ("--attention-dropout", "--hidden-dropout"):
        value = _opt(args, flag)
        if value is None or float(value) != 0.0:
            problems.append(f"{flag} is {value or 'unset (Megatron default 0.1)'}; slime's own RL scripts set 0.0")
    load = _opt(args, "--load")
    if load is not None and load != save:
        problems.append(f"--load {load} is not the run's --save {save}: a resume would not continue this run")
    return problems


def _mounts(service: dict[str, Any]) -> dict[str, str]:
    """{target path: source} of a service's volumes in the rendered Compose model."""
    out = {}
    for volume in service.get("volumes") or []:
        if isinstance(volume, dict) and volume.get("target"):
            out[volume["target"].rstrip("/")] = str(volume.get("source"))
    return out


def weight_sync_problems(args: list[str], services: dict[str, dict[str, Any]]) -> list[str]:
    default = facts()[1].get("options", {}).get("--update-weight-transport", {}).get("default", "nccl")
    transport = _opt(args, "--update-weight-transport") or default
    trainer = services.get("trainer") or {}
    engines = {n: s for n, s in services.items() if n.startswith("engine-")}
    problems = []
    if transport == "disk":
        directory = (_opt(args, "--update-weight-disk-dir") or "").rstrip("/")
        if not directory:
            return ["--update-weight-transport disk without --update-weight-disk-dir (slime refuses to start)"]
        sources = {}
        for name, service in {"trainer": trainer, **engines}.items():
            mount = max(
                (t for t in _mounts(service) if directory == t or directory.startswith(t + "/")), key=len, default=None
            )
            if mount is None:
                problems.append(
                    f"{name} does not mount {directory}: with disk weight sync the trainer writes "
                    "weight_vNNNNNN there and each engine reloads it from the same path"
                )
            else:
                sources[name] = (mount, _mounts(service)[mount])
        if len(set(sources.values())) > 1:
            problems.append(
                f"{directory} is not one shared volume at one path in trainer and engines "
                f"({', '.join(f'{n}: {s}:{m}' for n, (m, s) in sorted(sources.items()))})"
            )
    else:
        for name, service in {"trainer": trainer, **engines}.items():
            for key in ("network_mode", "ipc"):
                if service.get(key) != "host":
                    problems.append(
                        f"{name} has {key}={service.get(key)!r}: NCCL weight sync needs trainer and "
                        "engines on the host network and IPC namespace"
                    )
    return problems


def sampling_facts() -> dict[str, Any]:
    return json.loads((repo_root() / "configs" / "upstream" / "sampling-defaults.json").read_text())


def sampling_problems(engines: dict[str, list[str]], train_args: list[str], recorded: dict[str, Any]) -> list[str]:
    """Why the engines would sample from another distribution than the one slime's loss scores, or []."""
    sglang, slime = recorded["sglang"], recorded["slime"]
    flag, default = sglang["flag"], sglang["default"]
    problems = []
    for name, args in sorted(engines.items()):
        values = [args[i + 1] for i, token in enumerate(args[:-1]) if token == flag]
        value = values[-1] if values else default
        if value not in sglang["choices"]:
            problems.append(
                f"{name}: {flag} {value} is not a choice of the pinned sglang ({', '.join(sglang['choices'])})"
            )
        elif value != "openai":
            problems.append(
                f"{name}: {flag} is {value!r}{'' if values else ' (the default, ' + sglang['source'] + ')'}: every "
                f"field a request leaves out ({', '.join(sglang['model_keys'])}) comes from the weights' "
                f"generation_config.json, so the rollout log-probs are not those slime's loss scores "
                f"({slime['loss_source']}); pass {flag} openai"
            )
    temperature = _opt(train_args, "--rollout-temperature")
    expected = float(slime["rollout_temperature_default"])
    if temperature is not None and float(temperature) != 1.0:
        problems.append(
            f"--rollout-temperature {temperature}: the engines sample at the OpenAI default 1.0 unless the agent's "
            f"requests say otherwise, so slime's loss would score another distribution ({slime['loss_source']})"
        )
    elif temperature is None and expected != 1.0:
        problems.append(f"slime's --rollout-temperature default is {expected} ({slime['source']}), not 1.0: pass 1.0")
    return problems


def check_profile(profile: Profile, model: dict[str, Any], cluster: Cluster) -> list[Any]:
    """What the rendered flags of `profile` do (`model`: its Compose model; the plans on `cluster`, the site's)."""
    services = model.get("services") or {}
    checks = []
    engines = {n: engine_tokens(s) for n, s in services.items() if n.startswith("engine-")}
    config = load_defaults()
    for task in tasks.TASKS:
        harness = tasks.task_template(task)["agent"]["harness"]
        label = f"profile {profile.name}, make train TASK={task}"
        problems = tool_parser_problems(engines, harness)
        checks.append(
            Check(f"{label}: engines return parsed tool calls ({harness} harness)", not problems, "", problems)
        )
        for resume in (False, True):
            plan = build_plan(task, profile, run_id="verify", config=config, resume=resume, cluster=cluster)
            if not resume:
                problems = bridge_check.check(plan.train_args, config["gate"]["delegate"])
                checks.append(
                    Check(
                        f"{label}: Polar bridge entry points need only slime API the pin defines",
                        not problems,
                        "",
                        problems,
                    )
                )
                problems = weight_sync_problems(plan.train_args, services)
                checks.append(
                    Check(f"{label}: weight sync reaches the engines across containers", not problems, "", problems)
                )
                problems = sampling_problems(engines, plan.train_args, sampling_facts())
                checks.append(
                    Check(
                        f"{label}: engines sample from the distribution slime's loss scores (temperature 1.0, no "
                        "generation_config defaults)",
                        not problems,
                        "",
                        problems,
                    )
                )
            problems = hygiene_problems(plan.train_args)
            checks.append(
                Check(
                    f"{label}{' RESUME=1' if resume else ''}: checkpoints, dropout, resume", not problems, "", problems
                )
            )
    return checks


__all__ = [
    "check_profile",
    "tool_parser_problems",
    "hygiene_problems",
    "weight_sync_problems",
    "sampling_problems",
    "engine_tokens",
]
