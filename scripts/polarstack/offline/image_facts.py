"""verify-offline: the trainer image's build-time check of its own upstream code (polarstack.train.image_facts).

Checks its meaning, not only that it is there: images/trainer/Dockerfile's final stage runs `polarstack image-facts
--stage "${UPSTREAM_STAGE}"` after Polar's switch is installed; a stand-in of Polar's apptainer runtime that names
every switch and option of configs/upstream/polar-apptainer.json passes, and one without any single one of them is
refused naming it; a RouterArgs with prometheus_host passes and one without it (sglang-router 0.1.4's, as
configs/upstream/router-prometheus-host.json records) is refused.
"""

from __future__ import annotations

import re

from polarstack.offline.check import Check
from polarstack.pins import repo_root
from polarstack.train import image_facts

DOCKERFILE = repo_root() / "images" / "trainer" / "Dockerfile"
STEP = 'polarstack image-facts --stage "${UPSTREAM_STAGE}"'


def _polar_standin(names: list[str]) -> str:
    return "OPTIONS = [\n" + "".join(f"    {name!r},\n" for name in names) + "]\n"


def _router_standin(field: bool) -> str:
    extra = "    prometheus_host: str | None = None\n" if field else ""
    return f"class RouterArgs:\n    host: str = '127.0.0.1'\n{extra}"


def problems() -> list[str]:
    found = []
    text = DOCKERFILE.read_text()
    final = text[text.index("AS trainer") :] if "AS trainer" in text else ""
    switch = final.find("polar-switch install")
    if STEP not in final or switch < 0 or final.index(STEP) < switch:
        found.append(f"images/trainer/Dockerfile's final stage does not run `{STEP}` after the switch is installed")
    record = image_facts.polar_record()
    names = [record[key] for key in image_facts.SWITCH_KEYS] + list(image_facts.POLAR_OPTIONS)
    if image_facts.polar_problems(_polar_standin(names), record):
        found.append("image_facts refuses a Polar runtime that names every recorded switch and option")
    for name in names:
        if image_facts.polar_problems(_polar_standin([n for n in names if n != name]), record) != [name]:
            found.append(f"image_facts does not refuse a Polar runtime that never names {name}")
    if image_facts.router_problems(_router_standin(True)) or not image_facts.router_problems(_router_standin(False)):
        found.append("image_facts does not tell a RouterArgs with prometheus_host from one without")
    if not re.search(r"UPSTREAM_STAGE=base", text):
        found.append("images/trainer/Dockerfile no longer names UPSTREAM_STAGE=base, the stage image_facts skips")
    return found


def check() -> Check:
    found = problems()
    return Check(
        "the trainer image checks its Polar and slime's router against configs/upstream at build time",
        not found,
        f"{len(image_facts.SWITCH_KEYS)} switches, {len(image_facts.POLAR_OPTIONS)} options, RouterArgs.prometheus_host",
        found,
    )
