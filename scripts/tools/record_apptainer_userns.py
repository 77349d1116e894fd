#!/usr/bin/env python3
"""Record the user namespace apptainer gives Polar's sessions in the trainer (read from the source, no code copied).

From a git checkout (a bare mirror will do) of apptainer/apptainer that holds the tag APPTAINER_RELEASE:

    .venv/bin/python scripts/tools/record_apptainer_userns.py --repo DIR > configs/upstream/apptainer-userns.json

The trainer runs as root without CAP_SYS_ADMIN (images/trainer/Dockerfile, compose/compose.yaml) and Polar passes
neither --userns nor --fakeroot (configs/upstream/polar-apptainer.json). What it reads at the tag, each fact with
the file and line where the code says it (found by a needle, so a moved line is found again and a changed one
fails): the launcher's useSuid falls back to a user namespace for root whose effective set lacks CAP_SYS_ADMIN;
setNamespaces then maps only `getuid() -> the launcher's uid, 1` (root: `0 0 1`) unless fakeroot is on; a PID
namespace only when it is asked for (Polar passes --pid only under POLAR_APPTAINER_ISOLATE_PID); root gets the
capabilities of `root default capabilities` (prepareRootCaps); the /etc/subuid range is mapped only on the fakeroot
path, which --fakeroot or APPTAINER_FAKEROOT (the flag's environment key) turns on; without a PID namespace the
container's /proc is the caller's, bound recursively (addKernelMount), so /proc/sys is whatever Docker gave the
trainer; the caller's /tmp is bound in unless `--no-mount tmp` (addTmpMount, `mount tmp` defaulting to yes); the
caller's environment passes in unless --cleanenv (env.SetContainerEnv, with its keep and omit lists); an IPC
namespace only with --ipc; with --pid a fresh procfs, whose failure to mount ends the start (mountGeneric); the
caller's /dev is bound in with `mount dev = yes` (the default), a staged one (the devices listed) with `minimal`.
`make verify-offline` (polarstack.offline.apptainer_userns) checks what these mean for the stack.
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys

from polarstack.pins import pin

LAUNCHER = "internal/pkg/runtime/launch/launcher_linux.go"
FLAGS = "cmd/internal/cli/action_flags.go"
PREPARE = "internal/pkg/runtime/engine/apptainer/prepare_linux.go"
FAKEROOT = "internal/pkg/fakeroot/fakeroot.go"
CONTAINER = "internal/pkg/runtime/engine/apptainer/container_linux.go"
CONFIG = "pkg/util/apptainerconf/config.go"
ENV_CREATE = "internal/pkg/util/env/create.go"
ENV_PREFIXES = "internal/pkg/util/env/env.go"


def _git(repo: str, *args: str) -> str:
    """`git ARGS` in `repo`, a checkout or a bare mirror."""
    bare = subprocess.run(["git", "-C", repo, "rev-parse", "--is-bare-repository"], capture_output=True, text=True)
    where = ["--git-dir", repo] if bare.stdout.strip() == "true" else ["-C", repo]
    return subprocess.run(["git", *where, *args], capture_output=True, text=True, check=True).stdout


def _source(repo: str, tag: str, path: str) -> list[str]:
    return _git(repo, "show", f"{tag}:{path}").splitlines()


def _line(lines: list[str], needle: str, after: str | None = None, path: str = "") -> int:
    """The 1-based line holding `needle` (the first after the line holding `after`, when given)."""
    start = 0
    if after is not None:
        start = next((i for i, text in enumerate(lines) if after in text), -1) + 1
        if start == 0:
            raise SystemExit(f"{path}: no line holds {after!r}; apptainer changed, read it again")
    for index in range(start, len(lines)):
        if needle in lines[index]:
            return index + 1
    raise SystemExit(f"{path}: no line holds {needle!r}; apptainer changed, read it again")


def _map_keys(lines: list[str], opening: str, path: str) -> list[str]:
    """The quoted keys of the Go map literal that starts on the line holding `opening`, in source order."""
    start = _line(lines, opening, None, path)
    keys = []
    for text in lines[start:]:
        if text.strip() == "}":
            return keys
        keys.append(text.split('"')[1])
    raise SystemExit(f"{path}: the map opened by {opening!r} does not close; apptainer changed, read it again")


def _string_const(lines: list[str], name: str, path: str) -> str:
    return lines[_line(lines, f'{name} = "', None, path) - 1].split('"')[1]


def record(repo: str, tag: str) -> dict:
    commit = _git(repo, "rev-parse", f"{tag}^{{commit}}").strip()
    launcher, flags, prepare, fakeroot, container, config, create, prefixes = (
        _source(repo, tag, p) for p in (LAUNCHER, FLAGS, PREPARE, FAKEROOT, CONTAINER, CONFIG, ENV_CREATE, ENV_PREFIXES)
    )
    passed = _map_keys(create, "var alwaysPassKeys = map[string]struct{}{", ENV_CREATE)
    omitted = _map_keys(create, "var alwaysOmitKeys = map[string]bool{", ENV_CREATE)
    not_forwarded = [_string_const(prefixes, n, ENV_PREFIXES) for n in ("ApptainerPrefix", "LegacySingularityPrefix")]
    overrides = [_string_const(prefixes, n, ENV_PREFIXES) for n in ("ApptainerEnvPrefix", "LegacySingularityEnvPrefix")]
    clean_lang = create[_line(create, 'g.SetProcessEnv("LANG", ', "func SetContainerEnv", ENV_CREATE) - 1]
    dev_default_at = _line(config, 'directive:"mount dev"', None, CONFIG)
    dev_default = config[dev_default_at - 1].split('default:"')[1].split('"')[0]
    minimal_at = _line(container, 'MountDev == "minimal"', "func (c *container) addDevMount", CONTAINER)
    yes_at = _line(container, 'MountDev == "yes"', "func (c *container) addDevMount", CONTAINER)
    minimal_devices = [
        text.split('addSessionDev("')[1].split('"')[0]
        for text in container[minimal_at:yes_at]
        if 'c.addSessionDev("/dev/' in text
    ]
    tmp_default = _line(config, 'directive:"mount tmp"', None, CONFIG)
    no_tmp = _line(launcher, "l.engineConfig.SetNoTmp(true)", "func (l *Launcher) setNoMountFlags", LAUNCHER)
    at = lambda lines, path, needle, after=None: {  # noqa: E731
        "file": path,
        "line": _line(lines, needle, after, path),
    }
    return {
        "what": "The user namespace apptainer runs Polar's sessions in, in this stack's trainer (root without "
        "CAP_SYS_ADMIN, no --userns or --fakeroot): its uid map, namespaces and capabilities. Read from the source "
        "and restated in our words; the verifier's sandbox (scripts/polarstack/reward/verifier/host.py "
        "one_uid_shape) isolates in this shape, tests/sandbox/test_verifier_one_uid.py reproduces it with "
        "`unshare --user --map-root-user --mount --fork`, and make verify-offline (polarstack.offline.apptainer_userns) "
        "checks what it means for the stack.",
        "repo": "apptainer/apptainer",
        "apptainer_release": tag,
        "commit": commit,
        "recorded_on": datetime.date.today().isoformat(),
        "recorded_with": "scripts/tools/record_apptainer_userns.py --repo <apptainer checkout>",
        "uid_map_for_root": "0 0 1",
        "reproduced_by": ["unshare", "--user", "--map-root-user", "--mount", "--fork"],
        "fakeroot_env": ["APPTAINER_FAKEROOT", "SINGULARITY_FAKEROOT"],
        "pid_namespace_env": "POLAR_APPTAINER_ISOLATE_PID",
        "ipc_namespace_env": "POLAR_APPTAINER_ISOLATE_IPC",
        "mount_dev": {
            "conf": "/etc/apptainer/apptainer.conf",
            "directive": "mount dev",
            "default": dev_default,
            "stack_sets": "minimal",
            "minimal_devices": minimal_devices,
            "minimal_fresh": ["/dev/shm", "/dev/pts", "/dev/ptmx"],
        },
        "proc_sys_lifted_by": "systempaths=unconfined",
        "environment": {
            "always_passed": passed,
            "always_omitted": omitted,
            "prefixes_not_forwarded": not_forwarded,
            "override_prefixes": overrides,
            "cleanenv_sets": {"LANG": clean_lang.split('"')[3]},
        },
        "facts": {
            "user_namespace_fallback": dict(
                at(launcher, LAUNCHER, "Effective capability CAP_SYS_ADMIN is missing, fallback to user namespace"),
                function="Launcher.useSuid",
                fact="root (uid 0) not already asking for a user namespace, whose effective capability set lacks "
                "CAP_SYS_ADMIN, gets one: the non-setuid starter with Namespaces.User set. The trainer's root is "
                "that root (Docker's default capabilities hold no CAP_SYS_ADMIN).",
            ),
            "one_uid_map": dict(
                at(
                    launcher,
                    LAUNCHER,
                    "AddLinuxUIDMapping(uint32(os.Getuid()), l.uid, 1)",
                    "func (l *Launcher) setNamespaces",
                ),
                function="Launcher.setNamespaces",
                fact="with a user namespace and no fakeroot, the uid map is one line, the caller's uid outside to "
                "the target uid inside, size 1 (the gid map likewise): for root `0 0 1`. No sandbox uid "
                "(61000-61999) exists in that namespace, so the verifier cannot switch its candidate to one.",
            ),
            "pid_namespace_only_when_asked": dict(
                at(launcher, LAUNCHER, 'AddOrReplaceLinuxNamespace("pid", "")', "func (l *Launcher) setNamespaces"),
                function="Launcher.setNamespaces",
                fact="a PID namespace is added only when Namespaces.PID is set (--pid); Polar passes --pid only "
                "when POLAR_APPTAINER_ISOLATE_PID is truthy (configs/upstream/polar-apptainer.json), so the "
                "session shares the trainer's PID namespace: hence `unshare` without --pid reproduces it.",
            ),
            "root_capabilities": dict(
                at(prepare, PREPARE, "func (e *EngineOperations) prepareRootCaps"),
                function="EngineOperations.prepareRootCaps",
                fact="uid 0 gets the capabilities `root default capabilities` in apptainer.conf names (full by "
                "default), within the user namespace: so the verifier holds CAP_SYS_ADMIN there, may make its "
                "sandbox's namespaces, and must drop every capability for its candidate itself.",
            ),
            "ipc_namespace_only_when_asked": dict(
                at(launcher, LAUNCHER, 'AddOrReplaceLinuxNamespace("ipc", "")', "func (l *Launcher) setNamespaces"),
                function="Launcher.setNamespaces",
                fact="an IPC namespace is added only when Namespaces.IPC is set (--ipc); Polar passes --ipc when "
                "POLAR_APPTAINER_ISOLATE_IPC is truthy, and the stack sets it: the trainer shares the host's IPC "
                "namespace (compose.yaml ipc: host, for NCCL with the engines), which a session would otherwise "
                "share too (System V shared memory, semaphores and message queues, removable by the same uid).",
            ),
            "fresh_proc_with_pid_namespace": dict(
                at(
                    container,
                    CONTAINER,
                    'system.Points.AddFS(mount.KernelTag, "/proc", "proc", syscall.MS_NOSUID|syscall.MS_NODEV, "")',
                    "func (c *container) addKernelMount",
                ),
                function="container.addKernelMount",
                fact="with a PID namespace (--pid, POLAR_APPTAINER_ISOLATE_PID) apptainer mounts a fresh procfs at "
                "/proc instead of binding the caller's; in a user namespace the kernel refuses that mount where the "
                "caller's /proc has locked over-mounts, as Docker's masked and read-only /proc paths are "
                "(tests/sandbox/test_session_namespaces.py measures the EPERM), unless systempaths=unconfined "
                "lifts them, which the trainer must not (proc_bound_without_pid_namespace).",
            ),
            "mount_failure_is_fatal": dict(
                at(container, CONTAINER, 'return fmt.Errorf("can\'t mount %s filesystem to %s: %s"'),
                function="container.mountGeneric",
                fact="a failed mount of a file system other than devpts and overlay ends the container's start "
                "(`can't mount proc filesystem to /proc: ...`): with --pid in the trainer every session would fail "
                "to start; there is no fallback to the caller's /proc.",
            ),
            "dev_bound_by_default": dict(
                at(container, CONTAINER, 'MountDev == "yes"', "func (c *container) addDevMount"),
                function="container.addDevMount",
                fact=f"with `mount dev = yes` (the default: {CONFIG} l.{dev_default_at}) apptainer binds the caller's /dev into the session, MS_REC: the trainer's GPUs (/dev/nvidia*), "
                "/dev/fuse and, with ipc: host, the host's /dev/shm, where NCCL and the engines keep their shared "
                "memory; every one open to the session's uid 0, the trainer's own uid.",
            ),
            "dev_minimal": dict(
                at(container, CONTAINER, 'MountDev == "minimal"', "func (c *container) addDevMount"),
                function="container.addDevMount",
                fact="with `mount dev = minimal` (or --contain) /dev is a staged directory holding only "
                + ", ".join(minimal_devices)
                + " (bound from the caller's), a fresh tmpfs at /dev/shm, a new devpts instance at /dev/pts with "
                "/dev/ptmx, /dev/mqueue with --ipc, and GPU devices only with --nv (which Polar passes only for "
                "spec.gpus > 0). The trainer image sets it in /etc/apptainer/apptainer.conf.",
            ),
            "fakeroot_from_the_environment": dict(
                at(flags, FLAGS, 'EnvKeys:      []string{"FAKEROOT"}', "var actionFakerootFlag"),
                function="actionFakerootFlag",
                fact="--fakeroot is also set by the flag's environment key FAKEROOT, which apptainer's flag parser "
                "(pkg/cmdline/flag.go, env.ApptainerPrefixes) reads as APPTAINER_FAKEROOT or the legacy "
                "SINGULARITY_FAKEROOT; the launcher's Fakeroot comes from that flag.",
            ),
            "proc_bound_without_pid_namespace": dict(
                at(
                    container,
                    CONTAINER,
                    'system.Points.AddBind(mount.KernelTag, "/proc", "/proc", bindFlags)',
                    "func (c *container) addKernelMount",
                ),
                function="container.addKernelMount",
                fact="with `mount proc` on (the default) and no PID namespace (c.pidNS false), apptainer mounts no "
                "fresh procfs: it binds the caller's /proc at /proc with MS_REC, so the session's /proc/sys is the "
                "trainer's, read-only where Docker made it so (copied into the session's mount namespace, locked "
                "there). Docker's read-only /proc/sys is lifted by --security-opt systempaths=unconfined; the "
                "session's uid 0 is the node's global root (`0 0 1`), and the kernel lets the global root write "
                "sysctls by their owner bits with no capability, so with it lifted an agent could set "
                "kernel.core_pattern: code run as the node's root. The trainer must keep it.",
            ),
            "tmp_bound_by_default": dict(
                at(
                    container,
                    CONTAINER,
                    "system.Points.AddBind(mount.TmpTag, tmpSource, tmpPath, flags)",
                    "func (c *container) addTmpMount",
                ),
                function="container.addTmpMount",
                fact=f"unless `mount tmp = no` in apptainer.conf (its default is yes: {CONFIG} l.{tmp_default}) or "
                f"--no-mount tmp (SetNoTmp, {LAUNCHER} l.{no_tmp}), and without --contain, the caller's /tmp and "
                "/var/tmp are bound into the session: every "
                "session would see the trainer's /tmp, where Polar keeps the session directories. Polar passes "
                "`--no-mount ...,tmp` when POLAR_APPTAINER_NO_MOUNT_TMP is truthy (configs/upstream/polar-apptainer.json).",
            ),
            "environment_without_cleanenv": dict(
                at(create, ENV_CREATE, "if _, ok := alwaysOmitKeys[key]; ok || cleanEnv {", "func mustAddToHostEnv"),
                function="env.SetContainerEnv, env.mustAddToHostEnv",
                fact="every variable of the launcher's environment is set in the session except the keys of "
                "alwaysOmitKeys (" + ", ".join(omitted) + "; HOME and PATH are set by apptainer) and the ones "
                "starting with " + " or ".join(not_forwarded) + ": without --cleanenv a session inherits the "
                "environment of the process that runs apptainer, Polar's server in this stack, secrets included.",
            ),
            "environment_with_cleanenv": dict(
                at(create, ENV_CREATE, 'g.SetProcessEnv("LANG", ', "func SetContainerEnv"),
                function="env.SetContainerEnv",
                fact="with --cleanenv only the keys of alwaysPassKeys (" + ", ".join(passed) + ") pass, LANG is set "
                "to "
                + clean_lang.split('"')[3]
                + ", and a variable named with a prefix of "
                + " or ".join(overrides)
                + " is set without its prefix (overridesForContainerEnv, applied with or without --cleanenv); what the "
                "session needs must come on the command line (Polar's `env K=V`).",
            ),
            "subuid_only_with_fakeroot": dict(
                at(prepare, PREPARE, "getIDRange(fakerootutil.SubUIDFile, uid)"),
                function="EngineOperations.prepareContainerConfig (its GetFakeroot() branch)",
                fact="the caller's range in "
                + fakeroot[_line(fakeroot, 'SubUIDFile = "', None, FAKEROOT) - 1].split("=", 1)[1].strip().strip('"')
                + " (fakeroot.SubUIDFile) is added to the uid map only on the fakeroot path: without --fakeroot or "
                "APPTAINER_FAKEROOT a range there changes nothing.",
            ),
        },
        "confirm_on_the_gpu_node": "in a session: `cat /proc/self/uid_map` prints `0 0 1`; the task's verifier "
        "prints PASSED for a canonical answer (make train's in-trainer sandbox probe); writing "
        "/proc/sys/kernel/core_pattern's own value back fails (read-only file system); `ls /tmp` shows no other "
        "session's directory; `ls /dev` shows no nvidia device and no fuse; `ipcs -m` lists none of the trainer's "
        "segments; `env` holds no WANDB_API_KEY; `ps -e` still lists the trainer's processes (the recorded limit).",
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
