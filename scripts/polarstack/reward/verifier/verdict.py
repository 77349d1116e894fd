"""The verifier's output lines: one rule, used by the verifier to write them and by the project's readers (the
in-job gate, train/gate.py, and the sandbox probe, checks/sandbox_probe.py) to read them.

Polar's `test_on_output` evaluator grades the test command's stdout and stderr joined: each line, ANSI colour codes
and `\\r` removed and stripped, that starts with PASSED, FAILED, ERROR or SKIPPED is a status for the node id after
it (cut at ` - `, then split on `::`); the last status per id wins and the reward is 1 when the parsed map equals
the task's expected one (configs/upstream/polar-grading.json records the rule and where it was read). So the
verifier prints exactly one status line, its own decision, and nothing the candidate wrote may reach the output
unescaped: a detail that carries candidate text (a load error, an exception's message) is rendered by `escape`,
printable ASCII only, bounded, with `\\` escapes shown as text, `::` and ` - ` broken and the project's markers
(`(not verified)`, `polarstack-verifier:`) never spelled out.

Lines:
- stdout: `PASSED <name>`, `FAILED <name> (<reason>: <escaped detail>)`, or the refusal `FAILED <name> (not verified)`
  (byte for byte what it has always been: exit 8, the sandbox could not be set up);
- stderr: `polarstack-verifier: limits: <mechanism>` (information: which mechanism bounded the sandbox), or, with
  the refusal, `polarstack-verifier: <sentence>` (why it refused).
"""

from __future__ import annotations

import re

DETAIL_LIMIT = 300  # characters of an escaped detail, "..." included
STATUS_WORDS = ("PASSED", "FAILED", "ERROR", "SKIPPED")  # Polar's status prefixes (polar-grading.json)
NOT_VERIFIED = "(not verified)"
NOTE_PREFIX = "polarstack-verifier: "
LIMITS_NOTE = NOTE_PREFIX + "limits: "
_MARKERS = re.compile(r"\(not verified\)|polarstack-verifier:", re.I)
_NAMED_ESCAPES = {"\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"}
_REFUSAL = re.compile(r"FAILED \S+ \(not verified\)")


def _escaped_char(char: str) -> str:
    if char in _NAMED_ESCAPES:
        return _NAMED_ESCAPES[char]
    if " " <= char <= "~":
        return char
    code = ord(char)  # control and ANSI characters, every line separator, non-ASCII, lone surrogates
    return "\\x%02x" % code if code < 0x100 else "\\u%04x" % code if code < 0x10000 else "\\U%08x" % code


def escape(text: object, limit: int = DETAIL_LIMIT) -> str:
    """`text` as one line of printable ASCII of at most `limit` characters: `\\n` shown as the two characters
    backslash and n (and so for every other character outside printable ASCII), `::` and ` - ` broken (the node id
    Polar cuts stays this line's own), the project's markers broken; cut at `limit` with "..."."""
    raw = str(text)
    tokens = [_escaped_char(c) for c in raw]
    # One character per token, escapes masked, to find what to break: the second `:` of `::`, the `-` of ` - `,
    # the first character of a marker (in any case).
    shadow = "".join(t if len(t) == 1 else "\0" for t in tokens)
    breaks = {m.start() + 1 for m in re.finditer(r"(?=::)", shadow)}
    breaks |= {m.start() for m in re.finditer(r"(?<= )-(?= )", shadow)}
    breaks |= {m.start() for m in _MARKERS.finditer(shadow)}
    for index in breaks:
        tokens[index] = "\\x%02x" % ord(raw[index])
    out, size = [], 0
    for token in tokens:
        if size + len(token) > limit:
            while out and size + 3 > limit:
                size -= len(out.pop())
            out.append("...")
            break
        out.append(token)
        size += len(token)
    return "".join(out)


def passed_line(name: str) -> str:
    return f"PASSED {name}"


def failed_line(name: str, reason: str, detail: object) -> str:
    """The verifier's FAILED line: its own `reason` ("failed", "timeout", ...) and an escaped detail."""
    return f"FAILED {name} ({escape(reason, 40)}: {escape(detail)})"


def refusal_line(name: str) -> str:
    """What the verifier prints when it did not verify (exit 8): unchanged since it was first printed."""
    return f"FAILED {name} {NOT_VERIFIED}"


def limits_note(mechanism: str) -> str:
    return LIMITS_NOTE + escape(mechanism, 400)


def refusal_note(sentence: object) -> str:
    return NOTE_PREFIX + escape(sentence, 600)


def _clean(line: str) -> str:
    return re.sub(r"\x1b\[[0-9;]*m|\r", "", line).strip()


def is_refusal(line: str) -> bool:
    """Whether one output line says the verifier refused: the refusal line itself, or its stderr sentence (any
    `polarstack-verifier:` note but the limits one). A FAILED line's detail cannot be either (`escape`)."""
    line = _clean(line)
    if _REFUSAL.fullmatch(line):
        return True
    return line.startswith(NOTE_PREFIX) and not line.startswith(LIMITS_NOTE)


def refusal_note_text(line: str) -> str | None:
    """The sentence of a refusal note (`polarstack-verifier: <sentence>`), None for any other line."""
    line = _clean(line)
    if line.startswith(NOTE_PREFIX) and not line.startswith(LIMITS_NOTE):
        return line[len(NOTE_PREFIX) :].strip()
    return None


def refused(line: str, name: str) -> bool:
    """Whether `line` is the refusal line for the verifier run named `name`."""
    return _clean(line) == refusal_line(name)
