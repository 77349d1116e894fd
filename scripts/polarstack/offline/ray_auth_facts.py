"""verify-offline, meaning: every Ray process the stack renders asks for the stack's token (issue 28 point 2).

From configs/upstream/ray-auth.json (scripts/tools/record_ray_auth.py: the pinned ray's sources, and its trainer head
measured refusing a client without the token on the dashboard/jobs API, `ray job submit` and the GCS):
- every rendered Ray process (the trainer service of every profile, on the node and with DEVICE=cpu; launch.sh, whose
  every `ray` line comes after its exports; the Ray job's runtime_env, slime's driver; the rehearsal's jobs) runs with
  RAY_AUTH_MODE=token and RAY_AUTH_TOKEN_PATH at the trainer's read-only mount of the host's token file, never with
  the token itself in RAY_AUTH_TOKEN;
- the mount's source is the rendered RAY_AUTH_TOKEN_FILE, an absolute path outside the repository (nothing under it
  reaches an image: the build contexts are the repository);
- the trainer's healthcheck (compose.yaml and the image's HEALTHCHECK) polls a path the pinned dashboard serves without
  the token and that answered 200 without it when measured (the jobs API's /api/version answers 401);
- the record itself still shows what the stack relies on: 401 without the token, 403 with a wrong one, the CLI and
  the GCS refusing, and the same clients working with it;
- no rendered file, command or plan holds the text of the token file, when one exists here.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from polarstack.errors import StackError
from polarstack.offline.check import Check
from polarstack.pins import parse_env_file, pin, repo_root
from polarstack.stack import compose, device, profiles, ray_auth
from polarstack.stack.cluster import Cluster
from polarstack.train.plan import LaunchPlan

RECORD = "configs/upstream/ray-auth.json"
# A line of launch.sh that runs the Ray CLI (`ray status`, `ray start`, `ray job submit|stop`).
RAY_CALL = re.compile(r"(^|[\s;|&(])ray (start|status|job|stop)\b")


def record() -> dict[str, Any]:
    return json.loads((repo_root() / RECORD).read_text())


def record_problems(rec: dict[str, Any] | None = None) -> list[str]:
    """Why the record no longer shows what the stack relies on."""
    rec = rec or record()
    out = []
    if rec.get("ray_version") != pin("RAY_VERSION"):
        out.append(
            f"{RECORD} was recorded for ray {rec.get('ray_version')}, not RAY_VERSION={pin('RAY_VERSION')}; rerun "
            "scripts/tools/record_ray_auth.py"
        )
    source, measured = rec["source"], rec["measured"]
    if source["env"]["mode"] != "RAY_AUTH_MODE" or source["env"]["token_path"] != "RAY_AUTH_TOKEN_PATH":
        out.append(f"{RECORD}: the pinned ray reads {source['env']}, not RAY_AUTH_MODE / RAY_AUTH_TOKEN_PATH")
    if rec["stack"]["container_token_path"] != ray_auth.CONTAINER_TOKEN_PATH:
        out.append(f"{RECORD} was measured with the token at {rec['stack']['container_token_path']}; rerecord it")
    if source["token_shape"]["hex_digits"] != ray_auth.TOKEN_HEX_DIGITS:
        out.append(f"ray makes tokens of {source['token_shape']['hex_digits']} hex digits, ray_auth writes 64")
    for path, found in measured["http"].items():
        if path in public_paths(rec):
            continue
        if found != {"without": 401, "wrong": 403, "with": 200}:
            out.append(
                f"{RECORD}: {path} answered {found} (measured), not 401 without the token / 403 wrong / 200 with"
            )
    for way in ("without", "wrong"):
        if measured["job_submit"][way]["job_ran"] or measured["job_submit"][way]["exit_code"] == 0:
            out.append(f"{RECORD}: `ray job submit` {way} the token ran the job")
        if measured["gcs_connect"][way]["connected"]:
            out.append(f"{RECORD}: ray.init to the GCS {way} the token connected")
    if not (measured["job_submit"]["with"]["job_ran"] and measured["gcs_connect"]["with"]["connected"]):
        out.append(f"{RECORD}: with the token, the job or ray.init did not work when measured")
    if measured.get("listeners_beyond_loopback"):
        out.append(
            f"{RECORD}: the head with the token listened beyond loopback: {measured['listeners_beyond_loopback']}"
        )
    return out


def public_paths(rec: dict[str, Any]) -> set[str]:
    return set(rec["source"]["dashboard_public_paths"])


def health_problems(url: str, label: str, rec: dict[str, Any]) -> list[str]:
    """Why a trainer healthcheck URL would fail (or lie) under token auth."""
    path = urlsplit(url).path or "/"
    measured = rec["measured"]["http"].get(path)
    if path not in public_paths(rec):
        return [
            f"{label}: the healthcheck polls {path}, which the pinned dashboard serves only with the token (its public "
            f"paths: {sorted(public_paths(rec))}); it would answer 401 and the trainer never turn healthy"
        ]
    if not measured or measured["without"] != 200:
        return [f"{label}: the healthcheck path {path} did not answer 200 without the token when measured ({RECORD})"]
    return []


def env_problems(environment: dict[str, object], label: str, rec: dict[str, Any] | None = None) -> list[str]:
    """Why a Ray process with this environment would not present the stack's token through the trainer's mount."""
    rec = rec or record()
    env = rec["source"]["env"]
    out = []
    if str(environment.get(env["mode"])) != env["mode_value"]:
        out.append(
            f"{label}: {env['mode']}={env['mode_value']} is missing, so this Ray process neither checks nor sends the "
            "token (a head without it serves every client; a client without it is refused: 401 / Unauthenticated)"
        )
    if str(environment.get(env["token_path"])) != ray_auth.CONTAINER_TOKEN_PATH:
        out.append(
            f"{label}: {env['token_path']} is {environment.get(env['token_path'])!r}, not the trainer's read-only mount "
            f"{ray_auth.CONTAINER_TOKEN_PATH}: ray would fall back to ~/.ray/auth_token or fail"
        )
    if env["token_text"] in environment:
        out.append(f"{label}: {env['token_text']} puts the token itself into the environment; use the file")
    return out


def inside_repository(path: str) -> bool:
    try:
        Path(path).resolve().relative_to(repo_root().resolve())
    except ValueError:
        return False
    return True


def service_problems(service: dict[str, Any], rendered_source: str, label: str, rec: dict[str, Any]) -> list[str]:
    """The trainer service: its environment, the read-only bind of the token file, the healthcheck."""
    environment = service.get("environment") or {}
    out = env_problems(environment, label, rec)
    target = str(environment.get(rec["source"]["env"]["token_path"]))
    binds = [v for v in service.get("volumes") or [] if v.get("target") == target]
    if len(binds) != 1 or binds[0].get("type") != "bind" or binds[0].get("read_only") is not True:
        out.append(f"{label}: no read-only bind mount of the token file at {target}: {binds}")
    elif binds[0].get("source") != rendered_source:
        out.append(f"{label}: the token mount's source is {binds[0].get('source')}, not RAY_AUTH_TOKEN_FILE")
    if not rendered_source.startswith("/"):
        out.append(f"{label}: RAY_AUTH_TOKEN_FILE={rendered_source!r} is not an absolute path")
    elif inside_repository(rendered_source):
        out.append(
            f"{label}: the token file {rendered_source} is inside the repository, where a commit or an image build "
            "(the build contexts are the repository) could take it"
        )
    test = (service.get("healthcheck") or {}).get("test") or []
    url = next((t for t in test if str(t).startswith("http")), "")
    out += health_problems(url, label, rec) if url else [f"{label}: the trainer's healthcheck polls no URL"]
    return out


def launch_problems(script: str, label: str, rec: dict[str, Any] | None = None) -> list[str]:
    """Why a Ray call of launch.sh would run without the token: every line that calls `ray` must come after the
    exports of RAY_AUTH_MODE=token and RAY_AUTH_TOKEN_PATH=<the mount>, and nothing may unset them."""
    rec = rec or record()
    env = rec["source"]["env"]
    lines = script.splitlines()
    wanted = {
        f"export {env['mode']}={env['mode_value']}",
        f"export {env['token_path']}={ray_auth.CONTAINER_TOKEN_PATH}",
    }
    found = [i for i, line in enumerate(lines) if line.strip() in wanted]
    calls = [i for i, line in enumerate(lines) if RAY_CALL.search(line) and not line.lstrip().startswith("#")]
    out = []
    if len({lines[i].strip() for i in found}) != len(wanted):
        out.append(f"{label}: launch.sh does not export {sorted(wanted - {lines[i].strip() for i in found})}")
    elif calls and min(calls) < max(found):
        out.append(f"{label}: launch.sh calls Ray (line {min(calls) + 1}) before it exports the token's settings")
    if not calls:
        out.append(f"{label}: launch.sh calls no `ray` (the check reads ray status / ray job submit / ray job stop)")
    if any(re.search(r"\bunset\s+RAY_AUTH|RAY_AUTH_MODE=(?!token)", line) for line in lines):
        out.append(f"{label}: launch.sh unsets or changes a RAY_AUTH_ setting")
    return out


def job_env(submit: list[str]) -> dict[str, object]:
    runtime = json.loads(next(a for a in submit if a.startswith("--runtime-env-json=")).split("=", 1)[1])
    return runtime.get("env_vars") or {}


def plan_problems(plan: LaunchPlan, label: str, rec: dict[str, Any] | None = None) -> list[str]:
    """A training launch (or one rehearsal job): slime's driver (the Ray job's runtime_env) and launch.sh."""
    rec = rec or record()
    return env_problems(job_env(plan.commands[-1]), f"{label} (Ray job)", rec) + launch_problems(
        plan.files["launch.sh"], f"{label} (launch.sh)", rec
    )


def dockerfile_problems(rec: dict[str, Any] | None = None) -> list[str]:
    """The trainer image's own HEALTHCHECK (used where Compose does not override it)."""
    rec = rec or record()
    text = (repo_root() / "images" / "trainer" / "Dockerfile").read_text()
    block = text[text.index("HEALTHCHECK") :].split("\n\n", 1)[0] if "HEALTHCHECK" in text else ""
    urls = re.findall(r"https?://[^\"' ]+", block)
    if not urls:
        return ["images/trainer/Dockerfile: the trainer's HEALTHCHECK polls no URL"]
    return health_problems(urls[0], "images/trainer/Dockerfile HEALTHCHECK", rec)


