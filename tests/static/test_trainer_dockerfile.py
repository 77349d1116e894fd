"""images/trainer/Dockerfile's ray step (issue 32 point 5): the trainer builds on a base image whatever ray it carries.

slime's requirements.txt does not pin ray, so its image may carry another ray than RAY_VERSION (PyPI is at 2.60.0
while the pin is 2.57.1). The step used to refuse such a base; it now installs ray[default] at RAY_VERSION over it,
so the ray facts recorded for RAY_VERSION (configs/upstream/ray-flags.json) stay true of the image. The test runs the
Dockerfile's own RUN step, as written, under the Dockerfile's SHELL, with a fake `ray` module and a fake `pip`.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from polarstack.pins import pins, repo_root

DOCKERFILE = repo_root() / "images" / "trainer" / "Dockerfile"


def _instructions(stage: str) -> list[tuple[str, str]]:
    """(instruction, arguments) of one stage of the Dockerfile, continuation lines joined, comments dropped."""
    logical, current = [], ""
    for line in DOCKERFILE.read_text().splitlines():
        if not current and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.rstrip().endswith("\\"):
            current += line.rstrip()[:-1]  # Docker drops the escape and the newline
            continue
        logical.append(current + line)
        current = ""
    out, inside = [], False
    for text in logical:
        word, _, rest = text.strip().partition(" ")
        if word.upper() == "FROM":
            inside = bool(re.search(rf"\bAS {stage}$", rest.strip()))
            continue
        if inside:
            out.append((word.upper(), rest))
    return out


def ray_step() -> str:
    runs = [rest for word, rest in _instructions("base") if word == "RUN" and "RAY_VERSION" in rest]
    assert len(runs) == 1, runs
    return runs[0]


def shell() -> list[str]:
    import json

    shells = [json.loads(rest) for word, rest in _instructions("base") if word == "SHELL"]
    return shells[-1] if shells else ["/bin/sh", "-c"]


def run_step(tmp_path: Path, base_ray: str | None, pip_works: bool = True) -> tuple[subprocess.CompletedProcess, list]:
    """The RUN step with python3 importing a fake `ray` (version `base_ray`; None: no ray) and a fake pip that
    records its arguments and, for `ray[default]==V`, replaces the fake ray with version V."""
    site = tmp_path / "site" / "ray"
    site.mkdir(parents=True)
    body = f"__version__ = {base_ray!r}\n" if base_ray else "raise ImportError('no ray in this base')\n"
    (site / "__init__.py").write_text(body)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "pip-calls"
    (bin_dir / "python3").symlink_to(sys.executable)
    (bin_dir / "pip").write_text(
        "#!/bin/sh\n"
        f'printf "%s\\n" "$*" >> {calls}\n'
        + ("" if pip_works else "echo 'ERROR: No matching distribution found' >&2; exit 1\n")
        + 'for a in "$@"; do case "$a" in "ray[default]=="*) '
        f'printf \'__version__ = "%s"\\n\' "${{a#*==}}" > {site}/__init__.py;; esac; done\n'
    )
    (bin_dir / "pip").chmod(0o755)
    env = {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "PYTHONPATH": str(tmp_path / "site"),
        "PYTHONNOUSERSITE": "1",
        "PYTHONDONTWRITEBYTECODE": "1",  # the fake ray is rewritten within a second, at the same size
        "HOME": str(tmp_path),
        "RAY_VERSION": pins()["RAY_VERSION"],
    }
    proc = subprocess.run([*shell(), ray_step()], capture_output=True, text=True, env=env, timeout=60)
    made = calls.read_text().splitlines() if calls.exists() else []
    return proc, made


def test_a_base_with_another_ray_gets_the_pinned_one(tmp_path):
    pinned = pins()["RAY_VERSION"]
    proc, calls = run_step(tmp_path, "2.60.0")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert calls == [f"install --no-cache-dir ray[default]=={pinned}"], calls
    assert "the base image has ray 2.60.0" in proc.stdout and f"RAY_VERSION={pinned}" in proc.stdout
    assert f"the image has ray {pinned}" in proc.stdout


def test_a_base_without_ray_gets_the_pinned_one(tmp_path):
    pinned = pins()["RAY_VERSION"]
    proc, calls = run_step(tmp_path, None)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert calls == [f"install --no-cache-dir ray[default]=={pinned}"]
    assert "the base image has ray none" in proc.stdout and f"the image has ray {pinned}" in proc.stdout


def test_a_base_with_the_pinned_ray_installs_nothing(tmp_path):
    pinned = pins()["RAY_VERSION"]
    proc, calls = run_step(tmp_path, pinned)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert calls == []
    assert f"the image has ray {pinned}" in proc.stdout


def test_an_install_that_fails_fails_the_build_with_one_sentence(tmp_path):
    proc, calls = run_step(tmp_path, "2.60.0", pip_works=False)
    assert proc.returncode != 0 and len(calls) == 1
    assert f"pip could not install ray[default]=={pins()['RAY_VERSION']} over 2.60.0" in proc.stderr


def test_the_ray_facts_are_recorded_for_the_version_the_image_installs():
    """The step installs RAY_VERSION; the ray facts verify-offline checks must be recorded for that very version."""
    import json

    pinned = pins()["RAY_VERSION"]
    upstream = repo_root() / "configs" / "upstream"
    for name in ("ray-flags.json", "ray-auth.json"):
        assert json.loads((upstream / name).read_text())["ray_version"] == pinned, name
    assert "RAY_VERSION" in " ".join(rest for word, rest in _instructions("base") if word == "ARG")


def test_the_step_runs_under_the_dockerfiles_shell():
    assert shell()[:1] == ["/bin/bash"] and "pipefail" in shell()
