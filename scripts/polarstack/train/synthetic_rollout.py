"""The rehearsal's synthetic rollout for the 7B's train-only step (issue 32 point 8), in the file format slime loads.

slime at SLIME_COMMIT (configs/upstream/rehearsal-keys.json, slime facts debug_load_*): `--load-debug-rollout-data
PATH` makes slime skip its sglang servers (slime/utils/arguments.py l.1554) and sets debug_train_only (l.1840): no
rollout GPUs (slime/ray/placement_group.py l.104), no engine is started (rollout.py l.164) and update_weights returns
at once (backends/megatron_utils/actor.py l.572). Each rollout r then reads `torch.load(PATH.format(rollout_id=r),
weights_only=False)["samples"]` and builds each sample with `Sample.from_dict` (slime/ray/rollout.py l.635-640): the
dict that `Sample.to_dict()` writes (slime/utils/types.py; `status` as the Status enum's value, `spec_info` and
`prefix_cache_info` as dicts), which is what slime's own --save-debug-rollout-data dumps: `torch.save(dict(
rollout_id=..., samples=[sample.to_dict() ...]))` (rollout.py `_save_debug_rollout_data`).

What the file holds: `prompts` groups of `per_prompt` samples, each a full trace of `seq_tokens` token ids
(`prompt_tokens` of prompt, the rest response, every response token trained: loss mask 1), rewards 1 and 0 in turn
inside each group so that GRPO's group normalisation gives non-zero advantages (slime normalises per group only when
the count is n_samples_per_prompt x rollout_batch_size, rollout.py l.696), and the engine's log probs (`--use-tis`
reads them). The ids are synthetic: the step measures memory and that the 7B trains through load, forward, backward
and the optimizer; its loss and log-prob figures mean nothing.

Run inside the trainer (torch is there; it is not a dependency of the CLI):
  python3 -m polarstack.train.synthetic_rollout --out PATH --prompts N --per-prompt M --seq-tokens T ...
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

# Qwen2.5's ordinary (byte-level BPE) token ids lie below 151643, its first special token (<|endoftext|>); the 7B's
# embedding has --vocab-size 152064 rows (padded), so every id here is one it embeds.
ORDINARY_TOKENS = 151643
SYNTHETIC_LOGPROB = -1.0  # the "engine's" log prob of every response token (synthetic; feeds --use-tis only)


def samples(*, prompts: int, per_prompt: int, seq_tokens: int, prompt_tokens: int) -> list[dict[str, Any]]:
    """The samples as Sample.to_dict() writes them (the keys slime/utils/types.py's Sample declares)."""
    if not 0 < prompt_tokens < seq_tokens or prompts < 1 or per_prompt < 2:
        raise ValueError("need 0 < prompt_tokens < seq_tokens, prompts >= 1 and per_prompt >= 2 (mixed rewards)")
    response = seq_tokens - prompt_tokens
    out = []
    for group in range(prompts):
        for k in range(per_prompt):
            index = group * per_prompt + k
            tokens = [(7919 * i + 104729 * index) % ORDINARY_TOKENS for i in range(seq_tokens)]
            out.append(
                {
                    "group_index": group,
                    "index": index,
                    "rollout_id": None,  # slime assigns one per sample (rollout.py _convert_samples_to_train_data)
                    "prompt": "",
                    "tokens": tokens,
                    "response": "",
                    "response_length": response,
                    "label": None,
                    "reward": 1.0 if k % 2 == 0 else 0.0,
                    "loss_mask": [1] * response,
                    "weight_versions": [],
                    "rollout_log_probs": [SYNTHETIC_LOGPROB] * response,
                    "remove_sample": False,
                    "status": "completed",
                    "metadata": {},
                    "spec_info": {},
                    "prefix_cache_info": {},
                }
            )
    return out


def format_problems(
    data: dict[str, Any],
    sample_record: dict[str, Any],
    *,
    count: int,
    seq_tokens: int,
    vocab: int,
) -> list[str]:
    """What slime's loader and its conversion to training data need of the file's dict (one sentence each):
    `sample_record` is rehearsal-keys.json's slime.sample (Sample's fields and Status values at SLIME_COMMIT)."""
    problems = []
    if set(data) != {"rollout_id", "samples"}:
        problems.append(f"the file's dict has keys {sorted(data)}, slime writes and reads rollout_id and samples")
    rows = data.get("samples") or []
    fields = set(sample_record["fields"])
    if len(rows) != count:
        problems.append(
            f"{len(rows)} samples, not n_samples_per_prompt x rollout_batch_size = {count} (slime's group "
            "normalisation needs exactly that many)"
        )
    for row in rows[:count]:
        unknown = sorted(set(row) - fields)
        if unknown:
            problems.append(f"sample {row.get('index')}: {unknown} are not fields of slime's Sample")
        if row.get("status") not in sample_record["status_values"]:
            problems.append(f"sample {row.get('index')}: status {row.get('status')!r} is not a Sample.Status value")
        tokens, response = row.get("tokens") or [], int(row.get("response_length") or 0)
        if len(tokens) != seq_tokens:
            problems.append(f"sample {row.get('index')}: {len(tokens)} tokens, not {seq_tokens}")
        if not 0 < response < len(tokens):
            problems.append(f"sample {row.get('index')}: response_length {response} outside its {len(tokens)} tokens")
        if len(row.get("loss_mask") or []) != response:  # asserted by slime (rollout.py _convert_samples_to_train_data)
            problems.append(f"sample {row.get('index')}: loss mask length is not response_length")
        if len(row.get("rollout_log_probs") or []) != response:
            problems.append(f"sample {row.get('index')}: rollout_log_probs length is not response_length")
        if tokens and not all(isinstance(t, int) and 0 <= t < vocab for t in tokens):
            problems.append(f"sample {row.get('index')}: a token id outside 0..{vocab - 1} (--vocab-size)")
        if not isinstance(row.get("spec_info"), dict) or not isinstance(row.get("prefix_cache_info"), dict):
            problems.append(f"sample {row.get('index')}: spec_info / prefix_cache_info must be dicts (from_dict)")
    groups: dict[int, set[float]] = {}
    for row in rows:
        groups.setdefault(int(row.get("group_index") or 0), set()).add(float(row.get("reward") or 0.0))
    if any(len(rewards) < 2 for rewards in groups.values()):
        problems.append("a group with one reward only: its advantages would be 0 and the step would train nothing")
    return problems


def write(path: Path, rows: list[dict[str, Any]], rollout_id: int = 0) -> None:
    """torch.save the dict slime's --save-debug-rollout-data writes (rollout.py _save_debug_rollout_data)."""
    import torch  # in the trainer image; not a dependency of the CLI

    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(dict(rollout_id=rollout_id, samples=rows), path)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python3 -m polarstack.train.synthetic_rollout", description=__doc__.split("\n")[0]
    )
    p.add_argument("--out", required=True, help="the path for rollout 0 (--load-debug-rollout-data with {rollout_id})")
    p.add_argument("--prompts", type=int, required=True)
    p.add_argument("--per-prompt", type=int, required=True)
    p.add_argument("--seq-tokens", type=int, required=True)
    p.add_argument("--prompt-tokens", type=int, required=True)
    args = p.parse_args(argv)
    rows = samples(
        prompts=args.prompts, per_prompt=args.per_prompt, seq_tokens=args.seq_tokens, prompt_tokens=args.prompt_tokens
    )
    write(Path(args.out), rows)
    print(f"synthetic rollout: {len(rows)} samples of {args.seq_tokens} tokens -> {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["samples", "format_problems", "write", "ORDINARY_TOKENS"]