def token_text() -> tuple[str | None, str]:
    """(the token, a note) of the token file this machine would mount; (None, why) when there is none yet."""
    path = compose.token_file()
    if not path.exists():
        return None, f"no token at {path} yet (make up writes it): nothing to search for"
    try:
        return ray_auth.check(path).read_text().strip(), f"searched for the token of {path}"
    except StackError as exc:
        return None, exc.message


def leaks(texts: dict[str, str], token: str | None) -> list[str]:
    """The names of the rendered texts that hold the token (never the token)."""
    if not token:
        return []
    return [f"{name} holds the text of the Ray token file" for name, text in texts.items() if token in text]


def rendered_texts(directory: Path, model: dict[str, Any], plans: dict[str, LaunchPlan]) -> dict[str, str]:
    """Every file Compose inputs are rendered to, the Compose model, and every plan (files and commands)."""
    texts = {str(p): p.read_text(errors="replace") for p in sorted(directory.glob("*")) if p.is_file()}
    texts["the Compose model"] = json.dumps(model)
    for name, plan in plans.items():
        for file_name, text in plan.files.items():
            texts[f"{name}: {file_name}"] = text
        texts[f"{name}: commands"] = json.dumps(plan.commands)
    return texts


def check_profile(
    profile: profiles.Profile, model: dict[str, Any], directory: Path, plans: dict[str, LaunchPlan]
) -> list[Check]:
    rec = record()
    label = f"profile {profile.name}"
    source = parse_env_file(directory / f"{profile.name}.env").get(ray_auth.MOUNT_SOURCE_KEY, "")
    problems = service_problems(model["services"]["trainer"], source, f"{label}, service trainer", rec)
    for name, plan in plans.items():
        problems += plan_problems(plan, f"{label}, {name}", rec)
    token, note = token_text()
    leaked = leaks(rendered_texts(directory, model, plans), token)
    return [
        Check(
            f"{label}: every Ray process sends the token by the mounted file, the healthcheck needs none ({RECORD})",
            not problems,
            f"token file {source}",
            problems,
        ),
        Check(f"{label}: no rendered file, command or plan holds the Ray token", not leaked, note, leaked),
    ]


