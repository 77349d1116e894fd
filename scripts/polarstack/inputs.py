"""Validation of what a user types: URLs, seconds and counts, as argparse `type=` functions.

A value argparse rejects ends the command with the USAGE exit code (2) and one line naming the flag, before
anything starts; without these, a URL port like `80a`, an unclosed `[::1`, a control or non-UTF-8 character,
`--timeout nan` or `--turns 100000` reached httpx or the smoke and ended as an internal error or a run with
no end.
"""

from __future__ import annotations

import argparse
import math
import unicodedata
from urllib.parse import urlsplit

# Caps: the smoke proves a path, it is not a load test (`make bench` is).
MAX_REQUESTS = 100
MAX_TURNS = 50
MAX_TOKENS = 32768
MAX_SECONDS = 24 * 3600.0


def url_problem(value: str) -> str | None:
    """Why `value` is not an http(s) URL the stack can call, or None when it is one."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return "holds bytes that are not UTF-8"
    bad = [ch for ch in value if unicodedata.category(ch) in ("Cc", "Cf", "Zl", "Zp") or ch.isspace()]
    if bad:
        return f"holds the control or space character {bad[0]!r}"
    try:
        parts = urlsplit(value)
        port = parts.port  # raises ValueError for `80a`, 70000, ...
    except ValueError as exc:
        return f"does not parse ({exc})"
    if parts.scheme not in ("http", "https"):
        return "must start with http:// or https://"
    if not parts.hostname:
        return "names no host"
    if port == 0:
        return "has port 0"
    if not value.isascii():
        return "holds non-ASCII characters (write the host in its ASCII form)"
    return None


def url(value: str) -> str:
    """argparse type: an http(s) URL with a host and, if given, a valid port."""
    problem = url_problem(value)
    if problem:
        raise argparse.ArgumentTypeError(
            f"{value.encode('utf-8', 'backslashreplace').decode('ascii', 'backslashreplace')!r}"
            f" is not a usable URL: it {problem}; pass one like http://127.0.0.1:30000"
        )
    return value


def seconds(value: str) -> float:
    """argparse type: a finite number of seconds above 0 (at most a day)."""
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number of seconds") from None
    if not math.isfinite(number) or not 0 < number <= MAX_SECONDS:
        raise argparse.ArgumentTypeError(f"{value} must be a number of seconds above 0 and at most {MAX_SECONDS:g}")
    return number


def count(low: int, high: int):
    """argparse type factory: an integer in [low, high]."""

    def parse(value: str) -> int:
        try:
            number = int(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{value!r} is not a whole number") from None
        if not low <= number <= high:
            raise argparse.ArgumentTypeError(f"{value} must be between {low} and {high}")
        return number

    parse.__name__ = f"count[{low},{high}]"
    return parse
