"""Issue 35 point 1, for the environment itself: below cli/, no module reads the environment for a stack setting.
The site (scripts/polarstack/cli/site.py, with its shared reads in stack/resolved.py) resolves the settings once per
command; test_site_reads.py confines the reading functions (cluster.load, profiles.knob, device.current, the
run-state reads) to it. This test does the same for every direct access to the environment.

The check parses every module of scripts/polarstack outside cli/ with ast and finds each access: a read
(`os.environ.get(K)`, `os.environ[K]`, `os.getenv(K)`, `K in os.environ`), a write (`os.environ[K] = v`, `del`,
`.setdefault`, `.update`, `.pop`, `os.putenv`, `os.unsetenv`), a copy (`{**os.environ}`, `dict(os.environ)`,
`.items()`, `.copy()`), or the mapping handed on whole; through `os` (or an alias of it) or a name imported from it
(`from os import environ, getenv`). Each is named "path:enclosing function:what", `what` being the operation and
the variable (a module constant's value when it names one, else the expression as written).

Every access found must be in ALLOWED, each entry with its category and a word on what it is; the categories are
stated once, in CATEGORIES, each with its reason. None of them is "a stack setting not moved yet": a setting read
below cli/ is moved to the caller (the site, a Profile's settings, an options object the CLI builds) instead. An
entry whose access is gone fails, so the set only shrinks; a category no entry uses fails too. EXCEPTIONS are the
stated exceptions by path. A planted module shows each form is caught."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from polarstack.pins import repo_root

pytestmark = pytest.mark.unit
ROOT = repo_root()
PACKAGE = ROOT / "scripts" / "polarstack"
SITE = "cli/"  # the module that builds the site and the CLI around it: not scanned (issue 35 point 1)
EXCEPTIONS = {  # a path (a folder ends with /): why it reads the environment for itself
    "reward/verifier/": "the verifier bundle runs alone inside the agent sandbox as Polar's test_command, with no CLI "
    "and no package around it; its knobs reach it as environment variables (stack/verifier_knobs.py)",
}

SITE_RESOLUTION = "site resolution"
FILES = "where files are"
CHILD = "a child's environment"
HOOK = "a test hook"
IN_JOB = "in-job"
FOR_COMPOSE = "written for Compose"
CREDENTIAL = "a credential named"
VERIFIER_GUARD = "the verifier's own variable"
CATEGORIES = {  # each category of access below cli/, stated once: why such an access is not a stack setting read here
    SITE_RESOLUTION: "the resolution the site runs: profiles.py (knob, load, stack_settings, stack_knobs: a profile's "
    "values and configs/stack.env with the environment over them, as Compose has it), cluster.py (knobs: "
    "configs/cluster.env and the environment) and device.current (POLARSTACK_DEVICE). test_site_reads.py confines "
    "knob, cluster.load and device.current to the site (and read_now's stated fallback); a Profile carries the "
    "settings it was loaded with (Profile.setting), which is how the layers below get them",
    FILES: "where this process and the tools it starts keep their files, not how the stack runs: the repository, the "
    "run dir and the cache (paths.py: POLARSTACK_ROOT, POLARSTACK_RUN_DIR, POLARSTACK_CACHE, XDG_CACHE_HOME, and "
    "whether the user named a tool's own home), the config home of Ray's token (XDG_CONFIG_HOME), the private Docker "
    "engine's data root (POLARSTACK_DOCKER_ROOT), and which copy of the CPU stack's state this process acts on "
    "(POLARSTACK_CPU_PROJECT: the Compose project and its run-state file, set by the docker demo and the docker test "
    "tier as POLARSTACK_RUN_DIR names the run dir)",
    CHILD: "the environment a child process gets: this one's copied or extended (processes.child_env without "
    "credentials, `docker info` against a given DOCKER_HOST, PATH with a venv's bin in front)",
    HOOK: "a variable that points a reader or a child command at another file or executable, which tests set to a "
    "fake (or a user to a local copy); each is documented where HOOKS says",
    IN_JOB: "code that runs where no CLI runs: the in-job gate (train/gate.py, imported by slime inside the Ray job: "
    "the smoke's knobs and the verifier's isolation as the job's runtime env carries them) and Polar's "
    "worker-discovery switch (polar/switch.py: the .pth hook that runs at every interpreter start-up in the trainer "
    "image, images/trainer/Dockerfile; `polarstack polar-switch status` reports the same read)",
    FOR_COMPOSE: "writes that set the environment for Compose's interpolation and for the settings' resolution that "
    "follows in this process (the CPU stack's defaults, the docker demo's own project and ports, the rehearsal's "
    "model for its `make up`, one rendering with given ports or DEVICE=cpu's values), and the reads that save what "
    "such a write replaces, to put it back",
    CREDENTIAL: "WANDB_API_KEY by name, never its value in a setting, file or message: tracker_for (on the host, when "
    "the plan is rendered) picks W&B over TensorBoard when it is set; compose.yaml passes the key itself to the "
    "trainer by name; the rehearsal's plan hash hides it while the plan is rendered (rehearsal_record)",
    VERIFIER_GUARD: "POLARSTACK_VERIFIER_PYTHON is the verifier bundle's own variable (reward/verifier/host.py, for "
    "`polarstack verify` on a host), not a setting of the stack: where the stack hands the verifier its environment "
    "(verifier_knobs.verifier_env) it refuses it set, because it would name this machine's interpreter inside the "
    "sandbox",
}
ALLOWED = {  # "path:function:what": (category, what it is)
    # site resolution
    "stack/profiles.py:knob:read key": (SITE_RESOLUTION, "a stack knob: the environment over configs/stack.env"),
    "stack/profiles.py:load:read key": (SITE_RESOLUTION, "a profile's values: the environment over the file"),
    "stack/profiles.py:load:read NODE_GPUS": (SITE_RESOLUTION, "the GPUs of this node the profile is checked against"),
    "stack/profiles.py:stack_settings:read key": (SITE_RESOLUTION, "configs/stack.env's knobs, ENVIRONMENT_KNOBS"),
    "stack/profiles.py:stack_knobs:read key": (SITE_RESOLUTION, "configs/stack.env's knobs, as Compose gets them"),
    "stack/cluster.py:knobs:read key": (SITE_RESOLUTION, "configs/cluster.env's knobs (cluster.load)"),
    "stack/device.py:current:read POLARSTACK_DEVICE": (SITE_RESOLUTION, "POLARSTACK_DEVICE (DEVICE=)"),
    # where files are
    "paths.py:repo_root:read POLARSTACK_ROOT": (FILES, "the repository root"),
    "paths.py:run_dir:read POLARSTACK_RUN_DIR": (FILES, "the run dir (.run)"),
    "paths.py:cache_dir:read POLARSTACK_CACHE": (FILES, "the download cache"),
    "paths.py:cache_dir:read XDG_CACHE_HOME": (FILES, "the download cache's default place"),
    "paths.py:tool_homes:read variable": (FILES, "whether the user named pip's, npm's, rustup's... own home"),
    "stack/ray_auth.py:default_path:read XDG_CONFIG_HOME": (FILES, "the default place of Ray's token file"),
    "stack/dockerd.py:daemon:read POLARSTACK_DOCKER_ROOT": (FILES, "the private Docker engine's data root"),
    "stack/device.py:_cpu_project:read POLARSTACK_CPU_PROJECT": (FILES, "the CPU stack's project and state file"),
    # a child's environment
    "processes.py:child_env:copy": (CHILD, "what every process the stack starts inherits, credentials removed"),
    "stack/dockerd.py:answers:copy": (CHILD, "`docker info` against the engine asked about"),
    "stack/ray_head.py:start:read PATH": (CHILD, "a harness Ray head's PATH, its venv's bin first"),
    "stack/ray_auth_probe.py:Clients.env:read PATH": (CHILD, "the probe's Ray clients' PATH, their venv's bin first"),
    "stack/ray_auth_probe.py:head_start_without_token:read PATH": (CHILD, "the tokenless head's PATH"),
    # test hooks
    "checks/nodes.py:Probe.gpus:read POLARSTACK_NVIDIA_SMI": (HOOK, "nvidia-smi"),
    "checks/nodes.py:Probe.host_memory_kib:read POLARSTACK_PROC_MEMINFO": (HOOK, "/proc/meminfo"),
    "train/memory.py:gpu_memory_mib:read POLARSTACK_NVIDIA_SMI": (HOOK, "nvidia-smi"),
    "train/memory.py:meminfo_kib:read POLARSTACK_PROC_MEMINFO": (HOOK, "/proc/meminfo"),
    "stack/host_check.py:userns_problems:read POLARSTACK_PROC_SYS": (HOOK, "/proc/sys"),
    "stack/compose.py:compose_command:read COMPOSE_BIN": (HOOK, "the Compose v2 binary"),
    "offline/rehearsal_keys.py:check:read POLARSTACK_SLIME_GIT": (HOOK, "a local clone of slime"),
    # in-job
    "train/gate.py:first_rollout_check:the environment": (IN_JOB, "the smoke's knobs (tool_exchange.knobs_from)"),
    "train/gate.py:verifier_opt_out:read verifier_knobs.ISOLATION": (IN_JOB, "the job's verifier isolation"),
    "polar/switch.py:discovery_enabled:read POLAR_WORKER_DISCOVERY": (IN_JOB, "POLAR_WORKER_DISCOVERY"),
    # written for Compose
    "stack/device.py:apply_cpu_defaults:setdefault key": (FOR_COMPOSE, "the CPU stack's ports (the site's device)"),
    "stack/device.py:apply_cpu_defaults:setdefault MODEL_PATH": (FOR_COMPOSE, "the tiny model's path"),
    "stack/device.py:apply_cpu_defaults:setdefault ENGINE_START_PERIOD": (FOR_COMPOSE, "the CPU engines' start"),
    "stack/device.py:apply_cpu_defaults:setdefault HEALTHCHECK_INTERVAL": (FOR_COMPOSE, "2 s checks on the CPU"),
    "stack/device.py:apply_cpu_defaults:setdefault MODEL_DIR": (FOR_COMPOSE, "the tiny model's host directory"),
    "checks/docker_demo.py:_environment:write device.DEVICE_ENV": (FOR_COMPOSE, "the demo's DEVICE=cpu"),
    "checks/docker_demo.py:_environment:write POLARSTACK_CPU_PROJECT": (FOR_COMPOSE, "the demo's own project"),
    "checks/docker_demo.py:_environment:setdefault key": (FOR_COMPOSE, "the demo's own ports"),
    "train/rehearsal_run.py:run:update plan.stack_env": (FOR_COMPOSE, "the small model for the rehearsal's `up`"),
    "train/rehearsal_run.py:seven_b_parts:update seven.stack_env": (FOR_COMPOSE, "the 7B for its parts' `up`"),
    "stack/ray_auth_probe.py:trainer_head_inputs:read key": (FOR_COMPOSE, "the ports it replaces, saved"),
    "stack/ray_auth_probe.py:trainer_head_inputs:update RAY_GCS_PORT,RAY_DASHBOARD_PORT": (FOR_COMPOSE, "free ports"),
    "stack/ray_auth_probe.py:trainer_head_inputs:pop key": (FOR_COMPOSE, "put back"),
    "stack/ray_auth_probe.py:trainer_head_inputs:write key": (FOR_COMPOSE, "put back"),
    "offline/ray_auth_facts.py:_cpu_environment:read key": (FOR_COMPOSE, "DEVICE=cpu's values it replaces, saved"),
    "offline/ray_auth_facts.py:_cpu_environment:update changes": (FOR_COMPOSE, "DEVICE=cpu's rendering"),
    "offline/ray_auth_facts.py:_cpu_environment:pop key": (FOR_COMPOSE, "put back"),
    "offline/ray_auth_facts.py:_cpu_environment:write key": (FOR_COMPOSE, "put back"),
    # a credential named
    "train/tracker.py:tracker_for:the environment": (CREDENTIAL, "WANDB_API_KEY set or not"),
    "train/rehearsal_record.py:_without_tracker_key:pop WANDB_KEY_ENV": (CREDENTIAL, "hidden while hashing"),
    "train/rehearsal_record.py:_without_tracker_key:write WANDB_KEY_ENV": (CREDENTIAL, "put back"),
    # the verifier's own variable
    "stack/verifier_knobs.py:verifier_env:read POLARSTACK_VERIFIER_PYTHON": (VERIFIER_GUARD, "refused when set"),
}
HOOKS = {  # a test hook's variable: the file that documents it as one
    "POLARSTACK_NVIDIA_SMI": "scripts/polarstack/train/memory.py",
    "POLARSTACK_PROC_MEMINFO": "scripts/polarstack/train/memory.py",
    "POLARSTACK_PROC_SYS": "scripts/polarstack/stack/host_check.py",
    "COMPOSE_BIN": "scripts/polarstack/stack/compose.py",
    "POLARSTACK_SLIME_GIT": "docs/preflight.md",
}

READ_METHODS = {"get": "read", "setdefault": "setdefault", "pop": "pop", "popitem": "pop", "clear": "clear"}
COPY_METHODS = {"items", "keys", "values", "copy"}


def _constants(tree: ast.Module) -> dict[str, str]:
    """The module's NAME = "text" constants, to name a variable by its value."""
    out = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    out[target.id] = node.value.value
    return out


