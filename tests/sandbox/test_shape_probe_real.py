"""Issue 32 point 3 with the real verifier: `make up`'s probe (polarstack.checks.shape_probe) in the namespace shape of
Polar's sessions (root in a user namespace mapping only uid 0, its own mount namespace: `unshare --user --map-root-user
--mount --fork`), isolation on, gives real verdicts: PASSED for HumanEval/0's canonical answer, FAILED for a wrong one.

This expects the verifier that isolates in that shape (issue 32 point 1, branch vshape). Before it, the verifier refuses
there (`FAILED probe (not verified)`, exit 8) and this test fails with the probe's refusal: that refusal is what
`make up` prints on such a host.
"""

from __future__ import annotations

import shutil

import pytest

from polarstack.checks import shape_probe
from polarstack.errors import StackError

pytestmark = [
    pytest.mark.sandbox,
    pytest.mark.skipif(shutil.which("unshare") is None, reason="needs unshare (util-linux) on this host"),
]


def test_the_real_verifier_gives_real_verdicts_in_polars_namespace_shape(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("POLARSTACK_RUN_DIR", str(tmp_path / "run"))
    monkeypatch.delenv("POLARSTACK_VERIFIER_ISOLATION", raising=False)
    try:
        shape_probe.check_local()
    except StackError as exc:
        pytest.fail(f"exit {int(exc.code)}: {exc.message}")
    err = capsys.readouterr().err
    assert "(uid_map 0 0 1): PASSED probe for the canonical HumanEval/0, FAILED for a wrong one" in err
    assert "POLARSTACK_VERIFIER_ISOLATION=none is active" not in err
