"""Pins scripts/tools/record_apptainer_starter_env.py (review point 6): it finds, by needle, where apptainer's source says
which environment its starter keeps beside a session, and refuses a source where the starter takes the caller's
environment (then --cleanenv would not keep Polar's control-plane token out of a session's /proc). Run here on a small
git repository holding the needles at a tag; the committed record is of APPTAINER_RELEASE."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from polarstack.pins import pins, repo_root

pytestmark = pytest.mark.unit

SCRIPT = repo_root() / "scripts" / "tools" / "record_apptainer_starter_env.py"
FILES = {
    "internal/pkg/util/starter/starter.go": [
        "func Exec(name string, config *config.Common, ops ...CommandOp) error {",
        "func (c *Command) init(config *config.Common, ops ...CommandOp) error {",
        "\tc.env = append(c.env, sylog.GetEnvVar())",
        "\tc.env = append(c.env, envConfig...)",
        "\treturn nil",
        "}",
    ],
    "internal/pkg/runtime/launch/launcher_linux.go": [
        "func (l *Launcher) setEnvVars(ctx context.Context, args []string) error {",
        "\tapptainerEnv := env.SetContainerEnv(l.generator, environment, l.cfg.CleanEnv, home)",
        "\tl.engineConfig.SetApptainerEnv(apptainerEnv)",
        "}",
        "func (l *Launcher) starterInteractive(loadOverlay bool) error {",
        "\terr := starter.Exec(",
    ],
    "cmd/starter/c/starter.c": ["            /* master and container processes lives in the same user namespace */"],
}


def _repo(tmp_path, files) -> str:
    repo = tmp_path / "apptainer"
    for path, lines in files.items():
        (repo / path).parent.mkdir(parents=True, exist_ok=True)
        (repo / path).write_text("\n".join(lines) + "\n")
    git = ["git", "-C", str(repo), "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "t"], check=True)
    subprocess.run([*git, "tag", "v-test"], check=True)
    return str(repo)


def _record(repo: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(repo_root() / "scripts")}
    return subprocess.run(
        [sys.executable, str(SCRIPT), "--repo", repo, "--tag", "v-test"], capture_output=True, text=True, env=env
    )


def test_the_recorder_cites_each_fact_where_the_source_says_it(tmp_path):
    proc = _record(_repo(tmp_path, FILES))
    assert proc.returncode == 0, proc.stderr
    record = json.loads(proc.stdout)
    assert record["caller_environment_kept_by_apptainer"] is False and record["master_in_session_user_namespace"]
    lines = {name: (fact["file"], fact["line"]) for name, fact in record["facts"].items()}
    assert lines == {
        "exec_replaces_itself": ("internal/pkg/runtime/launch/launcher_linux.go", 6),
        "starter_environment": ("internal/pkg/util/starter/starter.go", 4),
        "engine_config_environment": ("internal/pkg/runtime/launch/launcher_linux.go", 3),
        "master_in_session_user_namespace": ("cmd/starter/c/starter.c", 1),
    }


@pytest.mark.parametrize(
    "path,line",
    [
        ("internal/pkg/util/starter/starter.go", "\tc.env = append(c.env, os.Environ()...)"),
        ("internal/pkg/util/starter/starter.go", "\tcurrent := os.Environ()"),
    ],
)
def test_the_recorder_refuses_a_starter_that_takes_the_callers_environment(tmp_path, path, line):
    files = {**FILES, path: [*FILES[path][:3], line, *FILES[path][3:]]}
    proc = _record(_repo(tmp_path, files))
    assert proc.returncode != 0 and "read it again" in proc.stderr


def test_the_committed_record_is_of_the_pinned_release():
    record = json.loads((repo_root() / "configs" / "upstream" / "apptainer-starter-env.json").read_text())
    assert record["apptainer_release"] == pins()["APPTAINER_RELEASE"]
    assert record["caller_environment_kept_by_apptainer"] is False and record["engine_config_environment"] == "computed"
