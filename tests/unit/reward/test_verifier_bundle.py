"""Pins how the verifier package becomes the one file Polar's evaluator runs (scripts/polarstack/reward/verifier/bundle.py):
the same text every time, the file `tasks prepare` writes, standard-library imports only, every module of the
package in it (none forgotten) and every name it defines the package's own, the embedded sandbox programs
unchanged; the bundler refuses a module that imports beyond the standard library or defines a name another
module defines. Running the bundled file is pinned in tests/sandbox/test_verifier_standalone.py."""

import ast
import subprocess
import sys
import types

import pytest

from polarstack.reward import tasks
from polarstack.reward.verifier import bundle, candidate, supervisor
from polarstack.reward.verifier.limits import ISOLATION_ENV, Limits

pytestmark = pytest.mark.unit


def test_the_bundle_is_deterministic_and_is_what_tasks_prepare_writes(tmp_path):
    text = bundle.source()
    assert text == bundle.source()
    tasks.prepare("humaneval", tmp_path, limit=1)
    assert (tmp_path / "eval" / "verifier.py").read_text(encoding="utf-8") == text


def test_the_bundle_imports_the_standard_library_only():
    tree = ast.parse(bundle.source())
    modules = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    modules += [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    assert modules and "polarstack" not in {m.split(".")[0] for m in modules}
    assert all(m.split(".")[0] in sys.stdlib_module_names or m == "__future__" for m in modules), modules


def test_every_module_of_the_package_is_bundled_or_named_as_not():
    files = {p.stem for p in bundle.PACKAGE.glob("*.py")}
    assert files == set(bundle.MODULES) | set(bundle.NOT_BUNDLED)


def test_the_bundle_holds_the_package_and_its_sandbox_programs_unchanged(monkeypatch):
    module = types.ModuleType("bundled_verifier")
    monkeypatch.setitem(sys.modules, module.__name__, module)  # dataclasses look their module up
    exec(compile(bundle.source(), "verifier.py", "exec"), module.__dict__)
    namespace = module.__dict__
    for name in (
        "verify",
        "verify_many",
        "reward_func",
        "main",
        "run_program",
        "probe_sandbox",
        "Limits",
        "Outcome",
        "IsolationUnavailable",
        "ISOLATION_ENV",
        "VERIFIER_UID_BASE",
        "_unshare_flags",
        "parse_report",
    ):
        assert name in namespace, name
    assert namespace["_SUPERVISOR"] == supervisor._SUPERVISOR and namespace["_RUNNER"] == candidate._RUNNER
    assert namespace["ISOLATION_ENV"] == ISOLATION_ENV == "POLARSTACK_VERIFIER_ISOLATION"
    assert namespace["Limits"]().timeout == Limits().timeout


def test_python_m_polarstack_verifier_is_the_command_line():
    proc = subprocess.run(
        [sys.executable, "-m", "polarstack.reward.verifier", "--help"], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0 and "--problem" in proc.stdout and "--isolation" in proc.stdout


@pytest.fixture
def package(tmp_path, monkeypatch):
    """A stand-in package of two modules for the bundler's refusals."""
    monkeypatch.setattr(bundle, "PACKAGE", tmp_path)
    monkeypatch.setattr(bundle, "MODULES", ("first", "__init__"))
    (tmp_path / "__init__.py").write_text('"""Doc."""\n\nimport os\n\nfrom polarstack.x import y\n\nB = os.sep\n')
    return tmp_path


def test_the_bundler_merges_imports_and_drops_the_packages_own(package):
    (package / "first.py").write_text('"""First."""\n\nimport os\nimport sys\n\nA = sys.platform  # kept\n')
    text = bundle.source()
    assert text.startswith('"""Doc."""\n\nfrom __future__ import annotations\n\nimport os\nimport sys\n')
    assert "polarstack" not in text and "A = sys.platform  # kept" in text and text.index("A =") < text.index("B =")
    assert text.endswith('if __name__ == "__main__":\n    sys.exit(main())\n')


@pytest.mark.parametrize(
    "source,refusal",
    [
        ('"""First."""\n\nimport yaml\n\nA = 1\n', "not in the standard library"),
        ('"""First."""\n\nB = 2\n', "B is defined in verifier/first.py and verifier/__init__.py"),
        ('"""First."""\n\nA = 1\nimport os\n', "after its body began"),
        ('"""First."""\n\nimport os as system\n', "renames an import"),
    ],
)
def test_the_bundler_refuses_what_one_file_cannot_hold(package, source, refusal):
    (package / "first.py").write_text(source)
    with pytest.raises(bundle.BundleError, match=refusal):
        bundle.source()
