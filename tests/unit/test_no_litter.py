"""Pins the litter check of tests/conftest.py (issue 34 point 7): a run that leaves a `polarstack-*` entry in the
temporary directory, or a new entry in HOME outside the project's cache, fails when pytest finishes, naming it;
a clean run passes and leaves nothing in the temporary directory. Each case is a pytest of its own with
tests/conftest.py as its plugin, a fresh HOME and temporary directory."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[2]

CASES = {
    "clean": (
        "import tempfile\nfrom polarstack import paths\ndef test_x(tmp_path):\n"
        "    tempfile.TemporaryDirectory(prefix='polarstack-x-').cleanup()\n    (paths.cache_dir() / 'npm').mkdir()\n"
    ),
    "temp": "import tempfile\ndef test_x():\n    tempfile.mkdtemp(prefix='polarstack-verifier-')\n",
    "home": "import os, pathlib\ndef test_x():\n    (pathlib.Path(os.environ['HOME']) / '.npm').mkdir()\n",
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_run_that_leaves_litter_fails_naming_it(tmp_path, case):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "test_case.py").write_text(CASES[case])
    home, temp = tmp_path / "home", tmp_path / "temp"
    home.mkdir()
    temp.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("POLARSTACK_CACHE", "XDG_CACHE_HOME")}
    env.update(
        HOME=str(home),
        TMPDIR=str(temp),
        PYTHONPATH=os.pathsep.join([str(ROOT / "tests"), str(ROOT / "scripts")]),
    )
    command = [sys.executable, "-m", "pytest", "-p", "no:xdist", "-p", "no:cacheprovider", "-p", "conftest", "-q"]
    proc = subprocess.run(
        [*command, "test_case.py"], cwd=tmp_path / "run", env=env, capture_output=True, text=True, timeout=120
    )
    out = proc.stdout + proc.stderr
    if case == "clean":  # a temporary folder removed, and the project's cache, where things may go
        assert proc.returncode == 0, out
        assert "litter check" not in out and list(temp.iterdir()) == []  # the run's own folder removed
    else:
        assert proc.returncode == 1, out
        assert "1 passed" in out  # the test itself passed: the check failed the run
        if case == "temp":
            assert "polarstack litter check: left in the temporary directory" in out and "polarstack-verifier-" in out
        else:
            assert "polarstack litter check: new in HOME outside the project's cache" in out
            assert str(home / ".npm") in out
