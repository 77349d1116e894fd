"""Everything a test tier installs, installed before pytest starts (issue 34 point 1): `make test-deps` runs this file.

A session fixture that pip-installs under pytest's per-test timeout (300 s) did not fit on a loaded machine: Ray's
install took 130 s quiet and more than 300 s at load 10. `make test` and `make test-cluster` (and so `.ci/run`) run
`make test-deps` first, with a line per step and a heartbeat while a step runs; the fixtures then find each install
done (every installer takes its file lock and returns at once when its marker exists). Run on its own:

    .venv/bin/python tests/tier_deps.py [test] [cluster]

Tiers: `test` (what `make test` needs: the pinned Ray in the long cache path of the `ray_bin` fixture, every router
release a test starts, the pin-check wheels of `make verify-offline`, the sglang source files of the emulator's
protocol, and the real-engine tier's tiny model when the pinned sglang is installed), `cluster` (the pinned Ray in
the cache itself, as the cluster tier's nodes run it, and the profiles' routers). The real-engine tier's sglang (about 4.8 GB) stays `polarstack sglang-install`, which `.ci/run` runs.
"""

from __future__ import annotations

import os
import re
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE.parent / "scripts") not in sys.path:  # run as a script from a checkout without the package installed
    sys.path.insert(0, str(HERE.parent / "scripts"))

from polarstack import paths  # noqa: E402
from polarstack.engine import protocol  # noqa: E402
from polarstack.errors import ExitCode, StackError  # noqa: E402
from polarstack.offline import verify  # noqa: E402
from polarstack.routers import catalog, harness  # noqa: E402
from polarstack.stack import profiles, ray_head, real_sglang  # noqa: E402

# The Ray head's command lines carry the interpreter and script paths of its venv under the cache; a researcher's
# cache may sit far deeper than /root/.cache (issue 17: a 160-character cut once hid `dashboard.py`).
LONG_CACHE_CHARS = 120
# A line every this many seconds while a step runs (Ray's install is silent for minutes when cold).
HEARTBEAT_SECONDS = 20.0
ROUTER_PROFILES = ("router-passthrough", "patched-router", "stock-router")
_SPEC = re.compile(r"\b((?:smg|sglang-router)==\d+(?:\.\d+)+)\b")


def long_cache_path(cache: Path, chars: int = LONG_CACHE_CHARS) -> Path:
    """A folder under `cache` whose path is at least `chars` characters long: padded up to `chars` when the cache
    path is short, one padding character past it when the cache itself is already that deep (a long HOME, issue 27
    point 8), so the test's path never depends on the length of HOME or POLARSTACK_CACHE."""
    base = str(cache / "long-cache-path-")
    return Path(base + "x" * max(chars - len(base), 1))


@contextmanager
def cache_at(path: Path) -> Iterator[None]:
    """POLARSTACK_CACHE=path while the body runs (what the ray_bin fixture sets around its install)."""
    before = os.environ.get("POLARSTACK_CACHE")
    os.environ["POLARSTACK_CACHE"] = str(path)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("POLARSTACK_CACHE", None)
        else:
            os.environ["POLARSTACK_CACHE"] = before


def install_ray_long() -> Path:
    """The pinned Ray as the `ray_bin` fixture uses it: under long_cache_path(the cache)."""
    with cache_at(long_cache_path(paths.cache_dir())):
        return ray_head.install()[0]


def install_ray() -> Path:
    """The pinned Ray under the cache itself (the cluster tier's nodes, the local runtime at NODES>1)."""
    return ray_head.install()[0]


def profile_releases() -> list[catalog.RouterRelease]:
    return [profiles.load(name).router for name in ROUTER_PROFILES]


# The folders whose tests start real routers (tests/unit only parses release names).
STARTS_ROUTERS = ("integration", "sglang")


def tier_releases(root: Path = HERE) -> list[catalog.RouterRelease]:
    """Every router release a test that starts routers names (`smg==X`, `sglang-router==X` in STARTS_ROUTERS) that
    exists on the index (catalog.MEASURED: tests also name made-up ones, to be refused), and the profiles' pins."""
    found = {(r.package, r.version): r for r in profile_releases()}
    for path in sorted(p for folder in STARTS_ROUTERS for p in (root / folder).rglob("*.py")):
        for spec in _SPEC.findall(path.read_text(errors="replace")):
            release = catalog.RouterRelease.parse(spec)
            if release.measured:
                found.setdefault((release.package, release.version), release)
    return sorted(found.values(), key=lambda r: (r.package, catalog.version_tuple(r.version)))


