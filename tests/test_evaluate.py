"""Protects scoring: pass@k matches its closed form, a model that always emits the gold
answer scores 1 and one that never does scores 0, the same seed gives the same scores, and
bad task/model inputs fail with a clear error."""

import math

import pytest
import torch
from train_helpers import tiny_setup

import melt_core
from melt_core.data import DataError, load_tokenizer, read_jsonl
from melt_core.evaluation.evaluate import TaskSpec, evaluate
from melt_core.evaluation.metrics import extract_answer, pass_at_k
from melt_core.modeling.checkpoint import CheckpointError
from melt_core.modeling.config import ConfigError, ModelConfig
from melt_core.serving.inference import ModelSpec, exit_rule, load_model, resolve_dtype


@pytest.mark.parametrize("n,c,k", [(16, 0, 1), (16, 3, 1), (16, 3, 10), (16, 8, 10), (16, 16, 10), (10, 1, 10)])
def test_pass_at_k_closed_form(n, c, k):
    expected = 1 - math.comb(n - c, k) / math.comb(n, k) if n - c >= k else 1.0
    assert pass_at_k(n, c, k) == pytest.approx(expected)
    if k == 1:
        assert pass_at_k(n, c, 1) == pytest.approx(c / n)


def test_pass_at_k_bad_input():
    with pytest.raises(ValueError, match="needs at least 10 samples"):
        pass_at_k(4, 1, 10)


def test_boxed_extraction():
    assert extract_answer(r"so \boxed{\frac{1}{2}} and then \boxed{42}", "boxed") == "42"
    assert extract_answer("nothing", "boxed") == ""


def test_embedded_tasks_score_the_exact_answer_only():
    """The embedded tasks' scorer (AnswerMatch, style exact) on a record in the task's own format:
    the answer alone (surrounding white space aside) scores; an answer inside more text, a prefix of
    it, or nothing, does not; pass@1 over 4 samples with one right is 0.25."""
    from lighteval.models.model_output import ModelResponse

    from melt_core.evaluation.lighteval_tasks import jsonl_prompt, sample_correct, task_config

    record = {"messages": [{"role": "user", "content": "6604876475938242+1948924115781565="},
                           {"role": "assistant", "content": "7f5ciab68ahca8a8"}]}
    config = task_config({"name": "digit_sum", "data_dir": ".", "samples": 4, "ks": [1]})
    doc = jsonl_prompt(record, "digit_sum")
    gold = record["messages"][-1]["content"]
    for text in (gold, f" {gold}\n"):
        assert sample_correct(config, doc, text), text
    for text in (f"{gold}0", f"0{gold}", f"the sum is {gold}", gold[:-1], "", "0123456789abcdefghij" * 2):
        assert not sample_correct(config, doc, text), text
    score = config.metrics[0].sample_level_fn.compute(doc, ModelResponse(text=["x", gold, "y", "z"]))
    assert score == pytest.approx(0.25)


