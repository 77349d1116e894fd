"""One check of `make verify-offline`: its name, whether it holds, and the problems it found."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Check:
    name: str
    ok: bool
    detail: str = ""
    problems: list[str] = field(default_factory=list)
