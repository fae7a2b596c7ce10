"""The paper suite through lighteval's own task definitions (prompt function, dataset columns,
scorer), with our sampling and pass@k, on local copies of the datasets in their hub format;
and a dense transformers baseline sampled by the same generation code as Ouro and MELT."""

import json
import string
from types import SimpleNamespace

import pytest
import torch
from lighteval.models.model_output import ModelResponse
from numerics import assert_same_function
from train_helpers import tiny_setup

import melt_core
from melt_core.data import DataError, build_char_tokenizer
from melt_core.evaluation.evaluate import TaskSpec, evaluate
from melt_core.evaluation.lighteval_adapter import MeltLightevalModel, evaluate_lighteval
from melt_core.evaluation.metrics import pass_at_k
from melt_core.generation.generate import SamplingParams, generate
from melt_core.modeling.checkpoint import write_checksums
from melt_core.modeling.config import ConfigError
from melt_core.modeling.dense import DenseLM
from melt_core.serving.inference import ModelSpec

AIME_ROWS = [{"id": i, "problem": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(1, 7)]


def write_jsonl(folder, split, rows):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


@pytest.fixture(scope="module")
def wide(tmp_path_factory):
    """Random tiny Ouro and Qwen3 models whose character tokenizer covers printable ASCII and
    whose positions fit lighteval's real AIME prompt."""
    root = tmp_path_factory.mktemp("suite")
    tok = build_char_tokenizer(string.printable, root / "tok")
    cfg = melt_core.ModelConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                num_attention_heads=4, num_key_value_heads=2, total_ut_steps=2,
                                max_position_embeddings=1024, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    torch.manual_seed(0)
    ouro = melt_core.save_pretrained(melt_core.LoopedLM(cfg), root / "ouro", write_extra=tok.save_pretrained)
    from transformers import Qwen3Config, Qwen3ForCausalLM

    qcfg = Qwen3Config(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=1024,
                       bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=True)
    Qwen3ForCausalLM(qcfg).save_pretrained(root / "qwen3", safe_serialization=True)
    tok.save_pretrained(root / "qwen3")
    write_checksums(root / "qwen3")  # as the download rule leaves a hub snapshot
    aime = write_jsonl(root / "aime", "train", AIME_ROWS)
    return root, ouro, root / "qwen3", aime


def oracle(right: set[int]):
    """A stand-in for the model's generation: the gold answer, boxed as lighteval's math prompt
    asks, for the questions in ``right``; a wrong one for the rest. Records the prompts."""
    prompts = []

    def greedy_until(self, docs):
        out = []
        for doc in docs:
            prompts.append(self.prompt(doc))
            gold = doc.get_golds()[0]
            answer = gold if int(gold) // 2 in right else str(int(gold) + 1)
            text = f"So the answer is $\\boxed{{{answer}}}$."
            out.append(ModelResponse(input=doc.query, text=[text] * doc.num_samples,
                                     output_tokens=[[0]] * doc.num_samples))
        return out

    return greedy_until, prompts


def aime_task(aime, **kw):
    return TaskSpec(name="aime24", lighteval="aime/aime24", data_dir=str(aime), template="chatml-thinking",
                    samples=4, ks=[1, 2], max_new_tokens=16, **kw)


@pytest.mark.parametrize("right", [set(range(1, 7)), set(), {1, 2, 3}])
def test_lighteval_aime_definition_scores_what_the_answers_deserve(wide, monkeypatch, right):
    root, ouro, _, aime = wide
    greedy_until, prompts = oracle(right)
    monkeypatch.setattr(MeltLightevalModel, "greedy_until", greedy_until)
    res = evaluate_lighteval(ModelSpec("ouro", str(ouro)), aime_task(aime), root / "r.json")
    assert res["metrics"] == {"pass@1": len(right) / 6, "pass@2": len(right) / 6}
    assert res["n_questions"] == 6
    for d in res["details"]:
        assert d["correct"] == [int(d["gold"]) // 2 in right] * 4
    # lighteval's own AIME prompt, inside the model's chat template
    assert all(p.startswith("<|im_start|>user\n") and "Solve the following math problem" in p
               and p.endswith("<|im_start|>assistant\n<think>\n") for p in prompts)


def test_pass_at_k_over_samples_is_the_unbiased_estimator(wide, monkeypatch):
    """Question i gets i of its 6 samples right: pass@k per question is the closed form."""
    root, ouro, _, aime = wide

    def greedy_until(self, docs):
        out = []
        for doc in docs:
            i = int(doc.get_golds()[0]) // 2
            texts = [f"\\boxed{{{2 * i if s < i else -1}}}" for s in range(doc.num_samples)]
            out.append(ModelResponse(input=doc.query, text=texts, output_tokens=[[0]] * 6))
        return out

    monkeypatch.setattr(MeltLightevalModel, "greedy_until", greedy_until)
    task = TaskSpec(name="aime24", lighteval="aime/aime24", data_dir=str(aime), samples=6, ks=[1, 3, 6])
    res = evaluate_lighteval(ModelSpec("ouro", str(ouro)), task, root / "r.json")
    for k in (1, 3, 6):
        assert res["metrics"][f"pass@{k}"] == pytest.approx(sum(pass_at_k(6, c, k) for c in range(1, 7)) / 6)


def test_a_benchmark_lighteval_lacks_reuses_a_definition_with_renamed_columns(wide, monkeypatch):
    """AMC23-style: another dataset whose question column is called ``question``, scored with
    AIME's prompt and math scorer; a fixed seeded subset of its ids."""
    root, ouro, _, _ = wide
    rows = [{"qid": f"q{i}", "question": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(1, 11)]
    amc = write_jsonl(root / "amc", "test", rows)
    greedy_until, prompts = oracle(set(range(1, 11)))
    monkeypatch.setattr(MeltLightevalModel, "greedy_until", greedy_until)
    task = TaskSpec(name="amc23", lighteval="aime/aime24", data_dir=str(amc), split="test",
                    columns={"question": "problem"}, select={"n": 4, "seed": 0, "id_field": "qid"})
    res = evaluate_lighteval(ModelSpec("ouro", str(ouro)), task, root / "amc.json")
    assert res["n_questions"] == 4 and res["metrics"]["pass@1"] == 1.0
    again = evaluate_lighteval(ModelSpec("ouro", str(ouro)), task, root / "amc2.json")
    assert sorted(d["gold"] for d in again["details"]) == sorted(d["gold"] for d in res["details"])
    other = TaskSpec(**{**task.__dict__, "select": {"n": 4, "seed": 1, "id_field": "qid"}})
    moved = evaluate_lighteval(ModelSpec("ouro", str(ouro)), other, root / "amc3.json")
    assert sorted(d["gold"] for d in moved["details"]) != sorted(d["gold"] for d in res["details"])


def test_builtin_task_runs_our_model_end_to_end(wide):
    root, ouro, _, aime = wide
    melt = melt_core.convert_ouro_to_melt(ouro, root / "melt", gate="elementwise", seed=0)
    task = aime_task(aime, limit=2)
    for name, path in (("ouro", ouro), ("melt", melt)):
        res = evaluate_lighteval(ModelSpec(name, str(path), prefill_chunk=64), task, root / f"{name}.json")
        assert res["n_questions"] == 2 and all(len(d["completions"]) == 4 for d in res["details"])
        assert res["metrics"]["pass@1"] == 0.0  # random weights


def test_suite_bad_input(wide):
    root, ouro, _, aime = wide
    model = ModelSpec("ouro", str(ouro))
    with pytest.raises(melt_core.ConfigError, match="lighteval task 'nosuch/x' not found"):
        evaluate_lighteval(model, TaskSpec(name="x", lighteval="nosuch/x"), root / "x.json")
    with pytest.raises(melt_core.ConfigError, match="'aime' has no task matching 'aime27'; it defines: aime24"):
        evaluate_lighteval(model, TaskSpec(name="x", lighteval="aime/aime27", data_dir=str(aime)), root / "x.json")
    with pytest.raises(melt_core.ConfigError, match="downloads or queries the hub"):
        evaluate_lighteval(model, TaskSpec(name="x", lighteval="tiny_benchmarks/tiny:gsm8k"), root / "x.json")
    with pytest.raises(DataError, match="task 'x': cannot load dataset 'HuggingFaceH4/aime_2024'.*offline.*data_dir"):
        evaluate_lighteval(model, TaskSpec(name="x", lighteval="aime/aime24"), root / "x.json")
    with pytest.raises(melt_core.ConfigError, match="'loglikelihood_acc' does not score single generated samples"):
        evaluate_lighteval(model, TaskSpec(name="x", lighteval="aime/aime24", data_dir=str(aime),
                                           metric="loglikelihood_acc"), root / "x.json")
    with pytest.raises(DataError, match="data_dir .* does not exist"):
        evaluate_lighteval(model, TaskSpec(name="x", lighteval="aime/aime24", data_dir=str(root / "no")), root / "x")
    with pytest.raises(melt_core.ConfigError, match="exactly one of `path`"):
        TaskSpec(name="x")
    with pytest.raises(melt_core.ConfigError, match="use the lighteval backend|lighteval backend"):
        evaluate(model, TaskSpec(name="x", lighteval="aime/aime24"), root / "x.json")
    assert not (root / "x.json").exists()


def test_dense_model_decodes_like_transformers(wide):
    """Our generation loop driving a transformers Qwen3 gives transformers' own greedy tokens,
    batched with left padding or not."""
    from transformers import AutoModelForCausalLM

    _, _, qwen, _ = wide
    dense = DenseLM.from_pretrained(qwen)
    hf = AutoModelForCausalLM.from_pretrained(qwen)
    prompts = [[1, 40, 41, 42, 43], [1, 50, 51]]
    ours = generate(dense, prompts, SamplingParams(max_new_tokens=6, greedy=True), batch_size=2)
    for prompt, (completion,) in zip(prompts, ours):
        ref = hf.generate(torch.tensor([prompt]), max_new_tokens=6, do_sample=False, eos_token_id=None,
                          pad_token_id=0)[0, len(prompt):].tolist()
        assert completion.token_ids == ref


def test_dense_cached_steps_of_a_left_padded_batch_are_each_rows_own_forward(wide):
    """Prefill of a left-padded batch, then cached one-token steps: every row's logits at every step
    are what transformers computes for that row alone and uncached, within float32 rounding (the
    greedy tokens alone can agree while the mask is wrong)."""
    _, _, qwen, _ = wide
    dense = DenseLM.from_pretrained(qwen)
    c = dense.config
    depth = SimpleNamespace(hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
                            num_hidden_layers=c.num_hidden_layers, total_ut_steps=1)
    seqs = [[1, 40, 41, 42, 43], [1, 50, 51]]
    ids = torch.tensor([seqs[0], [0, 0, *seqs[1]]])
    mask = torch.tensor([[1] * 5, [0, 0, 1, 1, 1]])
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    cache = dense.new_cache()
    with torch.no_grad():
        logits = dense(ids, cache=cache, positions=positions, attention_mask=mask).logits[:, -1]
        positions = positions[:, -1:]
        for _ in range(4):
            for row, seq in enumerate(seqs):
                assert_same_function(logits[row], dense.hf(torch.tensor([seq])).logits[0, -1], depth)
            token = logits.argmax(-1, keepdim=True)
            for row, seq in enumerate(seqs):
                seq.append(int(token[row]))
            positions = positions + 1
            logits = dense(token, cache=cache, positions=positions).logits[:, -1]


def test_dense_baseline_through_the_same_evaluation(wide, tmp_path):
    root, ouro, qwen, aime = wide
    paths, *_ = tiny_setup(tmp_path, digits=2)
    task = TaskSpec(name="t", path=str(paths["test"]), greedy=True, max_new_tokens=4)
    a = evaluate_lighteval(ModelSpec("qwen3", str(qwen)), task, tmp_path / "a.json")
    b = evaluate(ModelSpec("qwen3", str(qwen)), task, tmp_path / "b.json")
    assert [d["completions"] for d in a["details"]] == [d["completions"] for d in b["details"]]
    assert a["metrics"] == b["metrics"] and len(a["details"]) == 8
    sampled = TaskSpec(name="t", path=str(paths["test"]), samples=3, ks=[1, 2], max_new_tokens=4)
    s1 = evaluate_lighteval(ModelSpec("qwen3", str(qwen)), sampled, tmp_path / "s1.json", seed=3)
    s2 = evaluate_lighteval(ModelSpec("qwen3", str(qwen)), sampled, tmp_path / "s2.json", seed=3)
    assert s1["details"] == s2["details"] and len(set(s1["details"][0]["completions"])) > 1
    with pytest.raises(melt_core.ConfigError, match="cache mode 'last-loop'.* is for Ouro"):
        evaluate(ModelSpec("qwen3", str(qwen), cache_mode="last-loop"), task, tmp_path / "c.json")


def test_dense_loading_refuses_pickles_and_remote_code(wide, tmp_path):
    _, _, qwen, _ = wide
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "someone_elses_arch"}))
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(melt_core.CheckpointError, match="without remote code"):
        DenseLM.from_pretrained(tmp_path)
    pickled = tmp_path / "p"
    pickled.mkdir()
    (pickled / "config.json").write_text((qwen / "config.json").read_text())
    (pickled / "pytorch_model.bin").write_bytes(b"")
    with pytest.raises(melt_core.CheckpointError, match="no safetensors weights"):
        DenseLM.from_pretrained(pickled)


