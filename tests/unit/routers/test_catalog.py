"""Pins the split of the router catalog from the router installer/harness (issue 14 point 3): reading a profile,
including the router release it names, imports no process, lock or HTTP machinery. A test of the structure,
not of behaviour; the catalog's answers themselves are pinned by tests/unit/routers/test_harness.py."""

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.unit

# What polarstack.routers.harness (the installer and harness) needs and a profile reader must not pull in.
HEAVY = ("subprocess", "fcntl", "httpx", "polarstack.routers.harness", "polarstack.processes")


def test_reading_a_profile_imports_no_installer_or_http():
    code = (
        "import json, sys\n"
        "from polarstack.stack import profiles\n"
        "release = profiles.load('stock-router').router\n"
        "assert release is not None and release.has_worker_api\n"
        f"print(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))\n"
    )
    # A fresh interpreter: this test process has imported them all already.
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == []
