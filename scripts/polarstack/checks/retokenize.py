"""Polar's re-tokenization path: which tokenizer the guarded Polar configuration gives its trace builder, and how
far ids re-tokenized from text drift from the ids the engine sampled.

Where the setting lives: Polar's task template names the trajectory builder as
`polar_task_template.builder = {strategy, config}` (StrategySpec in src/polar/trajectory/models.py); the builder
is constructed with that config, and PrefixMergingBuilder.__init__ takes `tokenizer_name_or_path`
(src/polar/trajectory/builder/prefix_merging.py, revision 93a0f757: it loads AutoTokenizer and hands it to
record_utils.build_trace_from_completion). The code store has no copy of prefix_merging.py at POLAR_COMMIT, so
this follows revision 93a0f757; at the pin the key may not exist, and then no tokenizer is ever set.

The config read is slime's --custom-config-path file (the `polar_config.yaml` `polarstack train` renders); without
one, the template this stack renders (polarstack.reward.tasks.task_template), which sets no builder tokenizer.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from polarstack.errors import ExitCode, StackError
from polarstack.polar.tokenizer import Tokenizer, encode_chat
from polarstack.reward.tasks import task_template

EMULATOR_TOKENIZER = "polarstack-emulator"  # the emulator's toy tokenizer (local runtime only)
RISK = (
    "ids re-tokenized from text can differ from the ids the model sampled, so the logprobs no longer belong "
    "to the trained tokens and the importance ratios are wrong"
)


def configured_name(polar_config: dict[str, Any] | None) -> str | None:
    """`polar_task_template.builder.config.tokenizer_name_or_path`, or None."""
    if polar_config is None:
        template: Any = task_template("humaneval")
    else:
        template = polar_config.get("polar_task_template")
    builder = template.get("builder") if isinstance(template, dict) else None
    config = builder.get("config") if isinstance(builder, dict) else None
    name = config.get("tokenizer_name_or_path") if isinstance(config, dict) else None
    return name if isinstance(name, str) and name else None


def read_config(path: str | Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise StackError(
            f"cannot read the Polar config {path} ({exc}); pass the polar_config.yaml that "
            "`polarstack train` rendered.",
            ExitCode.USAGE,
        ) from None
    if not isinstance(data, dict):
        raise StackError(
            f"{path} is not a YAML mapping of polar_* keys; pass the rendered polar_config.yaml.", ExitCode.USAGE
        )
    return data


class EmulatorTokenizer:
    """The emulator's tokenizer behind the two calls record_utils makes (encode, apply_chat_template)."""

    def __init__(self) -> None:
        self._tokenizer = Tokenizer()

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return self._tokenizer.encode(text)

    def apply_chat_template(
        self,
        messages: list[dict[str, Any]],
        tools: Any = None,
        tokenize: bool = True,
        add_generation_prompt: bool = True,
        **_: Any,
    ) -> list[int]:
        return encode_chat(self._tokenizer, messages, tools=tools, add_generation_prompt=add_generation_prompt)


def load(name: str) -> Any:
    """The tokenizer Polar's builder would load for `name` (transformers' AutoTokenizer, as prefix_merging does)."""
    if name == EMULATOR_TOKENIZER:
        return EmulatorTokenizer()
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise StackError(
            f"the Polar config sets tokenizer_name_or_path={name!r} but transformers is not installed "
            "here; run the smoke inside the trainer image.",
            ExitCode.ENVIRONMENT,
        ) from None
    try:
        return AutoTokenizer.from_pretrained(name, trust_remote_code=True)
    except (OSError, ValueError) as exc:
        raise StackError(
            f"cannot load the tokenizer {name!r} the Polar config names ({exc}); fix tokenizer_name_or_path.",
            ExitCode.ENVIRONMENT,
        ) from None


def drift(tokenizer: Any, response: dict[str, Any]) -> dict[str, int] | None:
    """Re-encode choices[0].logprobs.content[].token text (record_utils._reconstruct_response_tokens) and compare
    with the ids the engine sampled (meta_info.output_token_logprobs); None when the answer carries no ids."""
    choices = response.get("choices")
    choice = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else {}
    meta = choice.get("meta_info")
    entries = meta.get("output_token_logprobs") if isinstance(meta, dict) else None
    logprobs = choice.get("logprobs")
    content = logprobs.get("content") if isinstance(logprobs, dict) else None
    if not isinstance(entries, list) or not entries or not isinstance(content, list):
        return None
    sampled = [e[1] for e in entries if isinstance(e, list) and len(e) >= 2]
    text = "".join(item.get("token", "") for item in content if isinstance(item, dict))
    rebuilt = list(tokenizer.encode(text, add_special_tokens=False))
    differing = sum(1 for a, b in zip(sampled, rebuilt, strict=False) if a != b) + abs(len(sampled) - len(rebuilt))
    first = next(
        (i for i, (a, b) in enumerate(zip(sampled, rebuilt, strict=False)) if a != b),
        min(len(sampled), len(rebuilt)) if len(sampled) != len(rebuilt) else -1,
    )
    return {
        "sampled_tokens": len(sampled),
        "retokenized_tokens": len(rebuilt),
        "differing_positions": differing,
        "first_divergence": first,
    }
