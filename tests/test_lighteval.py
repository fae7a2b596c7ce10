"""Protects the lighteval route: our model served through lighteval's Pipeline scores exactly
what the native evaluator scores, and each known lighteval 0.13 pitfall stays handled: no
built-in task module is imported (one downloads at import), n > 1 samples, the prompt is never
truncated, the prediction cache can't serve a retrained checkpoint, torch is seeded, and the
result logging works with the pinned xxhash."""

import json
import sys

import pytest
import torch
import xxhash
from lighteval.models.model_input import GenerationParameters
from lighteval.tasks.requests import Doc
from train_helpers import tiny_setup

import melt_core
from melt_core.evaluation.evaluate import TaskSpec, evaluate
from melt_core.evaluation.lighteval_adapter import (
    MeltLightevalModel,
    evaluate_lighteval,
    melt_model_config,
    weights_digest,
)
from melt_core.serving.inference import ModelSpec


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("le")
    paths, teacher, student = tiny_setup(root, digits=3)
    return root, paths, teacher, student


def test_lighteval_route_equals_native(setup):
    root, paths, teacher, student = setup
    task = TaskSpec(name="column_add", path=str(paths["test"]), greedy=True, samples=1, ks=[1], max_new_tokens=8)
    for name, path, mode in (("melt", student, "default"), ("ouro-last", teacher, "last-loop")):
        spec = ModelSpec(name, str(path), cache_mode=mode)
        native = evaluate(spec, task, root / f"{name}-native.json")
        routed = evaluate_lighteval(spec, task, root / f"{name}-le.json")
        assert routed["metrics"] == native["metrics"] and routed["backend"] == "lighteval"
        assert [d["completions"] for d in routed["details"]] == [d["completions"] for d in native["details"]]
    assert "lighteval.tasks.tasks.tiny_benchmarks" not in sys.modules  # never imported: it downloads
    assert int(xxhash.VERSION.split(".")[0]) < 4  # xxhash 4 breaks lighteval's detail logging


def test_early_exit_set_per_task_is_scored_and_counted_by_both_routes(setup):
    """A task's exit rule over the model's: both routes generate with it, agree, and record the
    loops each token ran (a forced exit after loop 1 for every decoded token)."""
    root, paths, _, student = setup
    spec = ModelSpec("melt", str(student), exit={"q": 1.0})
    task = TaskSpec(name="column_add", path=str(paths["test"]), greedy=True, samples=1, ks=[1], max_new_tokens=8,
                    limit=6, exit={"exit_at_loop": 1})
    native = evaluate(spec, task, root / "exit-native.json")
    routed = evaluate_lighteval(spec, task, root / "exit-le.json")
    assert [d["completions"] for d in routed["details"]] == [d["completions"] for d in native["details"]]
    T, tokens = 3, native["generated_tokens"]
    first = sum(len(d["generated_tokens"]) for d in native["details"])  # each first token: the prompt's T loops
    assert native["mean_loops"] == routed["mean_loops"] == pytest.approx((first * T + tokens - first) / tokens)
    full = evaluate(spec, TaskSpec(**{**task.__dict__, "exit": None}), root / "full.json")
    assert full["mean_loops"] == T


def model(path, **gen):
    cfg = melt_model_config(ModelSpec("m", str(path)), generation_parameters=GenerationParameters(**gen),
                            seed=gen.pop("seed", 0))
    return MeltLightevalModel(cfg)


def test_n_samples_are_sampled_and_seeded(setup):
    _, paths, teacher, _ = setup
    doc = Doc(query="<bos>123+456=", choices=["x"], gold_index=0, num_samples=6, generation_size=6)
    a = model(teacher, temperature=1.0, top_p=1.0).greedy_until([doc])[0].text
    b = model(teacher, temperature=1.0, top_p=1.0).greedy_until([doc])[0].text
    assert len(a) == 6 and a == b  # seeded: lighteval itself does not seed torch
    torch.manual_seed(123)  # the global RNG plays no part
    assert model(teacher, temperature=1.0, top_p=1.0).greedy_until([doc])[0].text == a
    assert len(set(a)) > 1  # n > 1 really samples


def test_prompt_is_never_truncated(setup):
    _, _, teacher, _ = setup
    m = model(teacher, temperature=0.0, max_new_tokens=4)
    long_query = "<bos>" + "1" * 100 + "="
    resp = m.greedy_until([Doc(query=long_query, choices=["x"], gold_index=0, generation_size=1000)])[0]
    assert len(resp.input_tokens) == 102  # the whole prompt went in
    assert len(resp.output_tokens[0]) <= m.max_length - 102
    with pytest.raises(melt_core.ConfigError, match="does not fit max_position_embeddings"):
        m.greedy_until([Doc(query="<bos>" + "1" * 200, choices=["x"], gold_index=0)])