@contextmanager
def _cpu_environment(model_dir: Path):
    """DEVICE=cpu's rendering as main() sets it up (device.apply_cpu_defaults), undone afterwards."""
    changes = {
        device.DEVICE_ENV: "cpu",
        **device.CPU_PORTS,
        "MODEL_PATH": device.CPU_MODEL_PATH,
        "ENGINE_START_PERIOD": device.CPU_ENGINE_START_PERIOD,
        "MODEL_DIR": str(model_dir),
    }
    saved = {key: os.environ.get(key) for key in changes}
    os.environ.update(changes)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def check_cpu(directory: Path, cluster: Cluster) -> Check:
    """DEVICE=cpu (compose/compose.cpu.yaml over compose.yaml): its trainer presents the token the same way.
    `cluster`: the one the other profiles are rendered for (the site's)."""
    rec = record()
    label = "DEVICE=cpu: every profile's trainer sends the token by the mounted file, the healthcheck needs none"
    binary = compose.bundled_compose()
    command = [str(binary)] if binary else compose.compose_command()
    problems: list[str] = []
    model_dir = directory / "tiny-model"
    model_dir.mkdir(parents=True, exist_ok=True)
    with _cpu_environment(model_dir):
        for name in profiles.available():
            where = directory / name
            try:
                args = compose.compose_args(profiles.load(name), where, cluster=cluster, cpu=True)
            except StackError as exc:
                problems.append(f"DEVICE=cpu profile {name}: {exc.message}")
                continue
            proc = subprocess.run([*command, *args, "config", "--format", "json"], capture_output=True, text=True)
            if proc.returncode != 0:
                problems.append(f"DEVICE=cpu profile {name}: Compose rejected it: {proc.stderr.strip()[-200:]}")
                continue
            trainer = json.loads(proc.stdout)["services"]["trainer"]
            problems += service_problems(trainer, str(compose.token_file()), f"DEVICE=cpu profile {name}", rec)
    return Check(label, not problems, "", problems)


def check_record() -> Check:
    problems = record_problems() + dockerfile_problems()
    return Check(
        f"Ray token authentication as measured ({RECORD}): 401/403 without or with a wrong token on the dashboard "
        "and jobs API, `ray job submit` and ray.init refused, all working with it; the image's healthcheck public",
        not problems,
        "",
        problems,
    )
