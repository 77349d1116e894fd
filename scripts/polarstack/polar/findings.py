"""Engine-health findings on an answer the pinned Polar trains on, which Polar itself does not enforce (it never
reads `usage`, trains on positive logprobs, coerces id types, reads only the first choice and keeps meta_info's
ids when other lists disagree: see polar/model.py for the functions read). Each finding says what it means for
training; they never change Polar's count. `polarstack smoke --strict` turns them into exit 4.
"""

from __future__ import annotations

import functools
import math
from typing import Any

from polarstack.paths import load_defaults
from polarstack.polar.verdict import I64_MAX, I64_MIN, Finding, PolarVerdict

# Findings the trainer cannot survive although Polar keeps the record: the last step of the token path is slime's
# trainer, whose token tensors are int64 and whose embedding lookup indexes [0, vocab size). A record with such an
# id is not trained on (the job fails at that batch), so the smoke blocks on these by default (exit 4); the other
# findings stay warnings that only --strict blocks.
TRAINER_FATAL = ("negative_id", "id_beyond_64_bits", "id_beyond_vocab")


@functools.cache
def vocab_size() -> int | None:
    """The trained model's --vocab-size (configs/train/defaults.yaml model.args), None when it cannot be read."""
    try:
        args = [str(a) for a in load_defaults()["model"]["args"]]
        return int(args[args.index("--vocab-size") + 1])
    except Exception:  # no defaults file, no such flag: the vocabulary check is skipped, not guessed
        return None


def _raw_id_findings(raw: dict[str, Any], verdict: PolarVerdict) -> None:
    choices = raw.get("choices")
    choice = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else {}
    meta = choice.get("meta_info")
    entries = meta.get("output_token_logprobs") if isinstance(meta, dict) else None
    fields: list[tuple[str, Any]] = [
        (f"choices[0].{k}", choice.get(k)) for k in ("input_token_ids", "prompt_token_ids", "token_ids")
    ]
    fields.append(("prompt_token_ids", raw.get("prompt_token_ids")))
    if isinstance(entries, list):
        fields.append(
            (
                "choices[0].meta_info.output_token_logprobs[][1]",
                [
                    e[1]
                    if isinstance(e, (list, tuple)) and len(e) >= 2
                    else e.get("token_id")
                    if isinstance(e, dict)
                    else None
                    for e in entries
                ],
            )
        )
    for path, values in fields:
        if not isinstance(values, list):
            continue
        for value in values:
            big = isinstance(value, (int, float)) and not isinstance(value, bool) and not I64_MIN <= value <= I64_MAX
            if big:
                verdict.warnings.append(
                    Finding(
                        "id_beyond_64_bits",
                        path,
                        f"{path} holds {value!r}, beyond the "
                        "signed 64-bit range (orjson turns ids beyond it into floats): Polar "
                        "coerces it to an int and trains on an id no tokenizer produced, "
                        "which slime's int64 token tensors cannot hold",
                    )
                )
                return
            if isinstance(value, (int, float)) and not isinstance(value, bool) and value < 0:
                verdict.warnings.append(
                    Finding(
                        "negative_id",
                        path,
                        f"{path} holds {value!r}: no tokenizer produces "
                        "a negative id; Polar keeps it and slime's embedding lookup on the "
                        "trainer fails on it (an index out of range), so the engine or "
                        "something on the path corrupted the ids",
                    )
                )
                return
            vocab = vocab_size()
            if isinstance(value, (int, float)) and not isinstance(value, bool) and vocab and value >= vocab:
                verdict.warnings.append(
                    Finding(
                        "id_beyond_vocab",
                        path,
                        f"{path} holds {value!r}, not below the "
                        f"trained model's vocabulary size {vocab} (configs/train/defaults.yaml "
                        "--vocab-size): slime's embedding lookup fails on it",
                    )
                )
                return
            if type(value) is not int and value is not None:
                verdict.warnings.append(
                    Finding(
                        "coerced_id",
                        path,
                        f"{path} holds {value!r} "
                        f"({type(value).__name__}): Polar coerces it to an int (int() or "
                        "pydantic's lax mode) and trains on it; sglang never sends that "
                        "type, so something on the path rewrote the ids",
                    )
                )
                return


