"""HumanEval+ (evalplus/humanevalplus), which lighteval does not define: a lighteval task of
our own whose scorer runs each completion against the benchmark's tests.

Scoring executes model-generated code. It runs in a separate, isolated interpreter (``-I``),
in an empty temporary directory, with a minimal environment, a wall-clock timeout and CPU and
memory limits; it is not a sandbox against malicious code (no network or filesystem
isolation), so a task must opt in with ``allow_code_execution: true``, and on a cluster the
eval job is best run inside a container without network.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile

from lighteval.models.model_output import ModelResponse
from lighteval.tasks.requests import Doc

INSTRUCTION = ("Complete the following Python function. Give the whole function, with any imports it "
               "needs, in one ```python code block.\n\n")
_BLOCK = re.compile(r"```(?:python|py)?\n(.*?)```", re.DOTALL)
TIMEOUT_S = 20.0  # per completion, wall clock (CPU time is capped one second above it)
MEMORY_GB = 2.0


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
    return f"{code}\n\n{spec['test']}\n\ncheck({spec['entry_point']})\n"


def _limits(cpu_seconds: int, memory_bytes: int):
    def apply():
        import resource

        resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds))
        resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))

    return apply


class PassesTests:
    """1.0 when the completion passes the benchmark's tests, else 0.0 (errors, timeouts, no code)."""

    def __call__(self, doc: Doc, model_response: ModelResponse, **kwargs) -> float:
        with tempfile.TemporaryDirectory() as cwd:
            try:
                run = subprocess.run([sys.executable, "-I", "-c", program(doc, model_response.text[0])], cwd=cwd,
                                     env={"PATH": "/usr/bin:/bin"}, capture_output=True, timeout=TIMEOUT_S,
                                     preexec_fn=_limits(int(TIMEOUT_S) + 1, int(MEMORY_GB * 2**30)))
            except subprocess.TimeoutExpired:
                return 0.0
        return float(run.returncode == 0)
