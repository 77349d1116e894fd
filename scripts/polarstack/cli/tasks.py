"""Task data commands: `tasks prepare` (slime's and Polar's inputs) and `verify` (canonical solutions in the sandbox)."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from polarstack.cli.render import print_json, progress_bar, render_verify
from polarstack.errors import ExitCode, StackError
from polarstack.inputs import count, seconds
from polarstack.paths import load_defaults
from polarstack.reward import tasks, verifier
from polarstack.reward.verifier.limits import ISOLATION_ENV, IsolationUnavailable, Limits, Outcome


def _add_tasks(sub) -> None:
    p = sub.add_parser("tasks", help="prepare code tasks for slime and Polar")
    tsub = p.add_subparsers(dest="tasks_cmd", required=True, metavar="{prepare}")
    prep = tsub.add_parser("prepare", help="write train.jsonl, workspaces, hidden tests and polar_config.yaml")
    prep.add_argument("task", help="humaneval or mbpp")
    prep.add_argument("--out", required=True, help="output directory")
    prep.add_argument("--source", default=None, help="mbpp: a JSONL file in MBPP's schema instead of the Hub")
    prep.add_argument("--limit", type=int, default=None, help="only the first N problems")
    prep.add_argument(
        "--max-prompt-tokens",
        type=count(1, 10**7),
        default=None,
        help="refuse an instruction that may be longer (default: grpo.rollout_max_prompt_len of configs/train/defaults.yaml)",
    )
    prep.add_argument("--json", action="store_true")
    prep.set_defaults(handler=_cmd_tasks_prepare)


def _cmd_tasks_prepare(args: argparse.Namespace) -> int:
    from pathlib import Path

    budget = args.max_prompt_tokens or int(load_defaults()["grpo"]["rollout_max_prompt_len"])
    result = tasks.prepare(
        args.task,
        Path(args.out),
        source=Path(args.source) if args.source else None,
        limit=args.limit,
        max_prompt_tokens=budget,
    )
    if args.json:
        print_json(result)
    else:
        print(f"{result['problems']} {result['task']} problems -> {result['train_jsonl']} and {result['polar_config']}")
    return 0


def _add_verify(sub) -> None:
    p = sub.add_parser("verify", help="run tasks' tests in the sandbox (canonical solutions by default)")
    p.add_argument("--task", default="humaneval", help="humaneval or mbpp")
    p.add_argument("--source", default=None, help="mbpp: a JSONL file in MBPP's schema")
    p.add_argument("--timeout", type=seconds, default=10.0, help="wall-clock seconds per program (default 10)")
    p.add_argument(
        "--workers", type=count(1, 1024), default=None, help="parallel sandboxes (default: CPU count, at least 2)"
    )
    p.add_argument(
        "--isolation",
        choices=("namespaces", "none"),
        default=None,
        help="namespaces (default) or none: opt out of the sandbox's namespaces (docs/tasks.md; also "
        "POLARSTACK_VERIFIER_ISOLATION)",
    )
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=_cmd_verify)


def _cmd_verify(args: argparse.Namespace) -> int:
    items = _canonical_items(args.task, args.source)
    limits = Limits(timeout=args.timeout, isolation=args.isolation)
    started = time.perf_counter()
    _probe_sandbox(limits)
    with progress_bar() as progress:
        bar = progress.add_task(f"{args.task} canonical solutions", total=len(items))
        try:
            outcomes = verifier.verify_many(items, limits, args.workers, on_outcome=lambda _: progress.advance(bar))
        except RuntimeError as exc:
            raise StackError(f"{exc}.", ExitCode.ENVIRONMENT) from None
    _report_verify(args, items, outcomes, time.perf_counter() - started)
    return 0


def _canonical_items(task: str, source: str | None) -> list[tuple[dict[str, Any], str]]:
    """Every problem of `task` with its canonical solution; USAGE for a task the stack does not know."""
    if task == "humaneval":
        problems = tasks.load_humaneval()
        items = [(dict(p, kind="humaneval"), p["canonical_solution"]) for p in problems]
    elif task == "mbpp":
        problems = tasks.load_mbpp(Path(source) if source else None)
        items = [(dict(p, kind="mbpp"), p["code"]) for p in problems]
    else:
        raise StackError(f"unknown task {task!r}; choose one of {', '.join(tasks.TASKS)}.", ExitCode.USAGE)
    return items


def _probe_sandbox(limits: Limits) -> None:
    """Refuse before the first solution when the sandbox cannot be set up: USAGE for a bad isolation mode,
    ENVIRONMENT otherwise (naming the opt-out when isolation is what fails)."""
    try:
        verifier.probe_sandbox(limits)
    except ValueError as exc:  # a bad POLARSTACK_VERIFIER_ISOLATION
        raise StackError(f"{exc}.", ExitCode.USAGE) from None
    except IsolationUnavailable as exc:  # this process's environment reaches the verifier: name the opt-out
        raise StackError(
            f"{exc}; for completions you trust, --isolation none (or {ISOLATION_ENV}=none) opts out.",
            ExitCode.ENVIRONMENT,
        ) from None
    except RuntimeError as exc:  # no interpreter / lock directory for the sandbox
        raise StackError(f"{exc}.", ExitCode.ENVIRONMENT) from None


def _report_verify(
    args: argparse.Namespace, items: list[tuple[dict[str, Any], str]], outcomes: list[Outcome], elapsed: float
) -> None:
    """The result as JSON (--json) or a table; TASK_DATA when a canonical solution failed."""
    failed = [(items[i][0]["task_id"], o.reason) for i, o in enumerate(outcomes) if not o.passed]
    result = {
        "task": args.task,
        "problems": len(items),
        "passed": len(items) - len(failed),
        "failed": failed,
        "seconds": round(elapsed, 2),
    }
    if args.json:
        print_json(result)
    else:
        render_verify(result, elapsed)
    if failed:
        raise StackError(
            f"{len(failed)} canonical solution(s) failed, first {failed[0][0]} ({failed[0][1]}); the "
            "sandbox limits are too tight for this machine or the task data is wrong.",
            ExitCode.TASK_DATA,
        )


def add_commands(sub) -> None:
    """This module's subcommands, in the order `polarstack --help` lists them."""
    _add_tasks(sub)
    _add_verify(sub)
