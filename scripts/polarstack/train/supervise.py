"""`make train` supervises the training job (issue 18 point 4): resume after a crash, never after a gate stop.

Polar's worker makes an uncategorised task failure fatal (src/slime_bridge/rollout.py `_submit_and_collect` ->
`_set_fatal`, ../shared/reference/gpu-node.md) and expects an outer supervisor to restart the job from its last
checkpoint. This is that supervisor, around one attempt = one run of launch.sh in the trainer:
- exit 0: done;
- the gate stopped the job (it wrote its abort file): GATE with the gate's sentence, never restarted, because the
  path cannot train and a restart would only repeat it;
- launch.sh's checkpoint guard refusing (RESUME_REFUSED) and its Polar servers failing to start, or finding another
  launch's still on their ports (POLAR_START_FAILED, POLAR_PORT_HELD), are raised by the attempt itself, never retried;
- any other failure with a checkpoint newer than before the attempt: resume from it (RESUME) while fewer than
  `supervise.max_restarts` restarts were made;
- a failure before the first checkpoint: restart from scratch, at most once;
- a failure that wrote no new checkpoint since the last attempt: stop, because a crash that repeats before the
  next save would repeat every time and waste hours.
The attempt runner, the checkpoint reader and the gate reader are passed in, so tests drive it with a fake job.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Callable

from polarstack.errors import ExitCode, StackError


@dataclass
class Outcome:
    attempts: list[dict] = field(default_factory=list)  # one {"resume", "exit", "checkpoint"} per attempt


def supervise(
    attempt: Callable[[bool], int],
    checkpoint: Callable[[], int | None],
    gate_stop: Callable[[], str | None],
    *,
    max_restarts: int,
    resume: bool,
    describe: str,
    logs: str,
    log: Callable[[str], None] = lambda m: print(m, file=sys.stderr),
) -> Outcome:
    """Run attempts until one succeeds or a rule above stops; raises StackError (one sentence) when it stops. `logs`
    names where the job's output is (polarstack.train.launch.logs_hint: the run's directory on the host)."""
    outcome = Outcome()
    restarts = 0
    fresh_restart_used = False
    before = checkpoint() if resume else None
    while True:
        rc = attempt(resume)
        after = checkpoint() if rc != 0 else None
        outcome.attempts.append({"resume": resume, "exit": rc, "checkpoint": after})
        if rc == 0:
            return outcome
        sentence = gate_stop()
        if sentence:
            raise StackError(sentence, ExitCode.GATE)  # the gate's stop is final: never restarted
        tried = len(outcome.attempts)
        if after is None:
            if fresh_restart_used or resume:
                raise StackError(
                    f"{describe} failed again (exit {rc}) before writing its first checkpoint, after {tried} "
                    f"attempt(s); not restarting a crash that repeats before the first save: see {logs}.",
                    ExitCode.ENVIRONMENT,
                )
            fresh_restart_used = True
            log(
                f"polarstack: {describe} failed (exit {rc}) before its first checkpoint; restarting it from scratch once"
            )
            resume = False
            continue
        if before is not None and after <= before:
            raise StackError(
                f"{describe} failed (exit {rc}) without writing a checkpoint newer than iteration {before} since the "
                f"last attempt ({tried} attempt(s)); not retrying a crash that repeats before the next save: see "
                f"{logs}.",
                ExitCode.ENVIRONMENT,
            )
        if restarts >= max_restarts:
            raise StackError(
                f"{describe} failed (exit {rc}) after {restarts} restart(s) from checkpoints "
                f"(supervise.max_restarts={max_restarts}); the last checkpoint is iteration {after}: `make train "
                f"RESUME=1` continues it once the cause is fixed (see {logs}).",
                ExitCode.ENVIRONMENT,
            )
        restarts += 1
        before = after
        resume = True
        log(
            f"polarstack: {describe} failed (exit {rc}); resuming from its checkpoint at iteration {after} "
            f"(restart {restarts} of {max_restarts})"
        )


def parse_iteration(text: str) -> int | None:
    """latest_checkpointed_iteration.txt's content (Megatron writes the iteration number), or None."""
    text = (text or "").strip()
    return int(text) if text.isdigit() else None


__all__ = ["Outcome", "parse_iteration", "supervise"]
