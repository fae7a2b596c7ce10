"""Fixtures for rehearsing the paper configuration at miniature scale (config/rehearsal.yaml).

Builds, from nothing and deterministically (numpy's seeded generator, not torch's, whose normal
sampler differs between CPU kernels), in a few seconds:

* a byte-level BPE tokenizer trained with ``tokenizers`` on the rehearsal's own text, carrying
  Ouro's special tokens (``<|endoftext|>`` = 0 as bos/eos/pad, ``<|im_start|>`` = 1,
  ``<|im_end|>`` = 2, ``<think>``, ``</think>``) and the ChatML thinking chat template;
* a tiny Ouro-architecture teacher (Ouro's config keys, T = 4, bf16 safetensors) and a tiny
  Qwen3 dense baseline, each published into a Hugging Face hub cache in the hub's own layout
  (``models--org--name/{blobs,snapshots/<revision>,refs/main}``), so rule ``teacher`` and
  ``dense_baseline`` fetch them through ``snapshot_download`` with ``HF_HUB_OFFLINE=1`` at the
  revisions and sha256 manifests pinned in config/rehearsal.yaml;
* AceReason-1.1-SFT and OpenThoughts3 copies in their hub schemas (parquet under ``data/``),
  a few dozen rows with long ``<think>`` traces;
* the ten benchmarks, a handful of rows each, in the columns lighteval's task definitions read
  (MMLU-Redux: one folder per subject).

    python workflow/rehearsal.py [OUT]        # default results/rehearsal/fixtures

prints the pins; ``tests/test_rehearsal.py`` checks they equal the overlay's.
"""

from __future__ import annotations

import hashlib
import json
import random
import shutil
import sys
from pathlib import Path

import numpy as np

OURO_REPO = "melt-rehearsal/Ouro-tiny-Thinking"
DENSE_REPO = "melt-rehearsal/Qwen3-tiny"
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] "
    "+ '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\\n<think>\\n' }}{% endif %}")
VOCAB = 640
MAX_POSITIONS = 1024
MMLU_SUBJECTS = 57  # the subjects lighteval's mmlu_redux_2:* expands to


# ----------------------------------------------------------------------------- text
def _trace(rng: random.Random) -> tuple[str, str, str]:
    """A multiplication worked out step by step: (question, thinking trace, answer)."""
    a, b = rng.randrange(12, 99), rng.randrange(12, 99)
    lines = [f"I need {a} times {b}.", f"Split {b} into {b // 10 * 10} and {b % 10}."]
    lines += [f"{a} times {b // 10 * 10} is {a * (b // 10 * 10)}.", f"{a} times {b % 10} is {a * (b % 10)}.",
              f"Adding: {a * (b // 10 * 10)} plus {a * (b % 10)} is {a * b}."]
    for k in range(rng.randrange(4, 9)):  # checks that make the trace long, as reasoning traces are
        c = rng.randrange(2, 9)
        lines.append(f"Check {k + 1}: {a * b} divided by {a} should give {b}; {a} times {b} is {a * b}, "
                     f"and {a * b} plus {c} minus {c} is still {a * b}.")
    return f"What is {a} times {b}? Put the final answer in \\boxed{{}}.", "\n".join(lines), str(a * b)


def sft_datasets(seed: int = 0) -> dict[str, list[dict]]:
    """Rows in the hub schemas: AceReason-1.1-SFT (input/output) and OpenThoughts3 (conversations)."""
    rng = random.Random(seed)
    ace, ot = [], []
    for _ in range(24):
        q, think, ans = _trace(rng)
        ace.append({"category": "math", "source": "rehearsal", "input": q,
                    "output": f"<think>\n{think}\n</think>\nThe answer is \\boxed{{{ans}}}."})
        q, think, ans = _trace(rng)
        ot.append({"difficulty": 3, "source": "rehearsal", "domain": "math",
                   "conversations": [{"from": "human", "value": q},
                                     {"from": "gpt", "value": f"<think>\n{think}\n</think>\n\\boxed{{{ans}}}"}]})
    return {"AceReason-1.1-SFT": ace, "OpenThoughts3-1.2M": ot}


