"""Table 1's ten benchmarks scored right: for every task of config/paper.yaml, built exactly as the
paper config builds it (lighteval's definition, our sampling, pass@k) on rows in its hub dataset's
own columns and types (tests/fixtures/benchmarks), the gold answer written the way the prompt asks a
model to write it, boxed, and after a Thinking model's ``</think>``, scores 1 through every pass@k
metric of the task, and a wrong answer 0. HumanEval+ is in test_code_scoring.py."""

import copy
import json
import random
from pathlib import Path

import pytest
import yaml
from lighteval.models.model_output import ModelResponse

from melt_core.data import DataError
from melt_core.evaluation.lighteval_tasks import InShard, builtin_task_configs, sample_correct

ROOT = Path(__file__).resolve().parents[1]
ROWS = ROOT / "tests" / "fixtures" / "benchmarks"
PAPER = yaml.safe_load((ROOT / "config" / "paper.yaml").read_text())["eval"]["tasks"]


def task(name: str, **override) -> list:
    spec = {k: v for k, v in PAPER[name].items() if k != "shards"}
    spec.update(name=name, data_dir=str(ROWS / name), **override)
    return builtin_task_configs(spec)


def rows(name: str, rel: str | None = None) -> list[dict]:
    path = ROWS / name / (rel or next(p.name for p in (ROWS / name).glob("*.jsonl")))
    return [json.loads(line) for line in path.read_text().splitlines()]


def answers(name: str, row: dict, doc) -> tuple[list[str], list[str]]:
    """(right answers as a model writes them, wrong ones) for one row."""
    if name in ("aime24", "aime25", "aime26", "amc23"):
        gold, wrong = str(row["answer"]).removesuffix(".0"), str(int(row["answer"]) + 1)
        said = "Therefore, the final answer is: $\\boxed{{{}}}$. I hope it is correct"
        return ([said.format(gold), f"\\boxed{{{gold}}}", f"<think>so {wrong}? no</think>\n{said.format(gold)}"],
                [said.format(wrong), f"<think>it is {gold}</think>\n{said.format(wrong)}"])
    if name == "math500":
        gold = row["answer"]
        return ([f"Steps.\nANSWER: {gold}", f"Steps.\nANSWER: ${gold}$", f"So $\\boxed{{{gold}}}$.",
                 f"<think>hmm</think>\nANSWER: {gold}"],
                ["ANSWER: 7", "ANSWER: p + q", f"<think>{gold}</think>\nANSWER: 0",
                 f"<think>so $\\boxed{{{gold}}}$</think>\nANSWER: 0",  # only the answer after thinking counts
                 f"Is it $\\boxed{{{gold}}}$? No: $\\boxed{{7}}$."])  # the last boxed answer counts
    if name == "olympiadbench":
        gold = ", ".join(a.strip("$") for a in row["final_answer"])
        return ([f"So the final answer is \\boxed{{{gold}}}.", f"So the final answer is ${gold}$.",
                 f"<think>hmm</think>\nSo the final answer is \\boxed{{{gold}}}."],
                ["So the final answer is \\boxed{3}.", f"<think>{gold}</think>\nSo the final answer is \\boxed{{0}}.",
                 f"<think>\\boxed{{{gold}}}</think>\nSo the final answer is 3.",
                 f"First \\boxed{{{gold}}}, then the final answer is \\boxed{{3}}."])
    if name == "gpqa":
        letter, other = "ABCD"[doc.gold_index], "ABCD"[(doc.gold_index + 1) % 4]
        return ([f"Reasoning.\nAnswer: {letter}", f"<think>maybe {other}</think>\nAnswer: {letter}"],
                [f"Answer: {other}", f"<think>{letter}</think>\nAnswer: {other}"])
    if name == "hle":
        gold = row["answer"]
        said = "Explanation: because.\nAnswer: {}\nConfidence: 90%"
        return ([said.format(gold), f"\\boxed{{{gold}}}", f"<think>x</think>\n{said.format(gold)}"],
                [said.format("42"), f"<think>{gold}</think>\n{said.format('Lyon')}"])
    if name == "mmlu_redux":
        letter, other = "ABCD"[row["answer"]], "ABCD"[(row["answer"] + 1) % 4]
        return [letter, f"{letter}. {row['choices'][row['answer']]}"], [other]
    raise KeyError(name)


OVERRIDE = {"mmlu_redux": {"lighteval": "mmlu_redux/mmlu_redux_2:a[bn][sa]*"},  # the two subjects held here
            "hle": {"select": {**PAPER["hle"]["select"], "n": 3}}}  # all three text-only rows of the fixture
