"""HumanEval+ (evalplus/humanevalplus), which lighteval does not define: a lighteval task of
our own whose scorer runs each completion against the benchmark's tests.

The untrusted process computes; the scorer judges. Model-written code runs only inside the
bubblewrap sandbox of melt_core/evaluation/sandbox.py, as a server (melt_core/evaluation/code_harness.py) that answers
calls of the entry point with the values it computed, in a JSON format that decodes to plain
builtins. No pass signal, nonce or expected value is ever inside the sandbox, so nothing the
program prints, exits with, patches or reads can make it pass. A task opts in with
``allow_code_execution: true``. The benchmark's ``test`` field is read as data (``ast``), in the
shapes evalplus writes it (tools/humaneval/to_original_fmt.py):

* ``io``: literal ``inputs`` and ``results`` lists and ``assertion(candidate(*inp), exp, atol)``:
  the scorer compares each output with evalplus's ``assertion`` (exact, else ``allclose`` with
  ``atol``, or 1e-6 where the expected value is float), bools strict, lists and tuples distinct.
* ``reference``: literal ``inputs`` and a ``ref_func`` (problems whose outputs are too large to
  store): the expected values are the reference's, computed by the same server in a sandbox of
  their own; outputs over ``code_harness.SEND_LIMIT`` are compared by the sha256 of their key.
* ``root`` (HumanEval/32, ``find_zero``): the output must be a number x with |poly(xs, x)| <= atol.
  The dataset's own line, ``_poly(*candidate(*inp), inp) <= atol``, unpacks a float and fails for
  every program, the reference included; we judge the property it means.
* ``script``: anything else (the original HumanEval's asserts): the benchmark's own test code runs
  in a second sandbox (``code_harness.judge``) whose ``candidate`` is a stub whose calls the scorer
  relays to the server, so the test's interpreter never holds the completion's code or objects.
  Its verdict is the test code's: it rules out every attack on the interpreter (frames, builtins,
  exit status, output, ``__eq__``), not a weak test.

Time: as evalplus does, each input may take TIME_FACTOR times what the benchmark's own solution
takes on it in the same harness (at least MIN_CALL_S), measured once per problem; loading the
completion, and a whole assert-style test, get TIMEOUT_S.
"""

from __future__ import annotations

import ast
import math
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from lighteval.models.model_output import ModelResponse
from lighteval.tasks.requests import Doc

from . import code_harness
from .code_harness import decode, digest, encode, key
from .sandbox import Limits, Sandboxed

INSTRUCTION = ("Complete the following Python function. Give the whole function, with any imports it "
               "needs, in one ```python code block.\n\n")
_BLOCK = re.compile(r"```(?:python|py)?\n(.*?)```", re.DOTALL)
TIMEOUT_S = 20.0  # wall clock to start and load a completion, and for a whole assert-style test
MEMORY_GB = 2.0  # address space per process inside the sandbox
# Per-input time limits, as evalplus sets them: a multiple of what the benchmark's own solution
# takes on that input in the same harness (measured once per problem, REFERENCE_S at most), and
# never under MIN_CALL_S
TIME_FACTOR, MIN_CALL_S, REFERENCE_S = 4.0, 1.0, 120.0
HARNESS_SOURCE = Path(code_harness.__file__).read_text()


def humaneval_prompt(line: dict, task_name: str | None = None) -> Doc:
    return Doc(query=INSTRUCTION + line["prompt"], choices=[line["canonical_solution"]], gold_index=0,
               task_name=task_name,
               specific={"prompt": line["prompt"], "test": line["test"], "entry_point": line["entry_point"]})


def program(doc: Doc, completion: str) -> str:
    """The code to serve: the last python block after any reasoning (or the bare completion as the
    function's body), after the benchmark's prompt (its imports, helpers and signature)."""
    answer = completion.split("</think>")[-1]
    blocks = _BLOCK.findall(answer)
    code = blocks[-1] if blocks else answer
    spec = doc.specific
    if not re.search(rf"def\s+{re.escape(spec['entry_point'])}\s*\(", code):
        return spec["prompt"] + code  # a continuation of the signature: the function's body
    return spec["prompt"] + "\n    pass\n\n" + code  # keep the prompt's imports; the block redefines it