# GPQA's columns besides the question and its answers, with values of their types (Idavidrein/gpqa)
GPQA_OTHER_COLUMNS = {
    "Pre-Revision Explanation": "", "Self-reported question-writing time (minutes)": 20.0, "Explanation": "",
    "Revision Comments (from Question Writer)": "", "Subdomain": "", "Writer's Difficulty Estimate": "",
    "Extra Revised Question": None, "Extra Revised Explanation": None, "Extra Revised Correct Answer": None,
    "Extra Revised Incorrect Answer 1": None, "Extra Revised Incorrect Answer 2": None,
    "Extra Revised Incorrect Answer 3": None, "Non-Expert Validator Accuracy": 0.5,
    "Majority Non-Expert Vals Incorrect": 1.0, "Expert Validator Accuracy": 1.0, "High-level domain": "",
    "Question Writer": "", "Feedback_EV_1": "", "Validator Revision Suggestion_EV_1": "",
    "Is First Validation_EV_1": True, "Post hoc agreement_EV_1": "", "Sufficient Expertise?_EV_1": "",
    "Understand the question?_EV_1": "", "Question Difficulty_EV_1": "", "Validator Answered Correctly_EV_1": 1,
    "Self-reported time (minutes)_EV_1": 10.0, "Probability Correct_EV_1": "", "Manual Correctness Check_EV_1": "",
    "Canary String": ""}


REHEARSAL_SHARDS = 2  # config/rehearsal.yaml's eval.tasks.math500.shards


def _every_shard_asked(row, pairs, more) -> list[dict]:
    """``row(i, q, a)`` for each (question, answer) pair, then for more pairs (``more(1)``) until
    every one of the rehearsal's shards holds a question (melt_core.serving.inference.in_shard): a shard
    job with nothing to ask would rehearse nothing."""
    from melt_core.serving.inference import in_shard

    rows = [row(i, q, a) for i, (q, a) in enumerate(pairs)]
    while not all(any(in_shard(r, [k, REHEARSAL_SHARDS]) for r in rows) for k in range(REHEARSAL_SHARDS)):
        rows.append(row(len(rows), *more(1)[0]))
    return rows


def benchmark_datasets(seed: int = 0) -> dict[str, dict[str, list[dict]]]:
    """task -> {relative file: rows}, each file ``[<subset>/]<split>.jsonl`` in the hub columns."""
    from melt_core.evaluation.code_tasks import evalplus_test

    rng = random.Random(seed + 1)

    def qa(n):
        out = []
        for _ in range(n):
            a, b = rng.randrange(2, 50), rng.randrange(2, 50)
            out.append((f"Compute {a} + {b}.", str(a + b)))
        return out

    sets: dict[str, dict[str, list[dict]]] = {}
    # each dataset's own columns and types (tests/test_rehearsal.py compares them with the rows in
    # tests/fixtures/benchmarks): AIME26's answers are int64, AMC23's float64, OlympiadBench's lists
    sets["aime24"] = {"train.jsonl": [{"id": i, "problem": q, "solution": f"{q} = $\\boxed{{{a}}}$", "answer": a,
                                       "url": "", "year": "2024"} for i, (q, a) in enumerate(qa(3))]}
    sets["aime25"] = {"train.jsonl": [{"id": i, "problem": q, "answer": a, "url": "", "year": 2025}
                                      for i, (q, a) in enumerate(qa(3))]}
    sets["aime26"] = {"train.jsonl": [{"problem_idx": i + 1, "problem": q, "answer": int(a)}
                                      for i, (q, a) in enumerate(qa(3))]}
    sets["amc23"] = {"test.jsonl": [{"id": i, "question": q, "answer": float(a), "url": ""}
                                    for i, (q, a) in enumerate(qa(3))]}
    sets["math500"] = {"test.jsonl": _every_shard_asked(
        lambda i, q, a: {"problem": q, "solution": f"$\\boxed{{{a}}}$", "answer": a, "subject": "Algebra",
                         "level": 1, "unique_id": f"test/{i}.json"}, qa(3), qa)}
    sets["olympiadbench"] = {"train.jsonl": [
        {"id": i, "question": q, "solution": [f"{q} = {a}"], "final_answer": [f"${a}$"], "context": None,
         **{f"image_{k}": None for k in range(1, 6)}, "modality": "Text-only", "difficulty": "Competition",
         "is_multiple_answer": False, "unit": None, "answer_type": "Numerical", "error": None,
         "question_type": "Open-ended", "subfield": "Algebra", "subject": "Math", "language": "English"}
        for i, (q, a) in enumerate(qa(3))]}
    sets["gpqa"] = {"train.jsonl": [
        {**GPQA_OTHER_COLUMNS, "Pre-Revision Question": q, "Question": q, "Record ID": f"rec{i}",
         **{f"{pre}{name}": value for pre in ("", "Pre-Revision ")
            for name, value in (("Correct Answer", a), ("Incorrect Answer 1", str(int(a) + 1)),
                                ("Incorrect Answer 2", str(int(a) + 2)), ("Incorrect Answer 3", str(int(a) - 1)))}}
        for i, (q, a) in enumerate(qa(3))]}
    sets["hle"] = {"test.jsonl": [
        {"id": f"hle{i}", "question": q, "image": "" if i < 4 else "data:image/png;base64,AAAA", "image_preview": None,
         "answer": a, "answer_type": "exactMatch", "author_name": "", "rationale": "", "rationale_image": None,
         "raw_subject": "Mathematics", "category": "Math", "canary": ""} for i, (q, a) in enumerate(qa(5))]}
    from lighteval.tasks.tasks.mmlu_redux import _MMLU_REDUX_2_SUBSETS as subjects

    assert len(subjects) == MMLU_SUBJECTS, len(subjects)
    sets["mmlu_redux"] = {}
    for subject in subjects:
        q, a = qa(1)[0]
        choices = [a, str(int(a) + 1), str(int(a) + 2), str(int(a) + 3)]
        sets["mmlu_redux"][f"{subject}/test.jsonl"] = [
            {"question": q, "choices": choices, "answer": 0, "error_type": "ok", "source": "rehearsal",
             "correct_answer": None, "potential_reason": None}]
    sets["humaneval"] = {"test.jsonl": [  # evalplus's test shape: input/output lists, its numpy assertion
        {"task_id": f"HumanEval/{i}", "prompt": f"def add_{i}(a, b):\n    \"\"\"Return a + b.\"\"\"\n",
         "canonical_solution": "    return a + b\n", "entry_point": f"add_{i}",
         "test": evalplus_test([[2, i], [0.5, 0.25]], [2 + i, 0.75])} for i in range(2)]}
    return sets


