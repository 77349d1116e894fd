"""The candidate's side of a verification (an embedded program run inside the sandbox): the plain-data codec it
shares with the judge, and the runner that loads the solution and answers calls; it never sees the tests."""

from __future__ import annotations

# --- plain-data codec, shared by the candidate's runner and the judge (exact builtin types only) -----------

_CODEC = r"""
def enc(x, depth=0):
    if depth > 200:
        raise ValueError("value nested too deeply to cross the sandbox boundary")
    t = type(x)
    if x is None or t is bool or t is str or t is float:
        return x
    if t is int:
        return x if -(1 << 62) < x < (1 << 62) else {"I": format(x, "x")}
    if t is list:
        return [enc(v, depth + 1) for v in x]
    if t is tuple:
        return {"T": [enc(v, depth + 1) for v in x]}
    if t is dict:
        return {"D": [[enc(k, depth + 1), enc(v, depth + 1)] for k, v in x.items()]}
    if t is set or t is frozenset:
        return {"S" if t is set else "Z": [enc(v, depth + 1) for v in x]}
    if t is bytes:
        return {"B": x.hex()}
    if t is complex:
        return {"C": [x.real, x.imag]}
    raise TypeError("a %s cannot cross the sandbox boundary (plain data only)" % t.__name__)


def dec(j, depth=0):
    if depth > 200:
        raise ValueError("value nested too deeply")
    t = type(j)
    if j is None or t is bool or t is int or t is float or t is str:
        return j
    if t is list:
        return [dec(v, depth + 1) for v in j]
    if t is dict and len(j) == 1:
        (tag, body), = j.items()
        if tag == "I" and type(body) is str:
            return int(body, 16)
        if tag == "B" and type(body) is str:
            return bytes.fromhex(body)
        if tag == "C" and type(body) is list and len(body) == 2 and all(type(v) is float for v in body):
            return complex(body[0], body[1])
        if type(body) is list:
            items = [dec(v, depth + 1) for v in body] if tag != "D" else None
            if tag == "T":
                return tuple(items)
            if tag == "S":
                return set(items)
            if tag == "Z":
                return frozenset(items)
            if tag == "D" and all(type(p) is list and len(p) == 2 for p in body):
                return {dec(k, depth + 1): dec(v, depth + 1) for k, v in body}
    raise ValueError("malformed value from the sandbox")
"""

# --- the candidate's side: load the solution, then answer calls; it never sees the tests -------------------

_RUNNER = (
    r"""
import json, os
"""
    + _CODEC
    + r"""

def _send(obj):
    data = (json.dumps(obj) + "\n").encode()
    while data:
        data = data[os.write(4, data):]


def _describe(exc):
    try:
        return ("%s: %s" % (type(exc).__name__, exc))[:300]
    except BaseException:
        return type(exc).__name__


def _main():
    namespace = {"__name__": "solution", "__builtins__": __builtins__}
    try:
        with open("solution.py", encoding="utf-8") as handle:
            source = handle.read()
        exec(compile(source, "solution.py", "exec"), namespace)
    except BaseException as exc:
        _send({"load_error": _describe(exc)})
        return
    _send({"ready": True})
    for line in os.fdopen(3, "rb"):
        try:
            request = json.loads(line)
            value = namespace[request["call"]](*dec(request["args"]), **dec(request["kwargs"]))
            answer = {"value": enc(value)}
        except BaseException as exc:
            answer = {"raised": type(exc).__name__, "message": _describe(exc)}
        _send(answer)


_main()
"""
)
