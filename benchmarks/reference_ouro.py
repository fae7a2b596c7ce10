"""Our Ouro against the reference Ouro modeling code, same weights, same shape, side by side:
logits agreement, greedy-decoding agreement, and decode tok/s.

The reference is the public ``modeling_ouro.py`` + ``configuration_ouro.py`` (as shipped with
the Ouro checkpoints, or the patched copy in github.com/LoopedLMs/ouro_rl, ouro_rl/modeling/).
It is not part of this project: point ``--modeling-dir`` at a folder holding those two files.
It needs transformers 4.57, so this script runs in its own environment:

    bash benchmarks/reference_env.sh            # creates .venv-ref (torch 2.13.0, transformers 4.57.6)
    .venv-ref/bin/python benchmarks/reference_ouro.py --modeling-dir PATH

This imports and runs that code (it is the reference implementation); the pipeline and the
tests never do. Weights are random: speed depends on shapes, agreement on the architecture.
"""

from __future__ import annotations

import argparse
import importlib
import json
import shutil
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

import torch

from melt_core import ModelConfig, save_pretrained
from melt_core.generation.generate import SamplingParams, generate
from melt_core.modeling.shapes import SPEED_SHAPES
from melt_core.ops.profiler import build_random, compare_decode, decode_ratio_table


def load_reference(modeling_dir: Path, checkpoint: Path, dtype: torch.dtype):
    """The reference OuroForCausalLM on our checkpoint (the hub's keys and config fields)."""
    pkg = Path(tempfile.mkdtemp()) / "ouro_reference"
    pkg.mkdir()
    for name in ("modeling_ouro.py", "configuration_ouro.py"):
        shutil.copy(modeling_dir / name, pkg / name)
    (pkg / "__init__.py").write_text("")
    sys.path.insert(0, str(pkg.parent))
    modeling = importlib.import_module("ouro_reference.modeling_ouro")
    config = importlib.import_module("ouro_reference.configuration_ouro").OuroConfig.from_pretrained(checkpoint)
    model = modeling.OuroForCausalLM.from_pretrained(checkpoint, config=config, dtype=dtype,
                                                     attn_implementation="sdpa")
    return model.eval()


class Reference:
    """The reference model behind the interface profiler.compare_decode times."""

    def __init__(self, hf):
        self.hf = hf
        self.lm_head = hf.lm_head
        self.config = SimpleNamespace(is_melt=False, vocab_size=hf.config.vocab_size)

    def new_cache(self, capacity=None):
        return {"past": None}

    @torch.no_grad()
    def __call__(self, ids, cache, chunk_size=None, logits="last"):
        out = self.hf(input_ids=ids, past_key_values=cache["past"], use_cache=True, logits_to_keep=1)
        cache["past"] = out.past_key_values
        return SimpleNamespace(logits=out.logits)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--modeling-dir", type=Path, required=True)
    p.add_argument("--shape", choices=sorted(SPEED_SHAPES), default="cpu-mid")
    p.add_argument("--batches", type=int, nargs="+", default=[1])
    p.add_argument("--contexts", type=int, nargs="+", default=[256, 1024])
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    p.add_argument("--out", type=Path, default=Path("results/benchmarks/reference_ouro"))
    a = p.parse_args()
    dtype = getattr(torch, a.dtype)
    torch.set_grad_enabled(False)
    ours = build_random(ModelConfig(model_type="ouro", **SPEED_SHAPES[a.shape]), dtype)
    with tempfile.TemporaryDirectory() as tmp:
        save_pretrained(ours, Path(tmp) / "ckpt")
        ref = load_reference(a.modeling_dir, Path(tmp) / "ckpt", dtype)

    ids = torch.randint(1, ours.config.vocab_size, (2, 64), generator=torch.Generator().manual_seed(0))
    mine, theirs = ours(ids).logits.float(), ref(input_ids=ids).logits.float()
    logits_err = float((mine - theirs).abs().max())
    prompt = ids[:1]
    ours_tokens = generate(ours, prompt.tolist(), SamplingParams(max_new_tokens=a.steps, greedy=True))[0][0].token_ids
    ref_tokens = ref.generate(prompt, max_new_tokens=a.steps, do_sample=False, eos_token_id=None,
                              pad_token_id=0)[0, prompt.shape[1]:].tolist()
    agree = sum(x == y for x, y in zip(ours_tokens, ref_tokens)) / a.steps

    rows = compare_decode({"reference": Reference(ref), "ours": ours}, a.batches, a.contexts, a.steps, a.rounds)
    lines = [f"shape {a.shape}, {a.dtype}; logits max |ours - reference| = {logits_err:.2e}; "
             f"greedy tokens agreeing: {agree:.0%} of {a.steps}", "", decode_ratio_table(rows, "reference", "ours")]
    report = "\n".join(lines)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / f"{a.shape}.json").write_text(json.dumps({"logits_max_abs_err": logits_err, "greedy_agreement": agree,
                                                       "rows": rows}, indent=2))
    (a.out / f"{a.shape}.md").write_text(report + "\n")
    print(report)


if __name__ == "__main__":
    main()