def corpus(sft: dict[str, list[dict]], benchmarks: dict[str, dict[str, list[dict]]]) -> list[str]:
    texts = [r["input"] + r["output"] for r in sft["AceReason-1.1-SFT"]]
    texts += [m["value"] for r in sft["OpenThoughts3-1.2M"] for m in r["conversations"]]
    for files in benchmarks.values():
        for rows in files.values():
            texts += [json.dumps(r) for r in rows]
    return texts


# ------------------------------------------------------------------------- tokenizer
def train_tokenizer(texts: list[str], out: Path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=SPECIAL, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    core.train_from_iterator(texts, trainer=trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=core, bos_token=SPECIAL[0], eos_token=SPECIAL[0],
                                  pad_token=SPECIAL[0], additional_special_tokens=SPECIAL[1:],
                                  chat_template=CHAT_TEMPLATE, model_max_length=MAX_POSITIONS)
    assert [tok.convert_tokens_to_ids(t) for t in SPECIAL[:3]] == [0, 1, 2]  # Ouro's ids
    tok.save_pretrained(str(out))
    return tok


# ----------------------------------------------------------------------------- models
def _normal(rng: np.random.Generator, shape, std: float) -> np.ndarray:
    return (rng.standard_normal(shape, dtype=np.float32) * np.float32(std)).astype(np.float32)


def _save_tensors(arrays: dict[str, np.ndarray], path: Path) -> None:
    import torch
    from safetensors.torch import save_file

    save_file({k: torch.from_numpy(v).to(torch.bfloat16) for k, v in sorted(arrays.items())}, str(path),
              metadata={"format": "pt"})


def ouro_checkpoint(out: Path, tok, seed: int = 0) -> None:
    """Ouro's config.json keys at a tiny size, bf16 weights under Ouro's state-dict names. Head dim 32:
    the smallest vLLM's CPU attention takes (the rehearsal's evals run in vLLM, eval.engine)."""
    from melt_core.modeling.checkpoint import expected_shapes
    from melt_core.modeling.config import ModelConfig

    config = {
        "architectures": ["OuroForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 0, "eos_token_id": 0,
        "pad_token_id": 0, "dtype": "bfloat16", "early_exit_threshold": 1.0, "hidden_act": "silu",
        "hidden_size": 64, "initializer_range": 0.02, "intermediate_size": 128,
        "layer_types": ["full_attention"] * 2, "max_position_embeddings": MAX_POSITIONS, "max_window_layers": 28,
        "model_type": "ouro", "num_attention_heads": 2, "num_hidden_layers": 2, "num_key_value_heads": 2,
        "rms_norm_eps": 1e-6, "rope_scaling": None, "rope_theta": 1000000.0, "sliding_window": None,
        "tie_word_embeddings": False, "total_ut_steps": 4, "use_cache": True, "use_sliding_window": False,
        "vocab_size": len(tok)}
    out.mkdir(parents=True)
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    rng = np.random.default_rng(seed)
    arrays = {}
    for key, shape in expected_shapes(ModelConfig.from_dict(config, source="rehearsal")).items():
        if key.endswith("norm.weight") or "layernorm" in key:
            arrays[key] = np.ones(shape, dtype=np.float32)
        elif key.endswith(".bias"):
            arrays[key] = np.zeros(shape, dtype=np.float32)
        else:
            arrays[key] = _normal(rng, shape, 0.2 if "embed" in key else 0.05)
    _save_tensors(arrays, out / "model.safetensors")
    tok.save_pretrained(str(out))


def dense_checkpoint(out: Path, tok, seed: int = 1) -> None:
    """A tiny Qwen3 (tied embeddings, GQA, as Qwen3-1.7B) in transformers' own format; head dim 32, as
    vLLM's CPU attention needs."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = Qwen3Config(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=32,
                      max_position_embeddings=MAX_POSITIONS, bos_token_id=0, eos_token_id=0, pad_token_id=0,
                      tie_word_embeddings=True, dtype="bfloat16")
    with torch.device("meta"):
        names = {k: tuple(v.shape) for k, v in Qwen3ForCausalLM(cfg).state_dict().items() if k != "lm_head.weight"}
    rng = np.random.default_rng(seed)
    arrays = {k: np.ones(s, dtype=np.float32) if "norm" in k else _normal(rng, s, 0.05)
              for k, s in sorted(names.items())}
    out.mkdir(parents=True)
    cfg.save_pretrained(str(out))
    _save_tensors(arrays, out / "model.safetensors")
    tok.save_pretrained(str(out))


# -------------------------------------------------------------------------- hub layout
def publish(cache: Path, repo_id: str, src: Path) -> tuple[str, dict[str, str]]:
    """Put ``src``'s files into ``cache`` as the hub client lays a downloaded snapshot out; the
    revision is a content hash, so the same files always get the same pinned revision."""
    files = sorted(f for f in src.iterdir() if f.is_file())
    from melt_core.modeling.checkpoint import sha256_file

    manifest = {f.name: sha256_file(f) for f in files}
    revision = hashlib.sha1(json.dumps(manifest, sort_keys=True).encode()).hexdigest()
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / revision
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    snapshot.mkdir(parents=True, exist_ok=True)
    for f in files:
        blob = repo / "blobs" / manifest[f.name]
        shutil.copyfile(f, blob)
        (snapshot / f.name).symlink_to(Path("..") / ".." / "blobs" / blob.name)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(revision)
    return revision, manifest


def _write_parquet(rows: list[dict], path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), str(path))


def build(out: str | Path) -> dict:
    """Write every fixture under ``out`` (replacing what was there); returns the pins."""
    out = Path(out)
    if out.exists():
        shutil.rmtree(out)
    work = out / "work"
    sft, benchmarks = sft_datasets(), benchmark_datasets()
    for name, rows in sft.items():
        _write_parquet(rows, out / "datasets" / name / "data" / "train-00000-of-00001.parquet")
    for task, files in benchmarks.items():
        for rel, rows in files.items():
            f = out / "benchmarks" / task / rel
            f.parent.mkdir(parents=True, exist_ok=True)
            f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tok = train_tokenizer(corpus(sft, benchmarks), work / "tokenizer")
    ouro_checkpoint(work / "ouro", tok)
    dense_checkpoint(work / "dense", tok)
    pins = {}
    for key, repo_id, src in (("source", OURO_REPO, work / "ouro"), ("dense", DENSE_REPO, work / "dense")):
        revision, manifest = publish(out / "hub", repo_id, src)
        pins[key] = {"repo_id": repo_id, "revision": revision, "sha256": manifest}
    shutil.rmtree(work)
    (out / "pins.json").write_text(json.dumps(pins, indent=1, sort_keys=True) + "\n")
    return pins


if __name__ == "__main__":
    target = sys.argv[1] if len(sys.argv) > 1 else "results/rehearsal/fixtures"
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    print(json.dumps(build(target), indent=1, sort_keys=True))
