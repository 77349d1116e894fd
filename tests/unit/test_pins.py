"""Pins the single source of versions: images/README.md names every pinned value, and no build, config or
runtime file repeats one as a literal (tests and measurement docs may name releases). `make pin` without a
reachable registry says so and leaves configs/pins.env unchanged."""

import re

import pytest

from polarstack.cli.main import main
from polarstack.errors import ExitCode
from polarstack.pins import parse_env_file, pins, repo_root

pytestmark = pytest.mark.unit
ROOT = repo_root()
SCANNED = ["compose", "images", "configs", "scripts", ".ci", "Makefile", "pyproject.toml"]
ALLOWED = {"configs/pins.env", "images/README.md"}


def scanned_files():
    for entry in SCANNED:
        path = ROOT / entry
        for file in [path] if path.is_file() else sorted(path.rglob("*")):
            rel = str(file.relative_to(ROOT))
            # configs/upstream/ holds option tables recorded at the pinned versions; verify-offline checks that
            # their recorded versions equal the pins.
            if (
                file.is_file()
                and rel not in ALLOWED
                and "__pycache__" not in rel
                # pip's generated copy of the README (`pip install -e`), which may name releases like any doc
                and ".egg-info/" not in rel
                and not rel.endswith(".local.env")
                and not rel.startswith("configs/upstream/")
            ):
                yield rel, file.read_text(errors="replace")


def pinned_literals() -> dict[str, str]:
    table = pins()
    literals = {}
    for key, value in table.items():
        if not value or key.endswith(("_PACKAGE", "_REPO", "_IMAGE")):
            continue
        if key.startswith("ROUTER_") and key.endswith("_VERSION"):
            package = table[key.replace("_VERSION", "_PACKAGE")]
            literals[key] = f"{package}=={value}"  # a bare router version also names measured releases
        else:
            literals[key] = value
    return literals


def test_readme_names_every_pin():
    readme = (ROOT / "images/README.md").read_text()
    for key, value in pins().items():
        if value:
            assert value in readme, f"images/README.md does not name {key}={value}"
        assert key.split("_VERSION")[0].split("_PACKAGE")[0] in readme, key


@pytest.mark.parametrize("key", sorted(pinned_literals()))
def test_pinned_value_appears_nowhere_else(key):
    literal = pinned_literals()[key]
    offenders = [rel for rel, text in scanned_files() if literal in text]
    assert not offenders, f"{key}={literal} repeated as a literal in {offenders}; read it from configs/pins.env"


def test_dockerfile_args_have_no_version_defaults():
    for dockerfile in ROOT.glob("images/*/Dockerfile"):
        for line in dockerfile.read_text().splitlines():
            if line.startswith("ARG "):
                assert "=" not in line, f"{dockerfile}: {line} (pins come from configs/pins.env as build args)"


def test_compose_passes_every_dockerfile_arg():
    compose_text = (ROOT / "compose/compose.yaml").read_text()
    for dockerfile in ROOT.glob("images/*/Dockerfile"):
        for arg in set(re.findall(r"^ARG (\w+)$", dockerfile.read_text(), re.M)):
            assert f"{arg}: ${{{arg}" in compose_text, f"compose.yaml does not pass {arg} to {dockerfile.parent.name}"


def test_pin_without_registry_changes_nothing(monkeypatch, capsys):
    before = (ROOT / "configs/pins.env").read_bytes()
    monkeypatch.setenv("POLARSTACK_REGISTRY_AUTH", "http://127.0.0.1:9/token")  # the CLI hands it to run_pin
    code = main(["pin"])
    assert code == ExitCode.ENVIRONMENT
    assert "unchanged" in capsys.readouterr().err
    assert (ROOT / "configs/pins.env").read_bytes() == before


def test_pins_file_parses_strictly(tmp_path):
    bad = tmp_path / "pins.env"
    bad.write_text("A=1\nA=2\n")
    from polarstack.errors import StackError

    with pytest.raises(StackError, match="set twice"):
        parse_env_file(bad)
