#!/usr/bin/env python3
"""Record which environment apptainer's own processes keep, beside a session (read from the source, no code copied).

From a git checkout (a bare mirror will do) of apptainer/apptainer that holds the tag APPTAINER_RELEASE:

    .venv/bin/python scripts/tools/record_apptainer_starter_env.py --repo DIR > configs/upstream/apptainer-starter-env.json

Why: Polar's gateway runs `apptainer exec` with its whole environment (configs/upstream/polar-facts.json
control_plane.sessions), which holds Polar's control-plane token. --cleanenv keeps it out of the session's variables
(env.SetContainerEnv), but a session could also read it in the environment of an apptainer process that shares its
user namespace: in the non-setuid workflow the trainer's root gets, the starter's master process lives in the session's
user namespace and, with no PID namespace, in its /proc. What it reads at the tag, each fact with the file and line
where the code says it (found by a needle, so a moved line is found again and a changed one fails): `apptainer exec`
replaces itself with the starter (Launcher.starterInteractive -> starter.Exec -> unix.Exec); the starter's environment
is only the message level and the engine configuration's chunks (starter.Command.init, no os.Environ); the engine
configuration carries the container's environment as SetContainerEnv computed it (Launcher.setEnvVars, --cleanenv
applied); the master and container processes share the created user namespace (starter.c). `make verify-offline`
(polarstack.offline.control_plane) checks what these mean for the token.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys

from record_apptainer_userns import _git, _line, _source

from polarstack.pins import pin

STARTER_GO = "internal/pkg/util/starter/starter.go"
LAUNCHER = "internal/pkg/runtime/launch/launcher_linux.go"
STARTER_C = "cmd/starter/c/starter.c"


def record(repo: str, tag: str) -> dict:
    commit = _git(repo, "rev-parse", f"{tag}^{{commit}}").strip()
    starter_go, launcher, starter_c = (_source(repo, tag, p) for p in (STARTER_GO, LAUNCHER, STARTER_C))
    init_at = _line(starter_go, "func (c *Command) init(", None, STARTER_GO)
    init_end = _line(starter_go, "return nil", "func (c *Command) init(", STARTER_GO)
    appended = [t.strip() for t in starter_go[init_at:init_end] if "c.env = append(c.env," in t]
    if appended != ["c.env = append(c.env, sylog.GetEnvVar())", "c.env = append(c.env, envConfig...)"]:
        raise SystemExit(f"{STARTER_GO}: Command.init builds the starter's environment otherwise; read it again")
    if any("os.Environ()" in t for t in starter_go):
        raise SystemExit(f"{STARTER_GO}: the starter now reads the caller's environment; read it again")
    at = lambda lines, path, needle, after=None: {  # noqa: E731
        "file": path,
        "line": _line(lines, needle, after, path),
    }
    return {
        "what": "Which environment apptainer's own processes keep in this stack's sessions (the non-setuid user "
        "namespace workflow of the trainer's root, configs/upstream/apptainer-userns.json): read from the source and "
        "restated in our words. make verify-offline (polarstack.offline.control_plane) checks that Polar's "
        "control-plane token reaches no session through them.",
        "repo": "apptainer/apptainer",
        "apptainer_release": tag,
        "commit": commit,
        "recorded_on": datetime.date.today().isoformat(),
        "recorded_with": "scripts/tools/record_apptainer_starter_env.py --repo <apptainer checkout>",
        "caller_environment_kept_by_apptainer": False,
        "engine_config_environment": "computed",  # SetContainerEnv's result: --cleanenv applied
        "master_in_session_user_namespace": True,
        "facts": {
            "exec_replaces_itself": dict(
                at(launcher, LAUNCHER, "err := starter.Exec(", "func (l *Launcher) starterInteractive"),
                function="Launcher.starterInteractive, starter.Exec",
                fact="`apptainer exec` (Polar's direct mode) ends by execve of the starter binary (unix.Exec), so no "
                "process keeps the command's own environment block: the starter's /proc/<pid>/environ is the "
                "environment it is given.",
            ),
            "starter_environment": dict(
                at(starter_go, STARTER_GO, "c.env = append(c.env, envConfig...)", "func (c *Command) init("),
                function="starter.Command.init",
                fact="the starter is given only the message-level variable (sylog.GetEnvVar), the engine configuration "
                "in ENGINE_CONFIG chunks, and LOAD_OVERLAY_MODULE when asked; the caller's environment (os.Environ) is "
                "not among it.",
            ),
            "engine_config_environment": dict(
                at(launcher, LAUNCHER, "l.engineConfig.SetApptainerEnv(apptainerEnv)", "func (l *Launcher) setEnvVars"),
                function="Launcher.setEnvVars",
                fact="the engine configuration carries the container's environment as env.SetContainerEnv computed it "
                "from the caller's, --cleanenv applied: with --cleanenv only the always-passed keys, LANG and the "
                "APPTAINERENV_ overrides, without it every variable of the caller's environment (its ENGINE_CONFIG "
                "chunks then hold the caller's secrets too).",
            ),
            "master_in_session_user_namespace": dict(
                at(starter_c, STARTER_C, "master and container processes lives in the same user namespace"),
                function="starter.c main (CREATE_NAMESPACE, not the hybrid workflow)",
                fact="without setuid the starter creates the user namespace before it forks the container process: "
                "the master, which keeps the starter's environment, lives in the session's user namespace (and, with "
                "no PID namespace, in its /proc), where the session's uid 0 may read its /proc/<pid>/environ.",
            ),
        },
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", required=True, help="a git checkout or mirror of apptainer/apptainer")
    parser.add_argument("--tag", default=None, help="default: APPTAINER_RELEASE from configs/pins.env")
    args = parser.parse_args()
    json.dump(record(args.repo, args.tag or pin("APPTAINER_RELEASE")), sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
