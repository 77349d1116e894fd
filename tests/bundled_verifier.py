"""The verifier file the sandbox tests run, written as polarstack.reward.tasks writes it (verifier.bundle), once per
test process, into a folder of pytest's own tmp_path_factory (tests/conftest.py hands it over): pytest keeps
its last few base folders and removes older ones, so nothing is left in the temporary directory (issue 34; a
`mkdtemp` at import left one `polarstack-verifier-*` folder per test worker, never removed).

`VERIFIER` is a path (os.PathLike, and str() gives the path) that is written on first use, during a test."""

from __future__ import annotations

import os
from pathlib import Path

from polarstack.reward.verifier import bundle


class _Bundled(os.PathLike):
    def __init__(self) -> None:
        self.factory = None  # pytest's TempPathFactory, set by tests/conftest.py
        self._path: Path | None = None

    def __fspath__(self) -> str:
        if self._path is None:
            if self.factory is None:
                raise RuntimeError("the bundled verifier is written during a test (tests/conftest.py)")
            self._path = bundle.write(self.factory.mktemp("verifier") / "verifier.py")
        return str(self._path)

    __str__ = __fspath__


VERIFIER = _Bundled()