# ----------------------------------------------------------------------------- the tests, as data
@dataclass
class Digest:
    """An expected value known only by the sha256 of its key (too large to send)."""
    hex: str


@dataclass
class TestPlan:
    kind: str  # io | reference | root | script
    inputs: list = field(default_factory=list)
    results: list | None = None  # io: from the test; reference: filled by the reference's run
    atol: float = 0.0
    source: str = ""  # reference: the test module without check(); script: prompt + test code
    budgets: list[float] = field(default_factory=list)  # seconds each input may take (TIME_FACTOR)


class _unlimited_int_digits:
    """evalplus writes integers of any size into its tests (HumanEval/83's have ~10^6 digits)."""

    def __enter__(self):
        self.saved = sys.get_int_max_str_digits()
        sys.set_int_max_str_digits(0)

    def __exit__(self, *exc):
        sys.set_int_max_str_digits(self.saved)


def _is_call(node, name: str, starred_arg: str | None = None) -> bool:
    ok = isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == name
    if ok and starred_arg is not None:
        ok = (len(node.args) == 1 and isinstance(node.args[0], ast.Starred)
              and isinstance(node.args[0].value, ast.Name) and node.args[0].value.id == starred_arg)
    return ok


def parse_tests(test: str, prompt: str) -> TestPlan:
    """The benchmark's test code as a TestPlan (see the module docstring for the shapes)."""
    script = TestPlan("script", source=prompt + "\n    pass\n\n" + test)
    with _unlimited_int_digits():
        tree = ast.parse(test)
    check = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "check"), None)
    if check is None:
        return script
    assigned = {n.targets[0].id: n.value for n in check.body if isinstance(n, ast.Assign) and len(n.targets) == 1
                and isinstance(n.targets[0], ast.Name)}
    loops = [n for n in check.body if isinstance(n, ast.For)]
    if "inputs" not in assigned or len(loops) != 1 or len(loops[0].body) != 1 or len(check.body) != len(assigned) + 1:
        return script
    try:
        with _unlimited_int_digits():
            inputs = ast.literal_eval(assigned["inputs"])
            results = ast.literal_eval(assigned["results"]) if "results" in assigned else None
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return script
    if not isinstance(inputs, list) or not all(isinstance(i, list) for i in inputs):
        return script
    stmt = loops[0].body[0]
    target = loops[0].target  # `i, (inp, exp)` or `i, inp`
    names = [n.id for n in ast.walk(target) if isinstance(n, ast.Name)]
    inp = names[1] if len(names) >= 2 else None
    if (isinstance(stmt, ast.Expr) and _is_call(stmt.value, "assertion") and len(stmt.value.args) == 3
            and _is_call(stmt.value.args[0], "candidate", inp) and isinstance(stmt.value.args[2], ast.Constant)):
        atol = float(stmt.value.args[2].value)
        expected = stmt.value.args[1]
        if isinstance(expected, ast.Name) and results is not None and len(results) == len(inputs):
            return TestPlan("io", inputs, results, atol)
        if _is_call(expected, "ref_func", inp) and results is None:
            module = ast.Module([n for n in tree.body if n is not check], type_ignores=[])
            return TestPlan("reference", inputs, None, atol, source=ast.unparse(module))
    if (isinstance(stmt, ast.Assert) and isinstance(stmt.test, ast.Compare) and len(stmt.test.ops) == 1
            and isinstance(stmt.test.ops[0], ast.LtE) and isinstance(stmt.test.comparators[0], ast.Constant)
            and _is_call(stmt.test.left, "_poly") and all(len(i) == 1 for i in inputs)):
        return TestPlan("root", inputs, None, float(stmt.test.comparators[0].value))
    return script


# evalplus's `assertion` helper as its hub rows carry it (tools/humaneval/to_original_fmt.py)
EVALPLUS_ASSERTION = """import numpy as np

def is_floats(x) -> bool:
    # check if it is float; List[float]; Tuple[float]
    if isinstance(x, float):
        return True
    if isinstance(x, (list, tuple)):
        return all(isinstance(i, float) for i in x)
    if isinstance(x, np.ndarray):
        return x.dtype == np.float64 or x.dtype == np.float32
    return False


def assertion(out, exp, atol):
    exact_match = out == exp

    if atol == 0 and is_floats(exp):
        atol = 1e-6
    if not exact_match and atol != 0:
        np.testing.assert_allclose(out, exp, atol=atol)
    else:
        assert exact_match
"""


