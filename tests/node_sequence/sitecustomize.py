"""Imported by every Python that tests/unit/cli/test_node_sequence.py starts through `make` (this folder is on its
PYTHONPATH), and only there: what the fake node (tests/fake_node.py: docker, Compose, nvidia-smi as shell scripts) cannot
answer, because it runs no engine and no job. With POLARSTACK_FAKE_NODE_SEQUENCE=1:
- the smoke gate on the host (`make train`'s) gets a passing report, as an engine that returns Polar's token fields
  would give (the smoke itself is tested against the emulator and the real sglang elsewhere);
- `make preflight`'s node (polarstack.train.rehearsal_run.Node) is tests/rehearsal_fakes.FakeNode: the trainer as the
  two jobs would leave it (slime's log lines, the gate's rollouts.jsonl, weight versions, the checkpoint tracker).
Everything else each step does (run state, asset and GPU checks, Compose calls, the rehearsal record) runs as written."""

import os

if os.environ.get("POLARSTACK_FAKE_NODE_SEQUENCE") == "1":
    from types import SimpleNamespace

    import rehearsal_fakes
    from polarstack.checks import smoke
    from polarstack.errors import ExitCode
    from polarstack.train import rehearsal_run

    smoke.run_smoke = lambda *a, **k: SimpleNamespace(
        ok=True, code=ExitCode.OK, message="fake node: 18 trainable tokens"
    )
    rehearsal_run.Node = lambda profile, site: rehearsal_fakes.FakeNode()
