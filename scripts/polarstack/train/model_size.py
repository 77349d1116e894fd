"""What slime's Megatron arguments say about a model: its shape and its parameter count, computed (not measured).

Used by the rehearsal's plan (polarstack.train.preflight: config.json against slime's model script) and by the memory
model (polarstack.train.memory: bytes per parameter, logits, activations).
"""

from __future__ import annotations

from typing import Any


def _value(args: list[str], flag: str) -> str | None:
    return args[args.index(flag) + 1] if flag in args else None


def model_facts(args: list[str]) -> dict[str, Any]:
    """What the Megatron arguments say about a model, and its parameter count computed from them (not measured)."""
    hidden, layers = int(_value(args, "--hidden-size")), int(_value(args, "--num-layers"))
    heads, ffn = int(_value(args, "--num-attention-heads")), int(_value(args, "--ffn-hidden-size"))
    groups = int(_value(args, "--num-query-groups") or heads)
    vocab = int(_value(args, "--vocab-size"))
    tied = "--untie-embeddings-and-output-weights" not in args
    kv = groups * (hidden // heads)
    per_layer = (
        hidden * hidden
        + hidden  # query projection + bias (--add-qkv-bias)
        + 2 * (hidden * kv + kv)  # key and value projections + biases
        + hidden * hidden  # output projection (--disable-bias-linear)
        + 3 * hidden * ffn  # SwiGLU: gate, up, down
        + 2 * hidden  # two RMSNorms
    )
    params = vocab * hidden * (1 if tied else 2) + layers * per_layer + hidden
    return {
        "vocab_size": vocab,
        "tied_embeddings": tied,
        "num_query_groups": groups,
        "hidden_size": hidden,
        "num_layers": layers,
        "num_attention_heads": heads,
        "ffn_hidden_size": ffn,
        "rotary_base": _value(args, "--rotary-base"),
        "parameters": params,
        "bf16_bytes": params * 2,
    }


__all__ = ["model_facts"]
