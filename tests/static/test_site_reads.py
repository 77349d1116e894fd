"""Issue 35 point 1: where a command runs is resolved once, by the site (scripts/polarstack/cli/site.py). Below it the
package takes the device, the cluster, the run states and the profile's settings from its caller, so none of these
reads is called outside the site module and the stated exceptions:

- `cluster.load` (configs/cluster.env and the environment), `profiles.knob` (profile, environment, stack.env, per call),
- `device.is_cpu` / `device.current` (POLARSTACK_DEVICE), `docker_state.read` and `local.read_state` (the run state).

The check parses every module of scripts/polarstack with ast: a call of one of them through its module
(`cluster.load()`, `cluster_mod.load()`), through a name imported from it (`knob(...)`), or inside its own module
(`is_cpu()` in device.py). EXCEPTIONS are the stated ones by path, each with its reason. STATED lists the few calls
below the site that stay, at function level, each in one of two stated categories (CATEGORIES): read_now()'s
fallback for callers with no site (whose callers in the package READ_NOW_CALLERS lists: only the defaults of a `site`
every product caller passes), and a run-state module re-reading its own record at the moment it writes or removes
it. An entry whose call is gone fails, so the set can only shrink; a call not listed fails. A planted module shows
the checker catches each form."""

import ast
from pathlib import Path

import pytest

from polarstack.pins import repo_root

pytestmark = pytest.mark.unit
PACKAGE = repo_root() / "scripts" / "polarstack"
READS = {  # module: its functions that read where a command runs
    "polarstack.stack.cluster": {"load"},
    "polarstack.stack.profiles": {"knob"},
    "polarstack.stack.device": {"is_cpu", "current"},
    "polarstack.stack.docker_state": {"read"},
    "polarstack.stack.local": {"read_state"},
}
SITE = "cli/site.py"
RESOLVED_READS = "stack/resolved.py"
# The site's three reads, in a class below cli/ that read_now() shares (the rest of the module is not excepted).
SHARED_READS = {f"{RESOLVED_READS}:ReadOnce.": "the site's cluster and run-state reads, shared by read_now()"}
EXCEPTIONS = {  # a path (a folder ends with /): why it reads for itself
    SITE: "the module that builds the site",
    "reward/verifier/": "the verifier bundle runs alone inside the sandbox, with no CLI and no package around it",
    "train/gate.py": "in-job: slime imports it inside the Ray job, where no CLI ran",
    "train/ray_job.py": "in-job: run inside the trainer by `python3 -m polarstack.train.ray_job`, no site there",
    "train/synthetic_rollout.py": "in-job: run inside the trainer (torch is there), no site there",
    "train/learning_signal.py": "in-job: the gate's zero-advantage watch, inside the Ray job",
    "train/tracker.py": "in-job: the gate's W&B / TensorBoard metrics, inside the Ray job",
}
CATEGORIES = {  # a stated exception below the site, at function level: why such a read stays where it is
    "read_now": "stack.resolved.read_now(), the fallback the site shares for callers with no site: the tests of one "
    "module and scripts/tools (record_ray_auth.py); in the package it is only the default of a `site` parameter that "
    "every product caller passes (READ_NOW_CALLERS, checked below). A caller whose own command changed the run "
    "states takes stack.resolved.reread(site) instead: the site's device and cluster, the records read again",
    "own record": "a run-state module re-reading the record it is about to write or remove, in the directory it acts "
    "on, as it is at that moment: the site read the records once when the command began, and by now `compose down` "
    "ran, refuse_unfinished_up cleared it, a demo rewrote it for its next profile, or the directory is a demo's or a "
    "bench's own, which the site never reads",
}
STATED = {  # "path:function:call": its category (CATEGORIES) and what it reads at that moment
    "stack/resolved.py:_ReadNow.cpu:device.current": ("read_now", "the device, POLARSTACK_DEVICE"),
    "stack/docker_state.py:forget:docker_state.read": ("own record", "after `compose down`, before removing it"),
    "stack/docker_state.py:guard_other_profile:docker_state.read": (
        "own record",
        "before up/down/clean and each demo profile: refuse_unfinished_up may have cleared the site's, a demo "
        "rewrites it at every profile, and it clears a stale one",
    ),
    "stack/local.py:refuse_if_up:local.read_state": (
        "own record",
        "before up (the run dir's) and each demo or bench topology (its own directory) writes a state there",
    ),
    "stack/local.py:down:local.read_state": ("own record", "down of one state directory, before removing it"),
}
# Where the package calls read_now(): the defaults of a `site` parameter, never taken by a product caller (cli/ passes
# the site; the rehearsal's gate passes stack.resolved.reread of it).
READ_NOW_CALLERS = {
    "train/launch.py:TrainRequest.resolved": "TrainRequest.site: cli/main.py's _cmd_train passes args.site; the "
    "rehearsal's gate builds a request without one, whose site host_gate reads only for a local target (it is docker)",
    "stack/target.py:resolve_target": "site=None: cli/main.py, stack.runtime, train.launch and the rehearsal's gate "
    "pass one",
}


def _module_name(rel: str) -> str:
    return "polarstack." + rel.removesuffix(".py").replace("/", ".").removesuffix(".__init__")


