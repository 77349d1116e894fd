"""Child processes a test signals start with SIGHUP, SIGINT and SIGTERM at their defaults (issue 34 point 4).

A process inherits a signal its parent ignored: under `nohup` (SIGHUP), as a background job of a non-interactive shell
(SIGINT), or from a launcher that ignores SIGTERM, the test's child ignores the signal the test then sends, and a
bash child can neither trap nor reset a signal that was ignored when it started (bash(1), SIGNALS: "Signals ignored
upon entry to the shell cannot be trapped or reset"). So `trap - HUP INT TERM` in the child cannot help: the child
must be started with the dispositions reset, which `preexec_fn=default_signals` does between fork and exec
(dispositions set to SIG_DFL survive exec; the three are unblocked too, as a blocked mask survives exec as well).
`defaults_here()` does the same in this process, for tests that signal pytest itself (and restores them after).
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator

SIGNALS = (signal.SIGHUP, signal.SIGINT, signal.SIGTERM)


def default_signals() -> None:
    """preexec_fn for subprocess.Popen / run: SIGHUP, SIGINT and SIGTERM at SIG_DFL and unblocked in the child."""
    for sig in SIGNALS:
        signal.signal(sig, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, SIGNALS)


@contextlib.contextmanager
def defaults_here(*signals: signal.Signals) -> Iterator[None]:
    """`signals` (default: the three) at SIG_DFL in this process while the body runs, then as they were: SIGINT keeps
    Python's KeyboardInterrupt handler when pytest has it (its default when not inherited as ignored)."""
    chosen = signals or SIGNALS
    before = {sig: signal.getsignal(sig) for sig in chosen}
    for sig in chosen:
        if before[sig] is signal.SIG_IGN:
            signal.signal(sig, signal.default_int_handler if sig == signal.SIGINT else signal.SIG_DFL)
    try:
        yield
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
