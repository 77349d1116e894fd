"""polarstack.train.image_facts: the trainer image's Polar and slime's router checked at build time.

The installed packages are stand-ins written into a temporary directory on sys.path (Polar and slime's router are
not installable here: GitHub only); the command runs through the CLI's main, as the Dockerfile's RUN step runs it.
"""

from __future__ import annotations

import json
import sys

import pytest

from polarstack.cli import main as cli_main
from polarstack.errors import ExitCode, StackError
from polarstack.train import image_facts

pytestmark = pytest.mark.unit
RECORD = image_facts.polar_record()
SWITCHES = [RECORD[key] for key in image_facts.SWITCH_KEYS]


def _polar_source(names):
    # Shaped as the record says Polar's runtime reads its switches: env names and option literals in its source.
    lines = [f"def _truthy_{i}(env):\n    return env.get({name!r}) in ('1', 'true')\n" for i, name in enumerate(names)]
    return "".join(lines)


def _install(tmp_path, monkeypatch, *, polar_names=None, router_field=True, router=True):
    site = tmp_path / "site"
    if polar_names is not None:
        runtime = site / "polar" / "runtime"
        runtime.mkdir(parents=True)
        (site / "polar" / "__init__.py").write_text("raise RuntimeError('image_facts must not import Polar')\n")
        (runtime / "apptainer.py").write_text(_polar_source(polar_names))
    if router:
        (site / "sglang_router").mkdir(parents=True)
        (site / "sglang_router" / "__init__.py").write_text("raise RuntimeError('nor the router')\n")
        field = "    prometheus_host: Optional[str] = None\n" if router_field else ""
        (site / "sglang_router" / "router_args.py").write_text(
            "from typing import Optional\n\nclass RouterArgs:\n    host: str = '127.0.0.1'\n" + field
        )
    monkeypatch.syspath_prepend(str(site))
    for name in ("polar", "sglang_router"):
        monkeypatch.delitem(sys.modules, name, raising=False)


def test_a_polar_and_router_as_recorded_pass_and_name_the_checked_file(tmp_path, monkeypatch, capsys):
    _install(tmp_path, monkeypatch, polar_names=SWITCHES + list(image_facts.POLAR_OPTIONS))
    assert cli_main.main(["image-facts", "--stage", "upstream", "--json"]) == 0
    facts = json.loads(capsys.readouterr().out)["facts"]
    assert "sha256" in facts[0] and str(tmp_path) in facts[0] and all(name in facts[0] for name in SWITCHES)
    assert "RouterArgs.prometheus_host" in facts[1]


@pytest.mark.parametrize("dropped", SWITCHES + list(image_facts.POLAR_OPTIONS))
def test_a_polar_that_never_names_one_switch_or_option_fails_the_build_naming_it(
    tmp_path, monkeypatch, capsys, dropped
):
    names = [n for n in SWITCHES + list(image_facts.POLAR_OPTIONS) if n != dropped]
    _install(tmp_path, monkeypatch, polar_names=names)
    assert cli_main.main(["image-facts", "--stage", "upstream"]) == ExitCode.ENVIRONMENT
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"never names {dropped}," in err[0] and "Traceback" not in err[0]


def test_a_router_without_prometheus_host_fails_the_build(tmp_path, monkeypatch, capsys):
    _install(tmp_path, monkeypatch, polar_names=SWITCHES + list(image_facts.POLAR_OPTIONS), router_field=False)
    assert cli_main.main(["image-facts", "--stage", "upstream"]) == ExitCode.ENVIRONMENT
    assert "RouterArgs has no prometheus_host" in capsys.readouterr().err


def test_an_image_without_polar_fails_naming_the_stage_to_build(tmp_path, monkeypatch):
    _install(tmp_path, monkeypatch, polar_names=None)
    monkeypatch.setattr(image_facts.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(StackError) as caught:
        image_facts.check("upstream")
    assert caught.value.code == ExitCode.ENVIRONMENT and "UPSTREAM_STAGE=upstream" in caught.value.message


def test_the_cpu_stage_skips_by_name_and_an_unknown_stage_is_usage():
    (line,) = image_facts.check("base")
    assert line.startswith("skipped on DEVICE=cpu")
    with pytest.raises(StackError) as caught:
        image_facts.check("gpu")
    assert caught.value.code == ExitCode.USAGE


def test_router_problems_reads_the_class_not_any_mention():
    assert image_facts.router_problems("prometheus_host = None\n") == ["it defines no RouterArgs"]
    assert image_facts.router_problems("class RouterArgs:\n    def f(self):\n        prometheus_host = 1\n")