def oracle(root, paths, always_right: bool):
    """A model with known behaviour: a 1-layer, 1-loop Ouro whose attention and MLP are zero, so
    each logit row depends only on the current token (a bigram machine), wired to emit a planted
    string after the prompt: the gold answer of one test record, or a wrong constant string."""
    tok = load_tokenizer(paths["tokenizer"])
    records = read_jsonl(paths["test"])
    eq = tok.convert_tokens_to_ids("=")

    def chain_of(rec):
        return [eq, *tok.encode(rec["messages"][1]["content"], add_special_tokens=False), tok.eos_token_id]

    # a record whose answer has no repeated token, so the bigram machine is unambiguous
    idx = next(i for i, r in enumerate(records) if len(set(chain_of(r))) == len(chain_of(r)))
    chain = chain_of(records[idx])
    if not always_right:
        j = tok.convert_tokens_to_ids("j")
        chain = [eq, j, j]  # "jjjj...": never a valid answer
    cfg = melt_core.ModelConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=8, num_hidden_layers=1,
                                num_attention_heads=1, num_key_value_heads=1, total_ut_steps=1,
                                max_position_embeddings=64, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    model = melt_core.LoopedLM(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()  # attention and MLP add nothing: the residual stream stays the token embedding
        model.model.embed_tokens.weight.copy_(torch.eye(cfg.vocab_size, 64))
        model.model.norm.weight.fill_(1.0)
        for a, b in zip(chain, chain[1:]):
            model.lm_head.weight[b, a] = 10.0  # after token a, emit b
    out = melt_core.save_pretrained(model, root / f"oracle-{always_right}", write_extra=tok.save_pretrained)
    test = root / f"one-{always_right}.jsonl"
    test.write_text(paths["test"].read_text().splitlines()[idx] + "\n")
    return out, test


@pytest.mark.parametrize("always_right", [True, False])
def test_known_models_score_what_they_must(tmp_path, always_right):
    paths = tiny_setup(tmp_path, digits=3)[0]
    model_dir, test_file = oracle(tmp_path, paths, always_right)
    task = TaskSpec(name="t", path=str(test_file), samples=4, ks=[1, 4], greedy=True, max_new_tokens=16)
    result = evaluate(ModelSpec("oracle", str(model_dir)), task, tmp_path / "r.json")
    want = 1.0 if always_right else 0.0
    assert result["metrics"] == {"pass@1": want, "pass@4": want}
    assert result["details"][0]["correct"] == [always_right] * 4


def test_same_seed_same_scores(tmp_path):
    paths, teacher, student = tiny_setup(tmp_path, digits=3)
    task = TaskSpec(name="t", path=str(paths["test"]), samples=4, ks=[1, 4], max_new_tokens=6)
    a = evaluate(ModelSpec("m", str(student)), task, tmp_path / "a.json", seed=3)
    b = evaluate(ModelSpec("m", str(student)), task, tmp_path / "b.json", seed=3)
    c = evaluate(ModelSpec("m", str(student)), task, tmp_path / "c.json", seed=4)
    assert a["details"] == b["details"] and a["metrics"] == b["metrics"]
    assert a["details"] != c["details"]


def test_bad_eval_inputs(tmp_path):
    paths, teacher, _ = tiny_setup(tmp_path, digits=3)
    task = TaskSpec(name="t", path=str(tmp_path / "missing.jsonl"))
    with pytest.raises(DataError, match="task 't': .*missing.jsonl: dataset file not found"):
        evaluate(ModelSpec("m", str(teacher)), task, tmp_path / "r.json")
    with pytest.raises(CheckpointError, match="model 'm': .* is not a model checkpoint directory"):
        evaluate(ModelSpec("m", str(tmp_path)), TaskSpec(name="t", path=str(paths["test"])), tmp_path / "r.json")
    with pytest.raises(ConfigError, match="pass@10 needs samples >= 10"):
        evaluate(ModelSpec("m", str(teacher)), TaskSpec(name="t", path=str(paths["test"]), ks=[10]),
                 tmp_path / "r.json")
    assert not (tmp_path / "r.json").exists()


def test_window_variant_applies_to_melt_only(tmp_path):
    """eval.compare_window's variants (@window-W): v3's sliding window over a MELT checkpoint at
    inference; an Ouro checkpoint has per-loop rows already, so asking it for a window is an error."""
    paths, teacher, student = tiny_setup(tmp_path, digits=3)
    model = load_model(ModelSpec("m@window-4", str(student), window=4))
    assert model.config.window == 4 and model.new_cache(16).window.size == 4
    assert load_model(ModelSpec("m", str(student))).new_cache(16).window is None  # the checkpoint's own
    with pytest.raises(ConfigError, match="model 'ouro@window-4': a sliding window applies to MELT checkpoints"):
        load_model(ModelSpec("ouro@window-4", str(teacher), window=4))


def test_exit_settings_layer_task_over_model_over_checkpoint():
    """eval.exit (the model's) goes over the checkpoint's own exit, and a task's own `exit:` over both."""
    checkpoint = ModelConfig(early_exit_threshold=0.8)
    spec = ModelSpec(name="m", path="p", exit={"q": 0.6, "min_loops": 2})
    rule = exit_rule(spec, {"q": 0.9}, checkpoint)
    assert (rule.q, rule.min_loops) == (0.9, 2)
    assert exit_rule(spec, None, checkpoint).q == 0.6
    assert exit_rule(ModelSpec(name="m", path="p"), None, checkpoint).q == 0.8


def test_auto_precision_is_bfloat16_on_a_gpu_and_float32_on_the_cpu():
    assert resolve_dtype("auto", "cpu") is torch.float32 and resolve_dtype(None, "cpu") is torch.float32
    assert resolve_dtype("auto", "cuda") is torch.bfloat16 and resolve_dtype("bfloat16", "cpu") is torch.bfloat16