def findings(raw: dict[str, Any], verdict: PolarVerdict) -> None:
    """Engine-health findings on a record Polar keeps. They do not change Polar's count."""
    add = verdict.warnings.append
    choices = raw.get("choices") if isinstance(raw.get("choices"), list) else []
    if len(choices) > 1:
        add(
            Finding(
                "only_first_choice",
                "choices",
                f"{len(choices)} choices: Polar reads only choices[0], the other "
                f"{len(choices) - 1} are discarded (n >= 2 wastes generation)",
            )
        )
    _raw_id_findings(raw, verdict)
    if verdict.logprobs:
        for index, value in enumerate(verdict.logprobs):
            if not math.isfinite(value):
                add(
                    Finding(
                        "nonfinite_logprob",
                        f"logprobs[{index}]",
                        f"logprob {index} is {value} (a numeric "
                        "string): Polar trains on it and the importance ratios become NaN/inf",
                    )
                )
                break
            if value > 0:
                add(
                    Finding(
                        "positive_logprob",
                        f"logprobs[{index}]",
                        f"logprob {index} is {value!r} > 0, not a "
                        "log-probability: Polar trains on it; the engine's sampler output is suspect",
                    )
                )
                break
    usage = raw.get("usage") if isinstance(raw.get("usage"), dict) else {}
    prompt_tokens, completion_tokens = usage.get("prompt_tokens"), usage.get("completion_tokens")
    if verdict.prompt_ids and type(prompt_tokens) is int and prompt_tokens != len(verdict.prompt_ids):
        add(
            Finding(
                "usage_mismatch",
                "usage.prompt_tokens",
                f"{len(verdict.prompt_ids)} prompt ids but "
                f"usage.prompt_tokens is {prompt_tokens}: Polar ignores usage and trains on the ids",
            )
        )
    if verdict.response_ids and type(completion_tokens) is int:
        # sglang's usage sums completion tokens over all choices when n >= 2: compare with that sum.
        lengths = [_choice_length(c) for c in choices] if len(choices) > 1 else [len(verdict.response_ids)]
        if None not in lengths and completion_tokens != sum(lengths):
            add(
                Finding(
                    "usage_mismatch",
                    "usage.completion_tokens",
                    f"{sum(lengths)} response ids over "
                    f"{len(lengths)} choice(s) but usage.completion_tokens is {completion_tokens}: Polar ignores "
                    "usage and trains on the ids it extracted",
                )
            )
    choice = choices[0] if choices and isinstance(choices[0], dict) else {}
    logprobs = choice.get("logprobs")
    content = logprobs.get("content") if isinstance(logprobs, dict) else None
    raw_ids = choice.get("token_ids")
    if verdict.response_ids and isinstance(content, list) and content and len(content) != len(verdict.response_ids):
        add(
            Finding(
                "aligned_prefix",
                "choices[0].logprobs.content",
                f"logprobs.content has {len(content)} entries "
                f"but Polar trains on {len(verdict.response_ids)} ids from meta_info: the lists disagree and "
                "Polar keeps only the meta_info side",
            )
        )
    elif verdict.response_ids and isinstance(raw_ids, list) and len(raw_ids) != len(verdict.response_ids):
        add(
            Finding(
                "aligned_prefix",
                "choices[0].token_ids",
                f"token_ids has {len(raw_ids)} ids but Polar trains "
                f"on the {len(verdict.response_ids)} ids meta_info carries (normalize_response overwrites them)",
            )
        )


def _choice_length(choice: Any) -> int | None:
    if not isinstance(choice, dict):
        return None
    meta = choice.get("meta_info")
    entries = meta.get("output_token_logprobs") if isinstance(meta, dict) else None
    if isinstance(entries, list):
        return len(entries)
    ids = choice.get("token_ids")
    return len(ids) if isinstance(ids, list) else None
