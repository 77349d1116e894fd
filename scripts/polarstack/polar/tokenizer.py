"""A deterministic stand-in tokenizer and a Qwen2.5-style chat template for the engine emulator.

It is not Qwen's BPE: it splits text into word and punctuation pieces and hashes each piece to an id
below Qwen2.5's special-token range, so ids are stable across processes and machines. What matters for
the token path is kept: special tokens have Qwen2.5's ids, the chat template is ChatML (a default system
message when none is given, `<|im_start|>role\\n...<|im_end|>\\n` per message, an assistant generation
prompt), and a conversation's prompt ids extend the previous turn's because every message is tokenized
on its own between special tokens.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from typing import Any, Iterable

ENDOFTEXT, IM_START, IM_END = 151643, 151644, 151645
SPECIAL_TOKENS = {"<|endoftext|>": ENDOFTEXT, "<|im_start|>": IM_START, "<|im_end|>": IM_END}
SPECIAL_IDS = {v: k for k, v in SPECIAL_TOKENS.items()}
VOCAB_SIZE = 152064  # Qwen2.5-7B's padded vocabulary
_TEXT_ID_RANGE = ENDOFTEXT - 256  # ids [256, ENDOFTEXT) for text pieces; below 256 unused
DEFAULT_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
_PIECE = re.compile(r"\s*[A-Za-z0-9_]+|\s*[^\sA-Za-z0-9_]|\s+")
_SPECIAL_SPLIT = re.compile("(" + "|".join(re.escape(s) for s in SPECIAL_TOKENS) + ")")


class Tokenizer:
    _MEMO_MIN_CHARS = 256  # texts this long are remembered: an agent resends its system prompt and history each turn
    _MEMO_SIZE = 8192

    def __init__(self) -> None:
        self._pieces: dict[int, str] = {}
        self._memo: dict[str, tuple[int, ...]] = {}
        self._ids: dict[str, int] = {}
        self._lock = threading.Lock()

    def piece_id(self, piece: str) -> int:
        known = self._ids.get(piece)
        if known is not None:
            return known
        digest = hashlib.blake2b(piece.encode("utf-8"), digest_size=8).digest()
        token_id = 256 + int.from_bytes(digest, "big") % _TEXT_ID_RANGE
        with self._lock:
            self._pieces.setdefault(token_id, piece)
            if len(self._ids) < self._MEMO_SIZE * 8:
                self._ids[piece] = token_id
        return token_id

    def encode(self, text: str) -> list[int]:
        """Text to ids; special-token strings in the text become their ids."""
        if len(text) >= self._MEMO_MIN_CHARS:
            memo = self._memo.get(text)
            if memo is None:
                memo = tuple(self._encode(text))
                if len(self._memo) >= self._MEMO_SIZE:
                    self._memo.clear()
                self._memo[text] = memo
            return list(memo)
        return self._encode(text)

    def _encode(self, text: str) -> list[int]:
        ids: list[int] = []
        for part in _SPECIAL_SPLIT.split(text):
            if not part:
                continue
            if part in SPECIAL_TOKENS:
                ids.append(SPECIAL_TOKENS[part])
            else:
                ids.extend(self.piece_id(p) for p in _PIECE.findall(part))
        return ids

    def token_text(self, token_id: int) -> str:
        if token_id in SPECIAL_IDS:
            return SPECIAL_IDS[token_id]
        with self._lock:
            return self._pieces.get(token_id, f"<tok{token_id}>")

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str:
        out = []
        for token_id in ids:
            if skip_special_tokens and token_id in SPECIAL_IDS:
                continue
            out.append(self.token_text(int(token_id)))
        return "".join(out)


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict):
                parts.append(str(part.get("text", "")))
            else:
                parts.append(str(part))
        return "".join(parts)
    return str(content)


def render_chat(
    messages: list[dict[str, Any]],
    tools: list[Any] | None = None,
    add_generation_prompt: bool = True,
    continue_final_message: bool = False,
) -> list[str]:
    """The ChatML segments (special tokens as separate strings) for a conversation."""
    segments: list[str] = []
    system_text = None
    rest = messages
    if messages and messages[0].get("role") == "system":
        system_text = _content_text(messages[0].get("content"))
        rest = messages[1:]
    if system_text is None:
        system_text = DEFAULT_SYSTEM
    if tools:
        system_text += "\n\n# Tools\n" + "\n".join(json.dumps(t, sort_keys=True, default=str) for t in tools)
    segments += ["<|im_start|>", "system", "\n", system_text, "<|im_end|>", "\n"]
    for index, message in enumerate(rest):
        role = str(message.get("role", "user"))
        text = _content_text(message.get("content"))
        if message.get("tool_calls"):
            text += "".join(
                "\n<tool_call>\n" + json.dumps(call, sort_keys=True, default=str) + "\n</tool_call>"
                for call in message["tool_calls"]
            )
        if role == "tool":
            role, text = "user", "<tool_response>\n" + text + "\n</tool_response>"
        last = index == len(rest) - 1
        segments += ["<|im_start|>", role, "\n", text]
        if not (continue_final_message and last):
            segments += ["<|im_end|>", "\n"]
    if add_generation_prompt and not continue_final_message:
        segments += ["<|im_start|>", "assistant", "\n"]
    return segments


def encode_chat(tokenizer: Tokenizer, messages: list[dict[str, Any]], **kwargs: Any) -> list[int]:
    ids: list[int] = []
    for segment in render_chat(messages, **kwargs):
        ids.extend(tokenizer.encode(segment))
    return ids