HUMANEVAL_ROWS = [
    {"task_id": "HumanEval/0", "entry_point": "add",
     "prompt": 'from typing import List\n\n\ndef add(xs: List[int]) -> int:\n    """Sum of xs."""\n',
     "canonical_solution": "    return sum(xs)\n",
     "test": "def check(candidate):\n    assert candidate([1, 2]) == 3\n    assert candidate([]) == 0\n"},
    {"task_id": "HumanEval/1", "entry_point": "double",
     "prompt": 'def double(x):\n    """Twice x."""\n',
     "canonical_solution": "    return 2 * x\n",
     "test": "def check(candidate):\n    assert candidate(4) == 8\n"},
]


def test_humaneval_plus_runs_the_tests(wide, monkeypatch):
    """Our HumanEval+ task: a correct function (in a code block after reasoning, or as a bare
    body continuing the signature) passes; a wrong one, a crash, or an endless loop fails."""
    from melt_core.evaluation import code_tasks

    root, ouro, _, _ = wide
    data = write_jsonl(root / "humaneval", "test", HUMANEVAL_ROWS)
    monkeypatch.setattr(code_tasks, "TIMEOUT_S", 3.0)
    answers = {
        "add": ["<think>easy</think>```python\nfrom typing import List\ndef add(xs: List[int]) -> int:\n"
                "    return sum(xs)\n```", "    return 0\n", "```python\ndef add(xs):\n    while True: pass\n```"],
        "double": ["    return 2 * x\n", "```python\ndef double(x):\n    raise ValueError\n```",
                   "no code at all"],
    }

    def greedy_until(self, docs):
        return [ModelResponse(input=d.query, text=answers[d.specific["entry_point"]], output_tokens=[[0]] * 3)
                for d in docs]

    monkeypatch.setattr(MeltLightevalModel, "greedy_until", greedy_until)
    runs = []
    program = code_tasks.program
    monkeypatch.setattr(code_tasks, "program", lambda doc, text: runs.append(text) or program(doc, text))
    task = TaskSpec(name="humaneval", lighteval="melt/humaneval_plus", data_dir=str(data), samples=3, ks=[1, 3],
                    allow_code_execution=True)
    res = evaluate_lighteval(ModelSpec("ouro", str(ouro)), task, root / "he.json")
    assert len(runs) == 6  # each completion's tests run once, for pass@1, pass@3 and the details alike
    assert {d["gold"]: d["correct"] for d in res["details"]} == {
        "    return sum(xs)\n": [True, False, False], "    return 2 * x\n": [True, False, False]}
    assert res["metrics"] == {"pass@1": pytest.approx(1 / 3), "pass@3": 1.0}
    with pytest.raises(melt_core.ConfigError, match="runs the model's code.*allow_code_execution: true"):
        evaluate_lighteval(ModelSpec("ouro", str(ouro)), TaskSpec(name="humaneval", lighteval="melt/humaneval_plus",
                                                                  data_dir=str(data)), root / "x.json")