def site_reads(path: Path, rel: str) -> list[str]:
    """Every call in `path` of a function of READS, as "rel:enclosing function:module.function"."""
    tree = ast.parse(path.read_text(), filename=str(path))
    own = _module_name(rel)
    modules: dict[str, str] = {}  # local name -> a module of READS
    functions: dict[str, tuple[str, str]] = {}  # local name -> (module, function) imported from it
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                if full in READS:
                    modules[alias.asname or alias.name] = full
                elif alias.name in READS.get(node.module, ()):
                    functions[alias.asname or alias.name] = (node.module, alias.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in READS:
                    modules[alias.asname or alias.name] = alias.name
    found: list[str] = []

    def called(func: ast.expr) -> tuple[str, str] | None:
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
            module = modules.get(func.value.id)
            return (module, func.attr) if module and func.attr in READS[module] else None
        if isinstance(func, ast.Name):
            if func.id in functions:
                return functions[func.id]
            if func.id in READS.get(own, ()):  # inside the module that defines it
                return own, func.id
        return None

    def visit(node: ast.AST, where: str) -> None:
        for child in ast.iter_child_nodes(node):
            inner = where
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                inner = f"{where}.{child.name}" if where else child.name
            if isinstance(child, ast.Call):
                hit = called(child.func)
                if hit:
                    found.append(f"{rel}:{where or '<module>'}:{hit[0].rsplit('.', 1)[1]}.{hit[1]}")
            visit(child, inner)

    visit(tree, "")
    return found


def excepted(rel: str) -> bool:
    return any(rel.startswith(path) if path.endswith("/") else rel == path for path in EXCEPTIONS)


def package_reads(package: Path) -> list[str]:
    out = []
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package).as_posix()
        if not excepted(rel):
            out += [read for read in site_reads(path, rel) if not read.startswith(tuple(SHARED_READS))]
    return out


def test_where_a_command_runs_is_read_only_by_the_site():
    reads = package_reads(PACKAGE)
    unstated = sorted(set(reads) - set(STATED))
    assert not unstated, "take these from the site (polarstack.cli.site / stack.resolved) instead:\n" + "\n".join(
        unstated
    )


def test_every_stated_read_still_exists_so_the_set_only_shrinks():
    stale = sorted(set(STATED) - set(package_reads(PACKAGE)))
    assert not stale, "these calls are gone: remove them from STATED:\n" + "\n".join(stale)
    assert {category for category, _ in STATED.values()} == set(CATEGORIES)  # each category is used, none unstated


def read_now_calls(package: Path) -> list[str]:
    """Every call of stack.resolved.read_now in `package` (outside resolved.py), as "rel:enclosing function"."""
    found: list[str] = []

    def visit(node: ast.AST, rel: str, where: str) -> None:
        for child in ast.iter_child_nodes(node):
            inner = where
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                inner = f"{where}.{child.name}" if where else child.name
            if isinstance(child, ast.Call):
                func = child.func
                name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
                if name == "read_now":
                    found.append(f"{rel}:{where or '<module>'}")
            visit(child, rel, inner)

    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package).as_posix()
        if rel != RESOLVED_READS:
            visit(ast.parse(path.read_text(), filename=str(path)), rel, "")
    return found


def test_read_now_is_only_the_default_of_a_site_every_product_caller_passes():
    calls = read_now_calls(PACKAGE)
    assert sorted(set(calls)) == sorted(READ_NOW_CALLERS), "read_now() below the CLI: pass the site (or reread it)"


def test_the_site_reads_and_every_exception_is_a_path_of_the_package():
    site = site_reads(PACKAGE / SITE, SITE) + site_reads(PACKAGE / RESOLVED_READS, RESOLVED_READS)
    assert {c.rsplit(":", 1)[1] for c in site} >= {
        "cluster.load",
        "device.current",
        "docker_state.read",
        "local.read_state",
    }
    for path in EXCEPTIONS:
        assert (PACKAGE / path).exists(), path


def test_a_planted_read_is_caught_in_each_form(tmp_path):
    (tmp_path / "stack").mkdir()
    (tmp_path / "planted.py").write_text(
        "from polarstack.stack import cluster as cluster_mod\n"
        "from polarstack.stack import device, docker_state\n"
        "from polarstack.stack.profiles import knob\n"
        "from polarstack.stack.local import read_state as state_of\n\n"
        "HERE = cluster_mod.load()\n\n"
        "def where(profile):\n"
        "    return device.is_cpu(), knob(profile, 'X'), docker_state.read(), state_of()\n"
    )
    (tmp_path / "stack" / "device.py").write_text("def project():\n    return 'cpu' if is_cpu() else 'gpu'\n")
    (tmp_path / "train").mkdir()
    (tmp_path / "train" / "gate.py").write_text("from polarstack.stack import device\nCPU = device.is_cpu()\n")
    assert package_reads(tmp_path) == [
        "planted.py:<module>:cluster.load",
        "planted.py:where:device.is_cpu",
        "planted.py:where:profiles.knob",
        "planted.py:where:docker_state.read",
        "planted.py:where:local.read_state",
        "stack/device.py:project:device.is_cpu",
    ]  # train/gate.py is a stated exception


def test_a_planted_read_now_call_is_caught(tmp_path):
    (tmp_path / "stack").mkdir()
    (tmp_path / "stack" / "resolved.py").write_text("def read_now():\n    return None\n\nHERE = read_now()\n")
    (tmp_path / "planted.py").write_text(
        "from polarstack.stack import resolved\nfrom polarstack.stack.resolved import read_now\n\n"
        "class Request:\n    def where(self):\n        return read_now()\n\n"
        "def later():\n    return resolved.read_now()\n"
    )
    assert read_now_calls(tmp_path) == ["planted.py:Request.where", "planted.py:later"]  # resolved.py: its home