def _downloaded(requirement: str) -> bool:
    """A wheel of `requirement` (name[extras]==version) is in the pin-check folder already."""
    match = re.fullmatch(r"([A-Za-z0-9_.-]+)(?:\[[^\]]*\])?==([^;\s]+)", requirement.strip())
    if not match:
        return False
    name = re.sub(r"[-_.]+", "_", match.group(1)).lower()
    folder = paths.cache_dir() / "pin-check"
    return any(
        re.sub(r"[-_.]+", "_", wheel.name.split("-", 1)[0]).lower() == name
        and wheel.name.split("-")[1:2] == [match.group(2)]
        for wheel in folder.glob("*.whl")
    )


def fetch_pin_wheels() -> None:
    """The wheels `make verify-offline` (and test_verify_offline.py) resolve, into its one pin-check folder (under
    verify.check_pin's lock); one already there is not asked for again."""
    failed = []
    for requirement, python, _why in verify.pin_requirements():
        if _downloaded(requirement):
            continue
        ok, detail = verify.check_pin(requirement, python)
        if not ok:
            failed.append(f"{requirement}: {detail}")
    if failed:
        raise StackError(
            "could not download the pin-check wheels (" + "; ".join(failed) + "); check that PyPI is reachable.",
            ExitCode.ENVIRONMENT,
        )


def steps(tiers: list[str]) -> list[tuple[str, Callable[[], object]]]:
    """(what, how) for every install the tiers need, in order; each is idempotent and takes its own lock."""
    out: list[tuple[str, Callable[[], object]]] = []
    ray = ray_head.venv_dir().name
    if "test" in tiers:
        out.append((f"{ray} under the long cache path (ray_bin)", install_ray_long))
        releases = tier_releases()
    else:
        releases = profile_releases()
    if "cluster" in tiers:
        out.append((f"{ray} under the cache (cluster tier)", install_ray))
    for release in releases:
        out.append((release.spec, lambda release=release: harness.install(release)))
    if "test" in tiers:
        out.append(("the pin-check wheels (verify-offline)", fetch_pin_wheels))
        out.append(("the sglang source files of the emulator's protocol", protocol.source_dir))
        if real_sglang.is_installed():  # the real-engine tier's tiny random model (the tier skips without the install)
            out.append(("the real-engine tier's tiny model", lambda: real_sglang.build_model(progress=lambda m: None)))
    return out


def run(tiers: list[str], say: Callable[[str], None] = lambda m: print(m, file=sys.stderr, flush=True)) -> float:
    todo = steps(tiers)
    began = time.monotonic()
    for index, (what, how) in enumerate(todo, 1):
        started = time.monotonic()
        say(f"test-deps [{index}/{len(todo)}] {what} ...")
        done = threading.Event()

        def beat(what=what, started=started, done=done) -> None:
            while not done.wait(HEARTBEAT_SECONDS):
                say(f"test-deps     still at {what} ({time.monotonic() - started:.0f} s)")

        ticker = threading.Thread(target=beat, daemon=True)
        ticker.start()
        try:
            how()
        finally:
            done.set()
            ticker.join()
        say(f"test-deps [{index}/{len(todo)}] {what}: ready ({time.monotonic() - started:.0f} s)")
    return time.monotonic() - began


TIERS = ("test", "cluster")


def main(argv: list[str]) -> int:
    tiers = argv or ["test"]
    unknown = [t for t in tiers if t not in TIERS]
    if unknown:
        print(f"test-deps: unknown tier {unknown[0]!r}; name one of {', '.join(TIERS)}", file=sys.stderr)
        return 2
    try:
        seconds = run(tiers)
    except StackError as exc:
        print(f"test-deps: {exc.message}", file=sys.stderr)
        return int(exc.code)
    print(
        f"test-deps: everything the {' and '.join(tiers)} tier(s) install is ready ({seconds:.0f} s)", file=sys.stderr
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
