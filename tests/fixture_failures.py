"""A pytest plugin (loaded by tests/conftest.py): a shared fixture that failed to start is reported once, in full.

pytest keeps the exception a session- or module-scoped fixture raised and raises it again in the setup of every
later test that asks for it: one stand-in engine that did not start in time became 20 errors, each with the same
traceback (issue 34 point 2). Here the first test keeps the whole report (the fixture's own message names its log);
every later test whose setup raised that same exception gets one line pointing at the first one.
"""

from __future__ import annotations

import pytest

# id(exception) -> (the exception, kept so that its id is not reused; the first test's node id; its first line)
_FIRST: dict[int, tuple[BaseException, str, str]] = {}


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:200]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if call.when != "setup" or call.excinfo is None or report.skipped:
        return
    exc = call.excinfo.value
    seen = _FIRST.get(id(exc))
    if seen is None or seen[0] is not exc:
        _FIRST[id(exc)] = (exc, item.nodeid, _first_line(exc))
        return
    report.longrepr = f"a shared fixture failed to start, first in {seen[1]} (see that error): {seen[2]}"
