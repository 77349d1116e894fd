"""Issue 18 point 5: apptainer inside the trainer depends on the host. `make up` checks the host's user-namespace
sysctls (against a fake /proc/sys tree here) before any long step, and the sandbox probe's sentence names the
host setting and its fix; the trainer gets what apptainer needs inside Docker (/dev/fuse, seccomp and AppArmor unconfined; not
systempaths=unconfined, which polarstack.offline.apptainer_userns refuses)."""

import pytest

import fake_node
from polarstack.checks import sandbox_probe
from polarstack.cli.main import main
from polarstack.errors import ExitCode, StackError
from polarstack.stack import host_check, profiles
from polarstack.stack.resolved import read_now

pytestmark = pytest.mark.unit


def proc_sys(tmp_path, **values):
    root = tmp_path / "proc-sys"
    for key, value in values.items():
        path = root / key.replace(".", "/")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"{value}\n")
    return root


@pytest.mark.parametrize(
    "values,needle",
    [
        (
            {"kernel.apparmor_restrict_unprivileged_userns": 1},
            "sysctl -w kernel.apparmor_restrict_unprivileged_userns=0",
        ),
        ({"user.max_user_namespaces": 0}, "sysctl -w user.max_user_namespaces=15000"),
        ({"kernel.unprivileged_userns_clone": 0}, "sysctl -w kernel.unprivileged_userns_clone=1"),
    ],
)
def test_make_up_refuses_a_host_that_blocks_user_namespaces_before_anything_starts(
    tmp_path, monkeypatch, capsys, values, needle
):
    log = fake_node.install(tmp_path, monkeypatch)
    proc_sys(tmp_path, **values)
    code = main(["compose", "up", "--profile", "engine-direct"])
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.startswith("polarstack:")]
    assert code == ExitCode.ENVIRONMENT and len(lines) == 1, err
    assert needle in lines[0] and next(iter(values)) in lines[0]
    assert not any(
        " up " in ln or "volume" in ln for ln in log.read_text().splitlines()
    )  # nothing looked up or started


def test_a_host_that_allows_them_passes(tmp_path):
    root = proc_sys(
        tmp_path,
        **{"kernel.apparmor_restrict_unprivileged_userns": 0, "user.max_user_namespaces": 63000},
    )
    assert host_check.userns_problems(root) == []


def test_the_probe_names_the_host_setting_when_the_sandbox_cannot_start(tmp_path, monkeypatch):
    fake_node.install(tmp_path, monkeypatch)
    proc_sys(tmp_path, **{"kernel.apparmor_restrict_unprivileged_userns": 1})
    monkeypatch.setenv("FAKE_SANDBOX_ERROR", "FATAL: could not create user namespace")
    with pytest.raises(StackError) as exc:
        sandbox_probe.check_in_trainer(profiles.load("engine-direct"), read_now())
    assert exc.value.code == ExitCode.ENVIRONMENT
    message = exc.value.message
    assert "could not create user namespace" in message and "apparmor_restrict_unprivileged_userns=1" in message
    assert "sudo sysctl -w kernel.apparmor_restrict_unprivileged_userns=0" in message


def test_the_trainer_gets_what_apptainer_needs_inside_docker():
    assert host_check.docker_problems(["seccomp=unconfined", "apparmor=unconfined"], ["/dev/fuse"]) == []
    assert "systempaths=unconfined" in host_check.record()["docker"]["not_granted"]
    missing = host_check.docker_problems(["seccomp=unconfined"], ["/dev/fuse"])
    assert missing and "apparmor=unconfined" in missing[0]
    missing = host_check.docker_problems(["seccomp=unconfined", "apparmor=unconfined"], [])
    assert missing and "/dev/fuse" in missing[0]