CASES = ["aime24", "aime25", "aime26", "amc23", "math500", "olympiadbench", "gpqa", "hle", "mmlu_redux"]


@pytest.mark.parametrize("name", CASES)
def test_gold_scores_one_and_a_wrong_answer_zero_through_every_pass_at_k(name):
    configs = task(name, **OVERRIDE.get(name, {}))
    assert len(configs) == (2 if name == "mmlu_redux" else 1)
    checked = 0
    for config in configs:
        subset = config.name.split(":")[-1] if name == "mmlu_redux" else None
        for row in rows(name, f"{subset}/test.jsonl" if subset else None):
            doc = config.prompt_function(row, config.name)
            if doc is None:
                assert name == "hle" and row["image"], row  # HLE's image questions are left out by its prompt
                continue
            question = row.get("problem") or row.get("question") or row.get("Question")
            assert question.strip() in doc.query, (name, doc.query[:200])
            right, wrong = answers(name, row, doc)
            for text in right:
                assert sample_correct(config, doc, text), (name, text, doc.get_golds())
            for text in wrong:
                assert not sample_correct(config, doc, text), (name, text, doc.get_golds())
            for metric in config.metrics:  # pass@k over n samples: all right 1, all wrong 0
                n = metric.sample_level_fn.n
                assert metric.sample_level_fn.compute(doc, ModelResponse(text=[right[0]] * n)) == 1.0
                assert metric.sample_level_fn.compute(doc, ModelResponse(text=[wrong[0]] * n)) == 0.0
            checked += 1
    assert checked >= 2


def test_answers_typed_as_numbers_become_text():
    """AIME26's int64 and AMC23's float answers: scoring raised AttributeError ('int' has no strip)."""
    for name, expected in (("aime26", "27"), ("amc23", "27")):
        config = task(name)[0]
        doc = config.prompt_function(rows(name)[0], config.name)
        assert doc.choices == [expected]


def test_gpqa_option_order_is_a_function_of_the_question_alone():
    """The same prompt and letter in any shard and any job, whatever random was drawn before."""
    config = task("gpqa")[0]
    data = rows("gpqa")
    first = {r["Record ID"]: (d.query, d.gold_index) for r in data for d in [config.prompt_function(r, config.name)]}
    random.seed(12345)
    random.random()
    again = {r["Record ID"]: (d.query, d.gold_index) for r in reversed(data)
             for d in [config.prompt_function(r, config.name)]}
    assert again == first
    for n in (2, 3):
        for i in range(n):
            keep = InShard([i, n])
            for r in data:
                if keep(r):
                    d = config.prompt_function(copy.deepcopy(r), config.name)
                    assert (d.query, d.gold_index) == first[r["Record ID"]]
    drawn = {config.prompt_function({**data[0], "Record ID": f"rec{i}"}, config.name).gold_index for i in range(20)}
    assert drawn == {0, 1, 2, 3}  # the position is drawn per question, not fixed


def test_gpqa_rows_without_an_id_read_the_same_whatever_else_the_row_holds():
    """A row without `Record ID` is seeded by its question: the same option order whatever other
    fields the loading added or rendered differently (a shard's rows did: 2 of 4 moved when the
    whole row was hashed); a row with neither id nor question is refused by name."""
    config = task("gpqa")[0]
    bare = [{k: v for k, v in r.items() if k != "Record ID"} for r in rows("gpqa")]
    first = [(d.query, d.gold_index) for r in bare for d in [config.prompt_function(r, config.name)]]
    for extra in ({"__index_level_0__": 7}, {"Explanation": "rendered otherwise"}, {"Canary String": None}):
        again = [(d.query, d.gold_index) for r in bare for d in [config.prompt_function({**r, **extra}, config.name)]]
        assert again == first, extra
    drawn = {config.prompt_function({**bare[0], "Question": f"Which particle, case {i}?"}, config.name).gold_index
             for i in range(20)}
    assert drawn == {0, 1, 2, 3}  # still drawn per question
    with pytest.raises(DataError, match="no id .* and no question text"):
        config.prompt_function({k: v for k, v in bare[0].items() if k not in ("Question",)}, config.name)


def test_a_missing_mmlu_subject_is_an_error_naming_it():
    with pytest.raises(DataError, match="no folder for subset 'astronomy'"):
        task("mmlu_redux", lighteval="mmlu_redux/mmlu_redux_2:a*")