def _key(node: ast.expr | None, constants: dict[str, str]) -> str:
    if node is None:
        return ""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.Name) and node.id in constants:
        return constants[node.id]  # a module constant naming the variable (PROC_SYS_ENV = "POLARSTACK_PROC_SYS")
    return ast.unparse(node)


def environment_accesses(path: Path, rel: str) -> list[str]:
    """Every access to the environment in `path`, as "rel:enclosing function:what"."""
    tree = ast.parse(path.read_text(), filename=str(path))
    constants = _constants(tree)
    os_names: set[str] = set()  # `import os`, `import os as o`
    environ_names: set[str] = set()  # `from os import environ [as e]`
    functions: dict[str, str] = {}  # `from os import getenv [as g]` (putenv, unsetenv): local name -> function
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            os_names |= {a.asname or a.name for a in node.names if a.name == "os"}
        elif isinstance(node, ast.ImportFrom) and node.module == "os":
            for alias in node.names:
                if alias.name in ("environ", "environb"):
                    environ_names.add(alias.asname or alias.name)
                elif alias.name in ("getenv", "getenvb", "putenv", "unsetenv"):
                    functions[alias.asname or alias.name] = alias.name
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}

    def is_environ(node: ast.AST) -> bool:
        if isinstance(node, ast.Attribute) and node.attr in ("environ", "environb"):
            return isinstance(node.value, ast.Name) and node.value.id in os_names
        return isinstance(node, ast.Name) and node.id in environ_names

    def os_function(call: ast.Call) -> str | None:
        func = call.func
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id in os_names:
            return func.attr if func.attr in ("getenv", "getenvb", "putenv", "unsetenv") else None
        return functions.get(func.id) if isinstance(func, ast.Name) else None

    def what(node: ast.AST) -> str:
        """What the access to the environment `node` does, from where it stands."""
        parent = parents.get(node)
        if isinstance(parent, ast.Attribute) and isinstance(parents.get(parent), ast.Call):
            call = parents[parent]
            method = parent.attr
            if method in READ_METHODS:
                return f"{READ_METHODS[method]} {_key(call.args[0] if call.args else None, constants)}".strip()
            if method == "update":
                names = ",".join(k.arg for k in call.keywords if k.arg)
                return f"update {names or _key(call.args[0] if call.args else None, constants)}"
            if method in COPY_METHODS:
                return "copy"
            return f"use {method}"
        if isinstance(parent, ast.Subscript) and parent.value is node:
            op = {ast.Store: "write", ast.Del: "del"}.get(type(parent.ctx), "read")
            return f"{op} {_key(parent.slice, constants)}"
        if isinstance(parent, ast.Compare) and node in parent.comparators:
            return f"read {_key(parent.left, constants)}"  # `K in os.environ`
        if isinstance(parent, ast.Dict) and node in parent.values and None in parent.keys:
            return "copy"  # {**os.environ}
        if isinstance(parent, ast.Call) and isinstance(parent.func, ast.Name) and parent.func.id == "dict":
            return "copy"  # dict(os.environ)
        return "the environment"  # handed on whole (an argument, a name)

    found: list[str] = []

    def visit(node: ast.AST, where: str) -> None:
        for child in ast.iter_child_nodes(node):
            inner = where
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                inner = f"{where}.{child.name}" if where else child.name
            if is_environ(child):
                found.append(f"{rel}:{where or '<module>'}:{what(child)}")
            elif isinstance(child, ast.Call) and os_function(child):
                function = os_function(child)
                op = {"putenv": "write", "unsetenv": "del"}.get(function or "", "read")
                found.append(
                    f"{rel}:{where or '<module>'}:{op} {_key(child.args[0] if child.args else None, constants)}"
                )
            visit(child, inner)

    visit(tree, "")
    return found


