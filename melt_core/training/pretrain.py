"""The embedded default's stand-in for downloading Ouro: pretrain a tiny Ouro-architecture
LoopLM on the synthetic task, so the same conversion and Phase 1 / Phase 2 code has a real
teacher to start from. Objective: cross-entropy on answer tokens averaged over the loops'
logits. (Ouro trains every loop's exit too, weighted by its exit distribution plus an entropy
term; the uniform average is our simplification. Final-loop-only CE left a 2-layer model on
a loss plateau for 1,500 steps; all-loop supervision leaves it in ~150.)
The result is an Ouro checkpoint directory (with its tokenizer) in the hub layout.
"""

from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn
from tqdm.auto import tqdm

from ..data import PackedData, load_tokenizer, prompt_ids, read_jsonl
from ..generation.generate import SamplingParams, generate
from ..modeling.checkpoint import save_pretrained
from ..modeling.config import ModelConfig
from ..modeling.early_exit import train_exit_gate
from ..modeling.losses import lm_loss_sum
from ..modeling.model import LoopedLM
from ..tracking import NullLogger, stamp


@dataclass
class PretrainConfig:
    train_file: str
    test_file: str
    tokenizer: str
    out_dir: str
    hidden_size: int = 64
    intermediate_size: int = 192
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    total_ut_steps: int = 4
    steps: int = 700
    batch_size: int = 64
    lr: float = 3e-3
    warmup_steps: int = 50
    weight_decay: float = 0.01
    init_std: float = 0.02
    seed: int = 0
    seq_len: int | None = None  # packed rows of this many tokens; None: one example per row, padded
    extra_tests: dict[str, str] | None = None  # more held-out splits the teacher must pass: name -> JSONL
    eval_examples: int = 256  # at most this many of each held-out split's dev half are checked
    min_exact_match: float = 0.9  # the teacher must reach this on every held-out split's dev half
    # The dev half of each held-out split (its second half: the evals report the first) is checked
    # every `check_every` steps from `check_from` on; training stops once every split reaches
    # `stop_at`, and the teacher is the checked state that scored best (the lowest split's score).
    # A tiny model's long-chain accuracy swings between checkpoints and between machines (the same
    # 1,000 steps gave 98.4% on one machine's CPU and 6.2% on another's), so a fixed step count is
    # not a recipe. check_every 0: one check, after the last step.
    check_every: int = 0
    check_from: int = 0
    stop_at: float | None = None
    exit_gate_steps: int = 0  # then fit the exit gate alone with Ouro's Stage-II objective
    exit_gate_lr: float = 1e-2
    progress: bool = True


def init_weights(model: nn.Module, std: float, generator: torch.Generator) -> None:
    with torch.no_grad():
        for mod in model.modules():
            if isinstance(mod, (nn.Linear, nn.Embedding)):
                mod.weight.copy_(torch.randn(mod.weight.shape, generator=generator) * std)
                if getattr(mod, "bias", None) is not None:
                    mod.bias.zero_()


def _check(model: LoopedLM, dev: dict[str, list[dict]], tok) -> dict[str, float]:
    """Greedy exact-match on each dev split, the model left in training mode."""
    model.eval()
    scores = {k: greedy_exact_match(model, recs, tok)["exact_match"] for k, recs in dev.items()}
    model.train()
    return scores


@torch.no_grad()
def greedy_exact_match(model: LoopedLM, records: list[dict], tokenizer, template: str = "plain",
                       max_new_tokens: int | None = None, batch_size: int = 64, **gen_kw) -> dict:
    """Share of records whose greedy completion equals the reference assistant answer."""
    answers = [next(m["content"] for m in r["messages"] if m["role"] == "assistant") for r in records]
    max_new = max_new_tokens or max(len(tokenizer.encode(a, add_special_tokens=False)) for a in answers) + 1
    prompts = [prompt_ids(r, tokenizer, template) for r in records]
    outs = generate(model, prompts, SamplingParams(max_new_tokens=max_new, greedy=True,
                                                   stop_token_ids=(tokenizer.eos_token_id,)),
                    batch_size=batch_size, **gen_kw)
    preds = [tokenizer.decode(o[0].token_ids, skip_special_tokens=True) for o in outs]
    hits = [p == a for p, a in zip(preds, answers)]
    return {"exact_match": sum(hits) / len(hits), "n": len(hits), "predictions": preds}


