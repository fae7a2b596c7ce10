"""The program that runs inside the sandbox around model-written code, and the value format that
both sides of the sandbox share. Standard library only: the sandbox runs it on the system python3.

The untrusted process computes; the scorer judges. A sandboxed *server* loads the completion and
answers calls one JSON line at a time: ``{"args": <encoded list>}`` in, ``{"v": <encoded value>}``,
``{"digest": <sha256 of the value's key>}`` (values too large to send) or ``{"error": <name>}``
out. Nothing it sends is ever executed or unpickled by the scorer: ``decode`` accepts only JSON
built by ``encode``'s rules and returns plain builtins (no object of the program's reaches a
comparison). Model code writes to stdout freely: the reply channel is a private descriptor, and
fd 1 is sent to stderr before the completion is loaded.

``key(value)`` is the equality key of the exact comparison: two values have the same key exactly
when Python's ``==`` holds between them, except that bools are their own kind (``True != 1``) and
NaN equals NaN; ints and integral floats share a key (``2 == 2.0``), lists and tuples do not.

A *judge* (``judge``) runs a benchmark's own test code, never the completion, with a ``candidate``
whose calls travel through the scorer to the server: the route for tests that are not
input/output lists (the original HumanEval's asserts).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys

SEND_LIMIT = 1 << 20  # an encoded value larger than this travels as the sha256 of its key
MAX_DEPTH = 200
SCALARS = (type(None), bool, int, float, str)


def _item(x):
    """numpy scalars as the Python numbers they hold (a solution may compute with numpy); any other
    non-builtin type is refused."""
    if type(x).__module__ == "numpy" and hasattr(x, "item") and getattr(x, "shape", None) == ():
        return x.item()
    return x


BIG_INT = 1 << 64  # ints at least this large travel in hex (decimal conversion is quadratic in CPython)
_PLAIN = (type(None), bool, float, str)


def _plain_int(v) -> bool:
    return type(v) is int and -BIG_INT < v < BIG_INT


def encode(x, depth: int = 0):
    """A value as tagged JSON: scalars as JSON, a list as an array, anything else a one-key object."""
    if depth > MAX_DEPTH:
        raise ValueError("value nested too deeply")
    x = _item(x)
    t = type(x)
    if t is int:
        return x if -BIG_INT < x < BIG_INT else {"int": format(x, "x")}
    if t in _PLAIN:
        return x
    if t is list:
        if all(type(v) in _PLAIN or _plain_int(v) for v in x):  # the common case, a flat list, at C speed
            return x
        return [encode(v, depth + 1) for v in x]
    if t is tuple:
        return {"tuple": [encode(v, depth + 1) for v in x]}
    if t in (set, frozenset):
        return {t.__name__: [encode(v, depth + 1) for v in x]}
    if t is dict:
        return {"dict": [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in x.items()]}
    if t is complex:
        return {"complex": [x.real, x.imag]}
    if t is bytes:
        return {"bytes": x.hex()}
    raise TypeError(f"cannot send a {t.__name__}")


def decode(x, depth: int = 0):
    """The inverse of ``encode``; raises ValueError on anything ``encode`` cannot have produced."""
    if depth > MAX_DEPTH:
        raise ValueError("value nested too deeply")
    t = type(x)
    if t in SCALARS:
        return x
    if t is list:
        if all(type(v) in SCALARS for v in x):  # a flat list: already plain values
            return x
        return [decode(v, depth + 1) for v in x]
    if t is not dict or len(x) != 1:
        raise ValueError(f"not an encoded value: {type(x).__name__}")
    (tag, body), = x.items()
    if tag in ("tuple", "set", "frozenset") and type(body) is list:
        items = [decode(v, depth + 1) for v in body]
        return {"tuple": tuple, "set": set, "frozenset": frozenset}[tag](items)
    if tag == "dict" and type(body) is list and all(type(p) is list and len(p) == 2 for p in body):
        return {decode(k, depth + 1): decode(v, depth + 1) for k, v in body}
    if tag == "complex" and type(body) is list and len(body) == 2 and all(type(v) in (int, float) for v in body):
        return complex(*body)
    if tag == "bytes" and type(body) is str:
        return bytes.fromhex(body)
    if tag == "int" and type(body) is str:
        return int(body, 16)
    raise ValueError(f"not an encoded value: tag {tag!r}")


def _number_key(v) -> str:
    """An int or float's key: integral floats as the int (2.0 = 2), ints past BIG_INT in hex
    (decimal conversion is quadratic), the rest as repr (a float's always has '.', 'e', inf or nan)."""
    if type(v) is float and v.is_integer():
        v = int(v)
    return f"x{v:x}" if type(v) is int and not -BIG_INT < v < BIG_INT else repr(v)


def _key(x, out: list) -> None:
    x = _item(x)
    t = type(x)
    if t is list and all(type(v) is int or type(v) is float for v in x):  # a flat list of numbers, at C speed
        values = [int(v) if type(v) is float and v.is_integer() else v for v in x]
        if all(type(v) is float or -BIG_INT < v < BIG_INT for v in values):
            out.append("n" + repr(values))
            return
    if x is None:
        out.append("N")
    elif t is bool:
        out.append("T" if x else "F")
    elif t is int or t is float:
        out.append("i" + _number_key(x))
    elif t is str:
        out.append(f"s{len(x)}:{x}")
    elif t is bytes:
        out.append(f"b{x.hex()}")
    elif t is complex:
        out.append("c(")
        _key(x.real, out)
        out.append(",")
        _key(x.imag, out)
        out.append(")")
    elif t in (list, tuple):
        out.append("[" if t is list else "(")
        for v in x:
            _key(v, out)
            out.append(",")
        out.append("]" if t is list else ")")
    elif t in (set, frozenset, dict):
        items = [key(v) for v in x] if t is not dict else [key(k) + ":" + key(v) for k, v in x.items()]
        out.append("{" + ",".join(sorted(items)) + "}")
    else:
        raise TypeError(f"no key for a {t.__name__}")


def key(x) -> str:
    """The exact-comparison key (see the module's docstring)."""
    out: list[str] = []
    _key(x, out)
    return "".join(out)


def digest(x) -> str:
    return hashlib.sha256(key(x).encode("utf-8", "surrogatepass")).hexdigest()


def reply_for(value, send_limit: int | None) -> str:
    """The reply line for a computed value: the value, or its digest when larger than ``send_limit``."""
    encoded = json.dumps({"v": encode(value)})
    if send_limit is not None and len(encoded) > send_limit:
        return json.dumps({"digest": digest(value)})
    return encoded


def _channel():
    """The reply channel: private copies of fds 0 and 1; the program's own stdin reads nothing and
    its stdout goes to stderr, so nothing it prints can pose as a reply."""
    chan_in = os.fdopen(os.dup(0), "rb")
    chan_out = os.fdopen(os.dup(1), "wb")
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(2, 1)
    sys.stdin, sys.stdout = open(os.devnull), sys.stderr

    def send(message: dict | str) -> None:
        line = message if isinstance(message, str) else json.dumps(message)
        chan_out.write(line.encode("utf-8", "surrogatepass") + b"\n")
        chan_out.flush()

    return chan_in, send


def serve(source: str, entry_point: str) -> None:
    """Load ``source`` and answer calls of ``entry_point`` until the scorer closes the channel."""
    chan_in, send = _channel()
    namespace = {"__name__": "__candidate__", "__builtins__": __builtins__}
    try:
        exec(compile(source, "<completion>", "exec"), namespace)  # noqa: S102 - inside the sandbox
        fn = namespace[entry_point]
    except BaseException as err:  # noqa: BLE001 - anything the completion raises is its failure
        send({"error": f"load: {type(err).__name__}"})
        return
    send({"ready": True})
    for line in chan_in:
        request = json.loads(line)
        try:
            send(reply_for(fn(*decode(request["args"])), request.get("send_limit")))
        except BaseException as err:  # noqa: BLE001
            send({"error": type(err).__name__})


def judge(source: str, entry_point: str) -> None:
    """Run a benchmark's test code (``source``: its helpers, the prompt, ``check``) on a candidate
    served elsewhere; reports ``{"verdict": "pass"}`` or ``{"verdict": "fail", ...}``. The entry
    point's name refers to the candidate too, as in a program of prompt + completion + test (the
    test of HumanEval/33 calls ``sort_third`` by name)."""
    chan_in, send = _channel()

    def candidate(*args):
        send({"args": encode(list(args))})
        reply = json.loads(chan_in.readline() or "{}")
        if "v" not in reply:
            raise AssertionError(f"the candidate failed: {reply.get('error', 'no reply')}")
        return decode(reply["v"])

    namespace = {"__name__": "__judge__", "__builtins__": __builtins__}
    try:
        exec(compile(source, "<benchmark test>", "exec"), namespace)  # noqa: S102 - the benchmark's own code
        namespace[entry_point] = candidate
        namespace["check"](candidate)
    except BaseException as err:  # noqa: BLE001
        send({"verdict": "fail", "error": type(err).__name__})
        return
    send({"verdict": "pass"})


def main() -> None:
    """Inside the sandbox: ``python3 -I harness.py serve|judge ENTRY``, the source in program.py."""
    if hasattr(sys, "set_int_max_str_digits"):
        sys.set_int_max_str_digits(0)
    sys.setrecursionlimit(10_000)
    role, entry_point = sys.argv[1], sys.argv[2]
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "program.py"), encoding="utf-8") as f:
        source = f.read()
    serve(source, entry_point) if role == "serve" else judge(source, entry_point)


if __name__ == "__main__":
    main()
