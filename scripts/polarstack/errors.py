"""One error type for expected failures, and the exit codes the CLI ends with.

Every expected failure (engine down, router dropped fields, bad config, bad task data) is raised as a
StackError carrying one actionable sentence and a distinct exit code; `cli.main` prints the sentence
on stderr and exits with the code. Anything else is a bug and shows a traceback only with --debug.
"""

from __future__ import annotations

import enum


class ExitCode(enum.IntEnum):
    OK = 0
    INTERNAL = 1  # a bug: an exception nobody expected
    USAGE = 2  # bad command line or bad configuration (argparse also uses 2)
    TOKENS_MISSING = 3  # responses carry no prompt/response token ids: zero trainable tokens
    INVARIANT = 4  # token fields present but inconsistent (lengths, logprobs, ...)
    UNREACHABLE = 5  # connection refused, DNS failure or timeout
    HTTP_ERROR = 6  # non-2xx answer (includes a model-name mismatch)
    MALFORMED = 7  # 2xx answer whose body is not the JSON shape asked for
    ENVIRONMENT = 8  # a tool the command needs is missing or too old (Docker, Compose v2, GPUs, network)
    STATE = 9  # run state conflict: already up, nothing up, stale pids
    TASK_DATA = 10  # task data missing or invalid
    GATE = 11  # the training gate refused to launch
    TOOL_CALLS = 12  # a request carrying tools got no parsed message.tool_calls (engine lacks --tool-call-parser)
    ASSETS_MISSING = 13  # GPU-node assets absent: weights, the sandbox image, the agent CLI, apptainer, the images
    RETOKENIZED = 15  # Polar would train only on ids re-tokenized from text (ids dropped): refused by default
    REHEARSAL_FAILED = 16  # `make preflight`'s report names a failing class (polarstack.checks.rehearsal_report)
    NO_REHEARSAL = 17  # `make train` on the docker runtime without a passing rehearsal matching pins, profile, plan
    POLAR_START = 18  # a training attempt's Polar rollout server or gateway exited before answering /health


class StackError(Exception):
    """An expected failure: one sentence for the user and the exit code that names its kind."""

    def __init__(self, message: str, code: ExitCode = ExitCode.USAGE, *, details: object = None):
        super().__init__(message)
        self.message = message
        self.code = ExitCode(code)
        self.details = details
