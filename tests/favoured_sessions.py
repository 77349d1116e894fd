"""Favour the sessions a command starts while it runs (the cluster tier's `polarstack up` on each node): their Ray
processes start in sessions of their own (polarstack.stack.ray_node.spawn), where the kernel's autogroup gives each
one share however busy the machine; the pinned ray's fixed start-up waits (docs/tests.md) then expire under load as
the harness's own heads' did. A thread looks every 0.2 s for processes descending from this one whose session is new
and gives that session `nice` (polarstack.processes.favour_session) once; `ray start` takes seconds to import before
it starts a server, so its session is favoured before its servers exist. The product is unchanged: only the tests'
machine share of what they start."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from pathlib import Path

from polarstack.processes import favour_session


def _stat(pid: str) -> tuple[int, int] | None:
    """(parent pid, session id) of `pid`, None when it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()
    return int(fields[1]), int(fields[3])


def new_sessions(root: int, known: set[int]) -> dict[int, int]:
    """Session id -> one member pid, for the sessions of `root`'s descendants not in `known`."""
    stats = {int(p): s for p in os.listdir("/proc") if p.isdigit() and (s := _stat(p)) is not None}
    found: dict[int, int] = {}
    for pid, (_, session) in stats.items():
        if session in known or session in found:
            continue
        ancestor, hops = pid, 0
        while ancestor > 1 and ancestor != root and hops < 64:
            ancestor, hops = stats.get(ancestor, (0, 0))[0], hops + 1
        if ancestor == root:
            found[session] = pid
    return found


@contextlib.contextmanager
def favoured_new_sessions(nice: int) -> Iterator[set[int]]:
    """While the body runs, favour each new session of this process's descendants; yields the sessions favoured."""
    root = os.getpid()
    known = {os.getsid(0)}
    favoured: set[int] = set()
    done = threading.Event()

    def watch() -> None:
        while not done.wait(0.2):
            for session, pid in new_sessions(root, known | favoured).items():
                if favour_session(pid, nice):
                    favoured.add(session)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    try:
        yield favoured
    finally:
        done.set()
        thread.join()