def excepted(rel: str) -> bool:
    return rel.startswith(SITE) or any(
        rel.startswith(path) if path.endswith("/") else rel == path for path in EXCEPTIONS
    )


def package_accesses(package: Path) -> list[str]:
    out = []
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package).as_posix()
        if not excepted(rel):
            out += environment_accesses(path, rel)
    return out


def test_below_cli_the_environment_is_read_only_as_stated():
    unstated = sorted(set(package_accesses(PACKAGE)) - set(ALLOWED))
    assert not unstated, (
        "a stack setting read below cli/: take it from the caller (the site, a Profile's settings, an options "
        "object the CLI builds), or state why it is none (ALLOWED, CATEGORIES):\n" + "\n".join(unstated)
    )


def test_every_allowed_access_still_exists_so_the_set_only_shrinks():
    stale = sorted(set(ALLOWED) - set(package_accesses(PACKAGE)))
    assert not stale, "these accesses are gone: remove them from ALLOWED:\n" + "\n".join(stale)


def test_every_category_is_stated_once_and_used():
    used = {category for category, _ in ALLOWED.values()}
    assert used == set(CATEGORIES), (sorted(used - set(CATEGORIES)), sorted(set(CATEGORIES) - used))
    assert all(why.strip() for _, why in ALLOWED.values())


