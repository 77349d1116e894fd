"""The engine emulator's per-engine prefix cache: longest cached prefix of a prompt, in time linear in its length.

sglang's radix cache reports, per request, how many leading prompt tokens it found cached
(`meta_info.cached_tokens`). The emulator only needs that number, for prompts of tens of thousands of tokens
(an agent harness's system prompt and tool schemas), so instead of comparing a prompt with every remembered
prompt (quadratic), this cache hashes the prompt block by block (a chain: each block's key covers every
token before it) and remembers, for every block key, how many remembered prompts hold it and the latest one.
A lookup walks the blocks until the first unknown key, then extends the match token by token against the
latest prompt holding the last known block. The result is exact whenever the prompts that share the
deepest matched block agree up to their divergence point (a session's earlier turns, a shared system
prompt); otherwise it can fall short by less than one block (or, once the latest holder of a block was
forgotten while others still hold it, overshoot by less than one block).

Capacity is counted in remembered prompts (oldest forgotten first), like the emulator's earlier deque.
"""

from __future__ import annotations

import collections
import threading
from typing import Sequence

BLOCK = 16


def _chain(prompt: Sequence[int]) -> list[int]:
    """Key of every full block: hash of (previous key, block tokens)."""
    keys, previous = [], 0
    for start in range(0, len(prompt) - len(prompt) % BLOCK, BLOCK):
        previous = hash((previous, tuple(prompt[start : start + BLOCK])))
        keys.append(previous)
    return keys


def _extend(prompt: tuple[int, ...], other: tuple[int, ...], start: int) -> int:
    limit = min(len(prompt), len(other))
    while start < limit and prompt[start] == other[start]:
        start += 1
    return start


class PrefixCache:
    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._prompts: collections.deque[tuple[tuple[int, ...], list[int]]] = collections.deque()
        self._count: dict[int, int] = {}
        self._latest: dict[int, tuple[int, ...]] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._prompts)

    def clear(self) -> None:
        with self._lock:
            self._prompts.clear()
            self._count.clear()
            self._latest.clear()

    def match(self, prompt: Sequence[int]) -> int:
        """Tokens of `prompt` shared with the longest-matching remembered prompt; then remember `prompt`."""
        prompt = tuple(prompt)
        keys = _chain(prompt)
        with self._lock:
            depth = 0
            while depth < len(keys) and keys[depth] in self._count:
                depth += 1
            if depth:
                best = _extend(prompt, self._latest[keys[depth - 1]], depth * BLOCK)
            else:  # no shared full block: every remembered prompt shares fewer than BLOCK tokens
                best = max((_extend(prompt, other, 0) for other, _ in self._prompts), default=0)
            self._remember(prompt, keys)
        return best

    def _remember(self, prompt: tuple[int, ...], keys: list[int]) -> None:
        for key in keys:
            self._count[key] = self._count.get(key, 0) + 1
            self._latest[key] = prompt
        self._prompts.append((prompt, keys))
        while len(self._prompts) > self.capacity:
            old, old_keys = self._prompts.popleft()
            for key in old_keys:
                left = self._count[key] - 1
                if left:
                    self._count[key] = left
                else:
                    del self._count[key]
                    del self._latest[key]
