"""Builds a tiny but complete training setup: synthetic data, a tokenizer, a random tiny
Ouro teacher and its converted MELT student, plus a matching train config dict."""

from pathlib import Path

import torch

import melt_core
from melt_core.data import make_digit_sum_task
from melt_core.training.pretrain import init_weights


def tiny_setup(root: Path, digits: int = 4, n_train: int = 64, window: int = 0, gate: str = "elementwise"):
    paths = make_digit_sum_task(root / "data", digits=digits, n_train=n_train, n_test=8, seed=0)
    tok = melt_core.data.load_tokenizer(paths["tokenizer"])
    cfg = melt_core.ModelConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64,
                                num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                                total_ut_steps=3, max_position_embeddings=128, rope_theta=10_000.0,
                                bos_token_id=1, eos_token_id=2, pad_token_id=0)
    torch.manual_seed(0)
    teacher = melt_core.LoopedLM(cfg)
    init_weights(teacher, 0.2, torch.Generator().manual_seed(0))
    teacher_dir = melt_core.save_pretrained(teacher, root / "teacher", write_extra=tok.save_pretrained)
    student_dir = melt_core.convert_ouro_to_melt(teacher_dir, root / f"student-{gate}-{window}", gate=gate,
                                                 window=window, gate_init_std=0.1, seed=0)
    return paths, teacher_dir, student_dir


def train_config(root: Path, paths, teacher_dir, student_dir, out: str, **over):
    cfg = {
        "student": str(student_dir), "teacher": str(teacher_dir), "out_dir": str(root / out),
        "data": {"sources": [{"kind": "jsonl", "path": str(paths["train"]), "schema": "chat"}],
                 "tokenizer": str(paths["tokenizer"]), "template": "plain", "seq_len": 24},
        "phases": [{"name": "phase1", "steps": 3, "alpha_start": 0.0, "alpha_end": 1.0},
                   {"name": "phase2", "steps": 3, "align_beta": 0.1}],
        "chunk_size": 4, "batch_size": 4, "lr_model": 1e-3, "lr_gate": 1e-2,
        "checkpoint_every": 2, "progress": False, "seed": 0,
    }
    for k, v in over.items():
        cfg[k] = v
    return cfg
