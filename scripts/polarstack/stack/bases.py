"""`make bases DEVICE=cpu`: the base images of a CPU run of the Docker stack, made on this machine, never pulled.

No registry is reachable here, so the GPU node's pinned bases (PYTHON_IMAGE, SLIME_IMAGE in configs/pins.env) are
swapped, on DEVICE=cpu only, for three bases built from Debian and PyPI (images/README.md, "CPU bases"):
- PYTHON_BASE: Debian DEBIAN_SUITE by debootstrap (Debian's default mirror; no host is named), made to behave like
  the python image the router and model-download Dockerfiles expect: `python` on PATH (python-is-python3), pip
  usable (Debian's PEP 668 EXTERNALLY-MANAGED marker removed), and this host's CA bundle with a pip.conf naming it
  (with Debian's own bundle pip finds no distribution here; ../shared/reference/tooling.md);
- ENGINE_BASE: PYTHON_BASE plus the pinned sglang (SGLANG_VERSION) copied from this host's install
  (polarstack.stack.real_sglang: `polarstack sglang-install`, which make_all runs first when it is missing), so
  images/engine/Dockerfile's version check passes and no second 4.8 GB download happens;
- TRAINER_BASE: PYTHON_BASE plus ray[default] at RAY_VERSION (the trainer's Ray head and its dashboard, which the
  trainer's healthcheck asks), for what runs without slime, Polar and apptainer.
Each is cached: kept when its image exists (the rootfs tarball under the cache too), rebuilt with `--rebuild`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

from polarstack.errors import ExitCode, StackError
from polarstack.paths import cache_dir
from polarstack.pins import pins
from polarstack.stack import real_sglang

REPOSITORY = "polarstack-cpu"  # local image names only: nothing here is pushed or pulled
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
BASE_CA_PATH = "/usr/local/share/polarstack/host-ca-certificates.crt"
# Debian packages of the python-like base: the interpreter, venv and pip, `python` on PATH, TLS, and curl.
PACKAGES = ("python3", "python3-venv", "python3-pip", "python-is-python3", "ca-certificates", "curl")
SITE_PACKAGES = "/usr/local/lib/python3.11/dist-packages"  # Debian's python3.11 reads it before /usr/lib's


def python_base() -> str:
    return f"{REPOSITORY}/python:{pins()['DEBIAN_SUITE']}"


def engine_base() -> tuple[str, str]:
    """(image, tag) of the CPU engine base: the name the CPU override passes as SLIME_IMAGE / SLIME_IMAGE_TAG."""
    return f"{REPOSITORY}/sglang", pins()["SGLANG_VERSION"]


def trainer_base() -> tuple[str, str]:
    return f"{REPOSITORY}/trainer-base", f"ray-{pins()['RAY_VERSION']}"


def _docker(args: list[str], **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(["docker", *args], **kwargs)


def exists(ref: str) -> bool:
    return _docker(["image", "inspect", ref], capture_output=True).returncode == 0


def _fail(what: str, proc: subprocess.CompletedProcess, fix: str) -> StackError:
    text = ((proc.stderr or b"") if isinstance(proc.stderr, bytes) else (proc.stderr or "").encode()).decode(
        errors="replace"
    )
    last = [line for line in text.splitlines() if line.strip()][-1:] or [f"exit {proc.returncode}"]
    return StackError(f"{what} failed ({last[0][:200]}); {fix}.", ExitCode.ENVIRONMENT)


def rootfs_tarball(progress: Callable[[str], None], rebuild: bool = False) -> Path:
    """The python-like Debian tree as a tarball under the cache (debootstrap once)."""
    suite = pins()["DEBIAN_SUITE"]
    tarball = cache_dir() / "bases" / f"debian-{suite}-python.tar"
    if tarball.exists() and not rebuild:
        return tarball
    if shutil.which("debootstrap") is None:
        raise StackError(
            "make bases DEVICE=cpu needs debootstrap to make the Debian base without a registry; install it "
            "(`apt-get install -y debootstrap`).",
            ExitCode.ENVIRONMENT,
        )
    if not HOST_CA_BUNDLE.is_file():
        raise StackError(f"make bases needs this host's CA bundle at {HOST_CA_BUNDLE}.", ExitCode.ENVIRONMENT)
    tarball.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=tarball.parent, prefix=".rootfs-") as tmp:
        root = Path(tmp) / "rootfs"
        progress(f"bases: debootstrap {suite} (minbase + {', '.join(PACKAGES)})")
        proc = subprocess.run(
            ["debootstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}", suite, str(root)],
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            raise _fail(f"debootstrap {suite}", proc, "check that Debian's mirror is reachable, then rerun")
        # pip usable: Debian's PEP 668 marker makes every `pip install` outside a venv refuse.
        for marker in root.glob("usr/lib/python3*/EXTERNALLY-MANAGED"):
            marker.unlink()
        # This host's CA bundle, and pip told to use it (Debian's own bundle: pip finds no distribution here).
        ca = root / BASE_CA_PATH.lstrip("/")
        ca.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(HOST_CA_BUNDLE, ca)
        (root / "etc" / "pip.conf").write_text(f"[global]\ncert = {BASE_CA_PATH}\ndisable-pip-version-check = true\n")
        shutil.rmtree(root / "var" / "cache" / "apt" / "archives", ignore_errors=True)
        for lists in (root / "var" / "lib" / "apt" / "lists").glob("*_*"):
            lists.unlink()
        partial = tarball.with_suffix(".tar.tmp")
        proc = subprocess.run(["tar", "-C", str(root), "-cf", str(partial), "."], capture_output=True, text=True)
        if proc.returncode != 0:
            raise _fail("packing the Debian tree", proc, "check the disk space under the cache")
        partial.replace(tarball)
    return tarball


def make_python_base(progress: Callable[[str], None], rebuild: bool = False) -> str:
    ref = python_base()
    if exists(ref) and not rebuild:
        progress(f"bases: {ref} (cached)")
        return ref
    tarball = rootfs_tarball(progress, rebuild)
    progress(f"bases: docker import {ref}")
    proc = _docker(
        [
            "import",
            "--change",
            "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8",
            "--change",
            'CMD ["python3"]',
            str(tarball),
            ref,
        ],
        capture_output=True,
    )
    if proc.returncode != 0:
        raise _fail(f"docker import {ref}", proc, "check the Docker engine (`docker info`)")
    return ref


def _commit_from(base: str, ref: str, script: str, mounts: list[str], network: str, changes: list[str]) -> None:
    """Run `script` in a throw-away container of `base` and commit the result as `ref` (one layer)."""
    name = f"polarstack-bases-{os.getpid()}-{int(time.time())}"
    cmd = ["run", "--name", name, "--network", network]
    for mount in mounts:
        cmd += ["-v", mount]
    try:  # the script as the command, not as an entrypoint: `docker commit` would keep that entrypoint
        proc = _docker([*cmd, base, "/bin/sh", "-c", script], capture_output=True)
        if proc.returncode != 0:
            raise _fail(f"building {ref}", proc, "see `docker logs` of a rerun with --debug")
        commit = ["commit"]
        for change in changes:
            commit += ["--change", change]
        proc = _docker([*commit, name, ref], capture_output=True)
        if proc.returncode != 0:
            raise _fail(f"docker commit {ref}", proc, "check the Docker engine's disk space")
    finally:
        _docker(["rm", "-f", name], capture_output=True)


def host_sglang(progress: Callable[[str], None]) -> None:
    """The pinned sglang on this host, installed once when missing (`polarstack sglang-install`'s install, with its
    progress): ENGINE_BASE copies it, so `make bases|build|up DEVICE=cpu` and `make demo RUNTIME=docker` need it."""
    if real_sglang.is_installed():
        return
    progress(
        f"bases: the CPU engine image copies {real_sglang.spec()} from this host's install under "
        f"{real_sglang.venv_dir().parent}, which is not there yet: installing it now, once (several minutes; the "
        "same install as `polarstack sglang-install`)"
    )
    real_sglang.install(progress)


def make_engine_base(progress: Callable[[str], None], rebuild: bool = False) -> str:
    image, tag = engine_base()
    ref = f"{image}:{tag}"
    if exists(ref) and not rebuild:
        progress(f"bases: {ref} (cached)")
        return ref
    real_sglang.require_installed()  # ENVIRONMENT naming `polarstack sglang-install` when absent
    venv = real_sglang.venv_dir()
    site = next(iter(sorted(venv.glob("lib/python3*/site-packages"))), None)
    if site is None:
        raise StackError(f"{venv} holds no site-packages; rerun `polarstack sglang-install`.", ExitCode.ENVIRONMENT)
    progress(f"bases: {ref} (sglang from {site}, copied: no download)")
    script = (
        f"set -e; mkdir -p {SITE_PACKAGES}; cp -a /sglang-site/. {SITE_PACKAGES}/; "
        f"rm -rf {SITE_PACKAGES}/__pycache__; "
        'python3 -c "import sglang, sys; print(sglang.__version__)"'
    )
    _commit_from(
        make_python_base(progress),
        ref,
        script,
        [f"{site}:/sglang-site:ro"],
        "none",
        ['CMD ["python3"]'],
    )
    return ref


def make_trainer_base(progress: Callable[[str], None], rebuild: bool = False) -> str:
    image, tag = trainer_base()
    ref = f"{image}:{tag}"
    if exists(ref) and not rebuild:
        progress(f"bases: {ref} (cached)")
        return ref
    version = pins()["RAY_VERSION"]
    progress(f"bases: {ref} (ray[default]=={version} from PyPI)")
    script = f"set -e; pip install --no-cache-dir 'ray[default]=={version}'; ray --version"
    _commit_from(make_python_base(progress), ref, script, [], "host", ['CMD ["python3"]'])
    return ref


def make_all(progress: Callable[[str], None] = lambda s: print(s, file=sys.stderr), rebuild: bool = False) -> list:
    started = time.monotonic()
    host_sglang(progress)  # before the first base: `make up DEVICE=cpu` on a fresh HOME installs, never exits 8 later
    refs = [
        make_python_base(progress, rebuild),
        make_engine_base(progress, rebuild),
        make_trainer_base(progress, rebuild),
    ]
    progress(f"bases: {len(refs)} CPU bases ready in {time.monotonic() - started:.0f} s")
    return refs