@torch.enable_grad()
def pretrain(cfg: PretrainConfig, logger=None) -> dict:
    logger = logger or NullLogger()
    torch.manual_seed(cfg.seed)
    tok = load_tokenizer(cfg.tokenizer)
    train_records, test_records = read_jsonl(cfg.train_file), read_jsonl(cfg.test_file)
    if cfg.seq_len:
        data = PackedData.build(train_records, tok, "plain", cfg.seq_len, seed=cfg.seed, pack=True)
    else:
        seq_len = max(len(prompt_ids(r, tok, "plain")) for r in train_records[:100]) * 2
        data = PackedData.build(train_records, tok, "plain", seq_len, seed=cfg.seed, pack=False)
    model_cfg = ModelConfig(
        model_type="ouro", vocab_size=len(tok), hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size, num_hidden_layers=cfg.num_hidden_layers,
        num_attention_heads=cfg.num_attention_heads, num_key_value_heads=cfg.num_attention_heads,
        total_ut_steps=cfg.total_ut_steps, max_position_embeddings=1024, rope_theta=10_000.0,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    model = LoopedLM(model_cfg)
    init_weights(model, cfg.init_std, torch.Generator().manual_seed(cfg.seed))
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.98))
    logger.log_params(asdict(cfg))
    extra = {f"{k}/exact_match": read_jsonl(v) for k, v in (cfg.extra_tests or {}).items()}
    dev = {"exact_match": test_records, **extra}
    dev = {k: recs[len(recs) // 2:][:cfg.eval_examples] for k, recs in dev.items()}
    best = None  # (lowest split's score, step, scores, state)
    t0 = time.perf_counter()
    # a bar in a terminal; in a rule's log file, a timestamped line every 50th of the run
    in_terminal = cfg.progress and sys.stderr.isatty()
    bar = tqdm(range(cfg.steps), desc="pretrain teacher", disable=not in_terminal, dynamic_ncols=True)
    every = 10 * max(1, cfg.steps // 500)  # a multiple of the loss read-out above
    for step in bar:
        lr = cfg.lr * min(1.0, (step + 1) / cfg.warmup_steps) * 0.5 * (1 + math.cos(math.pi * step / cfg.steps))
        for g in opt.param_groups:
            g["lr"] = lr
        ids, mask = data.batch(step, cfg.batch_size)
        out = model(ids[:, :-1], logits="all")
        per_loop = [lm_loss_sum(lo, ids[:, 1:], mask) for lo in out.per_loop_logits]
        loss = sum(per_loop) / (mask.sum() * len(per_loop))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 10 == 0 or step == cfg.steps - 1:
            bar.set_postfix(loss=f"{loss.item():.4f}")
            logger.log_metrics({"pretrain/loss": loss.item(), "pretrain/lr": lr}, step=step)
            if cfg.progress and not in_terminal and step % every == 0:
                stamp(f"pretrain teacher step {step + 1}/{cfg.steps} loss {loss.item():.4f} lr {lr:.3g} "
                      f"({time.perf_counter() - t0:.0f} s)")
        last = step == cfg.steps - 1
        if last or (cfg.check_every and step + 1 >= cfg.check_from and (step + 1) % cfg.check_every == 0):
            scores = _check(model, dev, tok)
            logger.log_metrics({f"pretrain/dev/{k}": v for k, v in scores.items()}, step=step)
            stamp(f"step {step + 1}: dev greedy exact-match " + ", ".join(f"{k} {v:.3f}" for k, v in scores.items()))
            if best is None or min(scores.values()) >= best[0]:  # a tie: the later, longer-trained state
                best = (min(scores.values()), step + 1, scores, {k: v.clone() for k, v in model.state_dict().items()})
            if cfg.stop_at is not None and min(scores.values()) >= cfg.stop_at:
                break
    _, trained_steps, held_out, state = best
    model.load_state_dict(state)
    stamp(f"teacher: the state after step {trained_steps} of at most {cfg.steps}")
    if cfg.exit_gate_steps:  # Ouro trains its exit gate after the LM (Stage II); so does our teacher
        gate_losses = train_exit_gate(model, lambda s: data.batch(cfg.steps + s, cfg.batch_size),
                                      cfg.exit_gate_steps, cfg.exit_gate_lr, logger, prefix="pretrain/exit_gate")
        stamp(f"exit gate: {cfg.exit_gate_steps} steps, loss {gate_losses[0]:.3f} -> {gate_losses[-1]:.3f}")
    model.eval()
    report = {**held_out, "n_eval": {k: len(v) for k, v in dev.items()}, "steps": trained_steps,
              "max_steps": cfg.steps, "train_seconds": time.perf_counter() - t0, "final_loss": loss.item(),
              "parameters": sum(p.numel() for p in model.parameters())}
    logger.log_metrics({f"teacher/{k}": v for k, v in held_out.items()})
    stamp("teacher greedy exact-match on the held-out dev halves: "
          + ", ".join(f"{k} {v:.3f}" for k, v in held_out.items()))
    short = {k: v for k, v in held_out.items() if v < cfg.min_exact_match}
    if short:
        raise RuntimeError(f"the tiny teacher reached only {short} greedy exact-match on the held-out "
                           f"split(s)' dev half (need >= {cfg.min_exact_match}) in {cfg.steps} steps; "
                           "raise source.pretrain.steps")

    def extras(tmp: Path) -> None:
        tok.save_pretrained(str(tmp))
        (tmp / "pretrain_report.json").write_text(json.dumps(report, indent=2))

    save_pretrained(model, cfg.out_dir, extra_config={"pretrain_report": report}, write_extra=extras)
    return report