def test_every_test_hook_is_documented_as_one_and_every_exception_is_a_path():
    hooks = {entry.rsplit(":", 1)[1].split(" ", 1)[1] for entry, (category, _) in ALLOWED.items() if category == HOOK}
    assert hooks == set(HOOKS), hooks ^ set(HOOKS)
    for variable, where in HOOKS.items():
        assert variable in (ROOT / where).read_text(), f"{variable} is not documented in {where}"
    for path in EXCEPTIONS:
        assert (PACKAGE / path).exists(), path


def test_a_planted_access_is_caught_in_each_form(tmp_path):
    (tmp_path / "stack").mkdir()
    (tmp_path / "stack" / "planted.py").write_text(
        "import os\n"
        "import os as o\n"
        "from os import environ as env, getenv\n\n"
        'KNOB_ENV = "POLARSTACK_PLANTED"\n'
        'HOME = os.environ.get("HOME")\n\n'
        "def reads():\n"
        '    a = os.environ["A"]\n'
        '    b = os.getenv("B")\n'
        '    c = "C" in os.environ\n'
        "    d = env.get(KNOB_ENV)\n"
        '    e = getenv("E")\n'
        '    f = o.environ.get("F")\n'
        "    return a, b, c, d, e, f\n\n"
        "class Writes:\n"
        "    def apply(self):\n"
        '        os.environ["G"] = "1"\n'
        '        os.environ.setdefault("H", "2")\n'
        "        os.environ.update(I='3')\n"
        '        os.environ.pop("J", None)\n'
        '        del os.environ["K"]\n'
        '        os.putenv("L", "4")\n\n'
        "def copies():\n"
        "    return {**os.environ}, dict(os.environ), os.environ.copy(), [k for k, v in os.environ.items()]\n\n"
        "def handed_on(run):\n"
        "    return run(os.environ)\n"
    )
    (tmp_path / "cli").mkdir()
    (tmp_path / "cli" / "site.py").write_text('import os\nDEVICE = os.environ.get("POLARSTACK_DEVICE")\n')
    (tmp_path / "reward" / "verifier").mkdir(parents=True)
    (tmp_path / "reward" / "verifier" / "limits.py").write_text('import os\nMODE = os.environ.get("X")\n')
    assert package_accesses(tmp_path) == [
        "stack/planted.py:<module>:read HOME",
        "stack/planted.py:reads:read A",
        "stack/planted.py:reads:read B",
        "stack/planted.py:reads:read C",
        "stack/planted.py:reads:read POLARSTACK_PLANTED",
        "stack/planted.py:reads:read E",
        "stack/planted.py:reads:read F",
        "stack/planted.py:Writes.apply:write G",
        "stack/planted.py:Writes.apply:setdefault H",
        "stack/planted.py:Writes.apply:update I",
        "stack/planted.py:Writes.apply:pop J",
        "stack/planted.py:Writes.apply:del K",
        "stack/planted.py:Writes.apply:write L",
        "stack/planted.py:copies:copy",
        "stack/planted.py:copies:copy",
        "stack/planted.py:copies:copy",
        "stack/planted.py:copies:copy",
        "stack/planted.py:handed_on:the environment",
    ]  # cli/ is the site and reward/verifier/ a stated exception: neither is scanned
