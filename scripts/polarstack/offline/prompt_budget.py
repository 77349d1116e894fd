"""What configs/upstream/prompt-budget.json must say for the stack's own prompt check to be the budget's enforcement
(issue 34 point 8; scripts/tools/record_prompt_budget.py):
- slime's --rollout-max-prompt-len filters nothing here: `filter_long_prompt` skips list prompts and `_build_messages`
  keeps them lists, and the rendered train.jsonl prompts are one-message lists with no --apply-chat-template;
- the bound polarstack.reward.tasks.prompt_token_bound checks holds for the model's tokenizer: NFC, byte-level BPE
  without byte fallback, and no measured text with more tokens than NFC bytes;
- every shipped HumanEval instruction is within grpo.rollout_max_prompt_len by that bound.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from polarstack.errors import StackError
from polarstack.pins import pin, repo_root
from polarstack.reward import tasks

RECORD = "configs/upstream/prompt-budget.json"
SLIME = {  # key -> (function the line must be in, text it must hold)
    "list_prompt_kept": ("_build_messages", "if not as_conversation:"),
    "list_prompt_skipped": ("filter_long_prompt", "if not isinstance(origin_samples[0].prompt, str):"),
    "string_prompt_tokenized": ("filter_long_prompt", "add_special_tokens=False"),
    "longer_dropped": ("filter_long_prompt", "len(input_ids) <= max_length"),
}


def record() -> dict[str, Any]:
    return json.loads((repo_root() / RECORD).read_text())


def record_problems(data: dict[str, Any] | None = None) -> list[str]:
    data = data or record()
    out = []
    if data.get("slime_commit") != pin("SLIME_COMMIT"):
        out.append(f"{RECORD} was read at slime {data.get('slime_commit')}, not SLIME_COMMIT; rerecord it")
    for key, (function, needle) in SLIME.items():
        fact = (data.get("slime") or {}).get(key) or {}
        if fact.get("in") != function or needle not in fact.get("text", ""):
            out.append(
                f"{RECORD} slime {key}: {fact.get('text')!r} in {fact.get('in')!r}, not {needle!r} in {function}"
            )
    tok = data.get("tokenizer") or {}
    if (
        (tok.get("normalizer") or {}).get("type") != "NFC"
        or "ByteLevel" not in (tok.get("pre_tokenizer_types") or [])
        or tok.get("model") != "BPE"
        or tok.get("byte_fallback")
    ):
        out.append(f"{RECORD}: the tokenizer is not NFC byte-level BPE without byte fallback ({tok}): the bound fails")
    humaneval = data.get("humaneval") or {}
    over = [r for r in data.get("other_scripts") or [] if r["tokens"] > r["nfc_bytes"]]
    if humaneval.get("tokens_over_bytes") != 0 or over or not humaneval.get("instructions"):
        out.append(f"{RECORD}: a measured text has more tokens than NFC bytes ({humaneval}, {over})")
    return out


def plan_problems(train_args: list[str], label: str) -> list[str]:
    """The rendered launch leaves slime's filter as recorded (no --apply-chat-template), so the stack's check is what
    holds the budget; and the shipped HumanEval data passes it at the plan's rollout_max_prompt_len."""
    out = []
    if "--apply-chat-template" in train_args:
        out.append(f"{label}: --apply-chat-template changes what slime's prompt filter sees; re-read {RECORD}")
    budget = int(train_args[train_args.index("--rollout-max-prompt-len") + 1])
    try:
        tasks.check_prompt_budget("humaneval", tasks.load_humaneval(), budget)
    except StackError as exc:
        out.append(f"{label}: {exc.message}")
    with tempfile.TemporaryDirectory(prefix="polarstack-prompts-") as tmp:
        tasks.prepare("humaneval", Path(tmp), limit=1)
        row = json.loads((Path(tmp) / "train.jsonl").read_text().splitlines()[0])
    if not isinstance(row["prompt"], list):
        out.append(f"{label}: train.jsonl's prompt is no longer a message list; slime's filter now applies ({RECORD})")
    return out