def evalplus_test(inputs: list, results: list, atol: float = 0, imports: str = "", aux_fn: str = EVALPLUS_ASSERTION,
                  assertion: str | None = None) -> str:
    """A ``test`` field in the shape evalplus/humanevalplus rows have (input/output lists)."""
    assertion = assertion or f"assertion(candidate(*inp), exp, {atol})"
    return (f"{imports}\n\n{aux_fn}\n\ndef check(candidate):\n    inputs = {inputs}\n    results = {results}\n"
            f"    for i, (inp, exp) in enumerate(zip(inputs, results)):\n        {assertion}\n")


def evalplus_crosscheck(inputs: list, ref_func: str, atol: float = 0) -> str:
    """A ``test`` field of evalplus's cross-check shape (outputs too large to store: a reference)."""
    return (f"{EVALPLUS_ASSERTION}\n\n{ref_func}\n\ndef check(candidate):\n    inputs = {inputs}\n"
            f"    for i, inp in enumerate(inputs):\n        assertion(candidate(*inp), ref_func(*inp), {atol})\n")


# ----------------------------------------------------------------------------- judging, in the scorer
def is_floats(x) -> bool:
    """evalplus's: a float, or a list/tuple of floats only (its numpy branch: arrays never arrive)."""
    return type(x) is float or (type(x) in (list, tuple) and all(type(v) is float for v in x))


def _close(out, exp, atol: float, rtol: float = 1e-7) -> bool:
    """numpy.testing.assert_allclose's test, on plain numbers and equal-shaped sequences of them;
    bools are not numbers here."""
    if type(exp) in (list, tuple):
        return type(out) in (list, tuple) and len(out) == len(exp) and all(
            _close(o, e, atol, rtol) for o, e in zip(out, exp))
    if type(out) not in (int, float) or type(exp) not in (int, float):
        return False
    try:
        if math.isnan(out) or math.isnan(exp):
            return math.isnan(out) and math.isnan(exp)
        if math.isinf(out) or math.isinf(exp):
            return out == exp
        return abs(out - exp) <= atol + rtol * abs(exp)
    except OverflowError:
        return False


def assertion_holds(out, exp, atol: float) -> bool:
    """evalplus's ``assertion(out, exp, atol)`` with strict types: an exact match of keys, else,
    for float results or a nonzero atol, closeness."""
    if key(out) == key(exp):
        return True
    if atol == 0 and is_floats(exp):
        atol = 1e-6
    return atol != 0 and _close(out, exp, atol)


def is_root(xs: list, x, atol: float) -> bool:
    if type(x) not in (int, float) or not all(type(c) in (int, float) for c in xs):
        return False
    try:
        return abs(math.fsum(c * math.pow(x, i) for i, c in enumerate(xs))) <= atol
    except (OverflowError, ValueError):
        return False


def agrees(reply: dict | None, expected, plan: TestPlan, inp: list) -> bool:
    """Whether one reply of the server is the right output for input ``inp``."""
    if reply is None or len(reply) != 1:
        return False
    try:
        if "digest" in reply:
            return type(reply["digest"]) is str and reply["digest"] == (
                expected.hex if isinstance(expected, Digest) else digest(expected))
        if "v" not in reply:
            return False
        out = decode(reply["v"])
        if plan.kind == "root":
            return is_root(inp[0], out, plan.atol)
        if isinstance(expected, Digest):
            return digest(out) == expected.hex
        return assertion_holds(out, expected, plan.atol)
    except (ValueError, TypeError, RecursionError):
        return False


def _call(box: Sandboxed, inp: list) -> dict | None:
    """One call of the served function on ``inp``: its reply (a value, or the digest of a large
    one), or None when it cannot be asked or does not answer in time."""
    return box.receive() if box.send({"args": encode(inp), "send_limit": code_harness.SEND_LIMIT}) else None


