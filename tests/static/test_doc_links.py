"""Every relative Markdown link of the README, docs/ and the folders' READMEs leads somewhere (issue 35 point 6): the
README points at docs/ for each measurement table and each long explanation, so a moved file or a renamed heading
must fail here, not leave a dead link. An anchor is checked against the target's headings, slugged as GitHub does
(lower case, punctuation dropped, spaces as hyphens)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.static

ROOT = Path(__file__).resolve().parents[2]
FENCED = re.compile(r"^```.*?^```", re.M | re.S)
LINK = re.compile(r"\]\(([^)\s]+)\)")


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "scripts").rglob("README.md"))]


def slug(heading: str) -> str:
    return re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", "")).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    prose = FENCED.sub("", page.read_text(encoding="utf-8"))
    return {slug(m.group(1)) for m in re.finditer(r"^#+ (.*)$", prose, re.M)}


def test_slugs_follow_github():
    assert slug("Two nodes on one machine (the local runtime at NODES>1)") == (
        "two-nodes-on-one-machine-the-local-runtime-at-nodes1"
    )
    assert slug("The verifier's sandbox") == "the-verifiers-sandbox"


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page):
    dead = []
    for match in LINK.finditer(FENCED.sub("", page.read_text(encoding="utf-8"))):
        link = match.group(1)
        if re.match(r"[a-z]+:", link):  # https:, mailto:
            continue
        path, _, anchor = link.partition("#")
        target = (page.parent / path) if path else page
        if not target.exists():
            dead.append(f"{link} (no such file)")
        elif anchor and target.suffix == ".md" and anchor not in anchors(target):
            dead.append(f"{link} (no heading #{anchor} in {target.relative_to(ROOT)})")
    assert not dead, f"{page.relative_to(ROOT)}: " + "; ".join(dead)


def test_the_readme_links_each_measurement_page():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("## Measurements") :].split("\n## ", 1)[0]
    linked = {m.group(1).partition("#")[0] for m in LINK.finditer(section)}
    for page in ("docs/test-times.md", "docs/cpu-engines.md", "docs/docker-cpu.md", "docs/benchmarks.md"):
        assert page in linked, f"README's Measurements section does not link {page}"