def test_prompts_hold_the_messages_lightevals_own_chat_route_builds(setup):
    """Built-in tasks' docs from lighteval's own prompt functions: MMLU-Redux repeats its instruction
    at the start of its query (lighteval keeps one copy and strips the rest: "Answer:" without its
    trailing space), HLE's instruction is not in its query (lighteval puts it in front)."""
    from lighteval.tasks.tasks.hle import SYSTEM_MESSAGE, hle_text_only
    from lighteval.tasks.tasks.mmlu_redux import mmlu_redux_2_prompt

    _, _, teacher, _ = setup
    m = MeltLightevalModel(melt_model_config(ModelSpec("m", str(teacher)), template="chatml-thinking"))
    turn = "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n<think>\n".format
    row = {"question": "Find x.", "choices": ["0", "4", "2", "6"], "answer": 1}  # the hub dataset's columns
    mmlu = mmlu_redux_2_prompt("abstract_algebra")(row)
    assert m.prompt(mmlu) == turn("The following are multiple choice questions (with answers) about abstract "
                                  "algebra.\n\nFind x.\nA. 0\nB. 4\nC. 2\nD. 6\nAnswer:")
    hle = hle_text_only({"question": "What is 2+2?", "answer": "4", "image": "", "id": "q1"})
    assert m.prompt(hle) == turn(SYSTEM_MESSAGE + "What is 2+2?")


def test_cache_key_follows_the_weights(setup, tmp_path):
    root, _, teacher, _ = setup
    copy = melt_core.save_pretrained(melt_core.load_pretrained(teacher), tmp_path / "ck",
                                     write_extra=melt_core.data.load_tokenizer(teacher).save_pretrained)
    before = weights_digest(copy)
    retrained = melt_core.load_pretrained(copy)
    with torch.no_grad():
        retrained.lm_head.weight.mul_(2)
    melt_core.save_pretrained(retrained, copy, write_extra=melt_core.data.load_tokenizer(teacher).save_pretrained)
    assert weights_digest(copy) != before
    assert melt_model_config(ModelSpec("m", str(copy))).model_name != f"m@{before}"


@pytest.mark.parametrize("route, n", [(evaluate, 3), (evaluate_lighteval, 3), (evaluate, 20), (evaluate_lighteval, 20)])
def test_sharded_questions_merge_into_the_unsharded_result(setup, route, n):
    """A task split over n jobs by a hash of each question, merged, is the unsharded result: the same
    questions, completions and pass@k (sampled: per-sample random streams do not see the shard); more
    shards than questions leave some empty, which merge as nothing."""
    from melt_core.evaluation.evaluate import merge_shards
    from melt_core.serving.inference import in_shard

    root, paths, _, student = setup
    spec = ModelSpec("melt", str(student))
    task = TaskSpec(name="column_add", path=str(paths["test"]), samples=4, ks=[1, 2], temperature=1.0, top_p=0.9,
                    max_new_tokens=6)
    whole = route(spec, task, root / f"whole-{route.__name__}.json", seed=3)
    name = f"{route.__name__}-{n}"
    parts = [route(spec, TaskSpec(**{**task.__dict__, "shard": [i, n]}), root / f"s{i}-{name}.json", seed=3)
             for i in range(n)]
    counts = [p["n_questions"] for p in parts]
    assert max(counts) < whole["n_questions"] == sum(counts) and (n < 8 or 0 in counts)  # split; some empty
    merged = merge_shards([root / f"s{i}-{name}.json" for i in range(n)], root / "merged.json")
    assert merged["metrics"] == whole["metrics"] and merged["shards"] == n
    assert [(d["prompt"], d["completions"]) for d in merged["details"]] == \
        [(d["prompt"], d["completions"]) for d in whole["details"]]
    rows = [{"q": i} for i in range(100)]
    assert sorted(sum(([r["q"] for r in rows if in_shard(r, [i, 4])] for i in range(4)), [])) == list(range(100))
    with pytest.raises(melt_core.data.DataError, match="expected shards"):
        merge_shards([root / f"s{i}-{name}.json" for i in range(2)], root / "bad.json")
    for field, other in (("seed", 4), ("model", {**parts[1]["model"], "name": "another"})):  # all shards, one run
        (root / f"odd-{name}.json").write_text(json.dumps({**parts[1], field: other}))
        with pytest.raises(melt_core.data.DataError, match="shards of different models or settings"):
            merge_shards([root / f"s0-{name}.json", root / f"odd-{name}.json",
                          *[root / f"s{i}-{name}.json" for i in range(2, n)]], root / "bad.json")