class PassesTests:
    """1.0 when every test of the benchmark ran and the scorer judged every output right, else 0.0
    (errors, exits, timeouts, wrong or unreadable outputs, no code). A sandbox that cannot run
    raises (melt_core.evaluation.sandbox.SandboxError): never a score."""

    def __init__(self, unsafe_no_sandbox: bool = False):
        self.unsafe_no_sandbox = unsafe_no_sandbox
        self.plans: dict[str, TestPlan] = {}

    def limits(self, seconds: float = TIMEOUT_S) -> Limits:
        return Limits(timeout_s=seconds, cpu_s=int(seconds) + 1, memory_bytes=int(MEMORY_GB * 2**30))

    def _server(self, source: str, entry_point: str, seconds: float = TIMEOUT_S) -> Sandboxed:
        return Sandboxed({"harness.py": HARNESS_SOURCE, "program.py": source}, ["harness.py", "serve", entry_point],
                         self.limits(seconds), self.unsafe_no_sandbox)

    def plan(self, doc: Doc) -> TestPlan:
        """The problem's tests as data, with its per-input time limits (and, for a cross-check, its
        expected values) from one run of the benchmark's own solution; once per problem."""
        spec = doc.specific
        if spec["test"] not in self.plans:
            plan = parse_tests(spec["test"], spec["prompt"])
            if plan.kind != "script":  # a cross-check's reference, else the dataset's canonical solution
                reference = plan.kind == "reference"
                outputs, seconds = self._run_solution(
                    plan, plan.source if reference else program(doc, doc.choices[0]),
                    "ref_func" if reference else spec["entry_point"])
                plan.results = outputs if reference else plan.results
                plan.budgets = [max(MIN_CALL_S, TIME_FACTOR * t) for t in seconds]
            self.plans[spec["test"]] = plan
        return self.plans[spec["test"]]

    def _run_solution(self, plan: TestPlan, source: str, entry_point: str) -> tuple[list, list[float]]:
        """The benchmark's own solution on every input, in the harness a completion gets: its
        outputs (values, or digests of large ones) and the seconds each input took."""
        outputs, seconds = [], []
        with self._server(source, entry_point, TIMEOUT_S + REFERENCE_S * len(plan.inputs)) as box:
            box.allow(TIMEOUT_S)
            ready = box.receive()
            for i, inp in enumerate(plan.inputs):
                box.allow(REFERENCE_S)
                start = time.monotonic()
                reply = _call(box, inp)
                seconds.append(time.monotonic() - start)
                if not reply or len(reply) != 1 or not ({"v", "digest"} & set(reply)):
                    raise RuntimeError(f"the benchmark's own solution failed on input #{i} (ready: {ready}, reply: "
                                       f"{str(reply)[:200]}); its test cannot be judged")
                outputs.append(Digest(reply["digest"]) if "digest" in reply else decode(reply["v"]))
        return outputs, seconds

    def __call__(self, doc: Doc, model_response: ModelResponse, **kwargs) -> float:
        plan = self.plan(doc)
        source = program(doc, model_response.text[0])
        if plan.kind == "script":
            return float(self._judged_by_script(plan, source, doc.specific["entry_point"]))
        with self._server(source, doc.specific["entry_point"], TIMEOUT_S + sum(plan.budgets)) as box:
            box.allow(TIMEOUT_S)
            if box.receive() != {"ready": True}:
                return 0.0
            for inp, expected, budget in zip(plan.inputs, plan.results or [None] * len(plan.inputs), plan.budgets):
                box.allow(budget)
                if not agrees(_call(box, inp), expected, plan, inp):
                    return 0.0
        return 1.0

    def _judged_by_script(self, plan: TestPlan, source: str, entry_point: str) -> bool:
        """The benchmark's test code in one sandbox, the completion in another, each call relayed
        through here as decoded, re-encoded values."""
        judge_files = {"harness.py": HARNESS_SOURCE, "program.py": plan.source}
        with self._server(source, entry_point) as server, \
                Sandboxed(judge_files, ["harness.py", "judge", entry_point], self.limits(),
                          self.unsafe_no_sandbox) as judge:
            ready = server.receive() == {"ready": True}
            while (message := judge.receive()) is not None:
                if "verdict" in message:
                    return message == {"verdict": "pass"}
                reply = {"error": "no reply"}
                if ready and set(message) == {"args"} and server.send({"args": message["args"], "send_limit": None}):
                    answer = server.receive()
                    try:
                        if answer is not None and set(answer) == {"v"}:
                            reply = {"v": encode(decode(answer["v"]))}
                    except (ValueError, TypeError, RecursionError):
                        pass
                if not judge.send(reply):
                    return False
        return False
