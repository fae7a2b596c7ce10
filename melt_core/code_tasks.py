"""HumanEval+ (evalplus/humanevalplus), which lighteval does not define: a lighteval task of
our own whose scorer runs each completion against the benchmark's tests.

Scoring executes model-generated code, always inside the bubblewrap sandbox of
melt_core/sandbox.py (no network, no host files, private PID namespace killed whole, CPU,
memory, process, file-size and output limits); a task opts in with ``allow_code_execution: true``.
A pass means every test ran and passed: the scorer hands the program a fresh nonce on stdin,
and only the harness code after ``check(...)`` writes it back, so a program that exits early
(``exit()`` under ``__main__``, ``os._exit(0)``, an atexit hook, ``sys.excepthook``, a raised
``SystemExit(0)``) fails whatever its exit status.
"""

from __future__ import annotations

import re
import secrets

from lighteval.models.model_output import ModelResponse
from lighteval.tasks.requests import Doc

INSTRUCTION = ("Complete the following Python function. Give the whole function, with any imports it "
               "needs, in one ```python code block.\n\n")
_BLOCK = re.compile(r"```(?:python|py)?\n(.*?)```", re.DOTALL)
TIMEOUT_S = 20.0  # per completion, wall clock (CPU time is capped one second above it)
MEMORY_GB = 2.0  # address space per process inside the sandbox
# Harness around the program: the nonce is read before the model's code runs and written back
# only after the tests, then the interpreter ends at once (no atexit hook, no thread runs after).
PROLOGUE = "import sys as _melt_sys\n_melt_nonce = _melt_sys.stdin.readline().strip()\ndel _melt_sys\n"
EPILOGUE = "\nimport os as _melt_os\n_melt_os.write(1, ('\\n' + _melt_nonce + '\\n').encode())\n_melt_os._exit(0)\n"


def humaneval_prompt(line: dict, task_name: str | None = None) -> Doc:
    return Doc(query=INSTRUCTION + line["prompt"], choices=[line["canonical_solution"]], gold_index=0,
               task_name=task_name,
               specific={"prompt": line["prompt"], "test": line["test"], "entry_point": line["entry_point"]})


def program(doc: Doc, completion: str) -> str:
    """The code to run: the last python block after any reasoning (or the bare completion as the
    function's body), after the benchmark's prompt (its imports and signature), then the tests."""
    answer = completion.split("</think>")[-1]
    blocks = _BLOCK.findall(answer)
    code = blocks[-1] if blocks else answer
    spec = doc.specific
    if not re.search(rf"def\s+{re.escape(spec['entry_point'])}\s*\(", code):
        code = spec["prompt"] + code  # a continuation of the signature: the function's body
    else:
        code = spec["prompt"] + "\n    pass\n\n" + code  # keep the prompt's imports; the block redefines it
    return f"{PROLOGUE}{code}\n\n{spec['test']}\n\ncheck({spec['entry_point']})\n{EPILOGUE}"


class PassesTests:
    """1.0 when every test of the benchmark ran and passed inside the sandbox, else 0.0 (errors,
    early exits, timeouts, no code)."""

    def __init__(self, unsafe_no_sandbox: bool = False):
        self.unsafe_no_sandbox = unsafe_no_sandbox

    def __call__(self, doc: Doc, model_response: ModelResponse, **kwargs) -> float:
        from .sandbox import Limits, run_untrusted

        nonce = secrets.token_hex(16)
        limits = Limits(timeout_s=TIMEOUT_S, cpu_s=int(TIMEOUT_S) + 1, memory_bytes=int(MEMORY_GB * 2**30))
        result = run_untrusted(program(doc, model_response.text[0]), stdin=(nonce + "\n").encode(), limits=limits,
                               unsafe_no_sandbox=self.unsafe_no_sandbox)
        passed = result.returncode == 0 and f"\n{nonce}\n".encode() in result.output
        return float(passed)