def test_list_golds_reach_the_scorer_as_strings(tmp_path):
    """OlympiadBench's hub schema has `final_answer` as a list of strings, which lighteval's prompt
    passes on as one choice and its string scorers cannot read: the gold becomes the joined string."""
    from melt_core.evaluation.lighteval_tasks import builtin_task_configs

    rows = [{"id": 0, "question": "Compute 2 + 3.", "final_answer": ["$5$"], "is_multiple_answer": False,
             "unit": None, "answer_type": "Numerical", "subject": "Math", "language": "English"},
            {"id": 1, "question": "Roots of x^2 = 1?", "final_answer": ["$1$", "$-1$"], "is_multiple_answer": True,
             "unit": None, "answer_type": "Numerical", "subject": "Math", "language": "English"}]
    folder = write_jsonl(tmp_path / "ob", "train", rows)
    config = builtin_task_configs({"name": "olympiadbench", "data_dir": str(folder),
                                   "lighteval": "olympiade_bench/olympiad_bench:OE_TO_maths_en_COMP"})[0]
    docs = [config.prompt_function(r, config.name) for r in rows]
    assert [d.choices for d in docs] == [["$5$"], ["$1$, $-1$"]]
    assert "International Math competition" in docs[0].query  # lighteval's own prompt


def test_lighteval_definitions_shard_by_question_and_merge(wide, monkeypatch):
    """A lighteval task (its own prompt, dataset and scorer) split over shards, some empty, merges
    into the unsharded scores; shards with a limit are refused (lighteval limits after filtering)."""
    from melt_core.evaluation.evaluate import merge_shards

    root, ouro, _, aime = wide
    greedy_until, _ = oracle({1, 3, 5})
    monkeypatch.setattr(MeltLightevalModel, "greedy_until", greedy_until)
    whole = evaluate_lighteval(ModelSpec("ouro", str(ouro)), aime_task(aime), root / "whole.json")
    n = 8  # more shards than AIME_ROWS: some are empty
    for i in range(n):
        evaluate_lighteval(ModelSpec("ouro", str(ouro)), aime_task(aime, shard=[i, n]), root / f"s{i}.json")
    merged = merge_shards([root / f"s{i}.json" for i in range(n)], root / "merged.json")
    assert merged["metrics"] == whole["metrics"] and 0 < whole["metrics"]["pass@1"] < 1
    assert [d["prompt"] for d in merged["details"]] == [d["prompt"] for d in whole["details"]]
    with pytest.raises(ConfigError, match="applies `limit` after the shard filter"):
        aime_task(aime, shard=[0, 2], limit=2)
