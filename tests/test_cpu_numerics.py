"""The CPU pins (config cpu_numerics, workflow/scripts/cpu_numerics.py): two emulated machines, one
with this CPU's own kernels and two threads, one with ATen's unvectorised kernels and one thread,
train a small looped model to different bits unpinned (so the emulation really changes the
arithmetic) and to the same bits pinned."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "workflow" / "scripts"))
from cpu_numerics import MARKER, PINNED_VARS, check, pin, pinned_env  # noqa: E402

# A few AdamW steps of the embedded teacher's shape (4 loops) with per-loop LM loss: the teacher's step.
PROBE = """
import hashlib, torch
from melt_core.config import ModelConfig
from melt_core.losses import lm_loss_sum
from melt_core.model import LoopedLM
from melt_core.shapes import SPEED_SHAPES
torch.manual_seed(0)
cfg = ModelConfig(model_type="ouro", **SPEED_SHAPES["embedded"])
model = LoopedLM(cfg)
opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
g = torch.Generator().manual_seed(0)
for _ in range(4):
    ids = torch.randint(3, 24, (8, 97), generator=g)
    out = model(ids[:, :-1], logits="all")
    loss = sum(lm_loss_sum(lo, ids[:, 1:], torch.ones_like(ids[:, 1:], dtype=torch.bool)) for lo in out.per_loop_logits)
    opt.zero_grad(); loss.backward(); opt.step()
print(torch.backends.cpu.get_cpu_capability(), torch.get_num_threads(),
      hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters())).hexdigest())
"""

MACHINES = {  # what differs between two machines that a process can be made to see
    "own kernels, 2 threads": {"OMP_NUM_THREADS": "2"},
    "unvectorised kernels, 1 thread": {"ATEN_CPU_CAPABILITY": "default", "MKL_ENABLE_INSTRUCTIONS": "SSE4_2",
                                       "OMP_NUM_THREADS": "1"},
}


def _train(machine: dict, pins: dict) -> tuple[str, str, str]:
    env = {k: v for k, v in os.environ.items() if k not in PINNED_VARS}
    env.update({**machine, **pins, "PYTHONPATH": str(ROOT)})  # the pins go over the machine, as in the Snakefile
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return tuple(out.stdout.split())


def test_pins_make_two_emulated_machines_compute_the_same_bits():
    unpinned = {name: _train(m, {}) for name, m in MACHINES.items()}
    a, b = unpinned.values()
    assert a[0] != b[0] and a[1] != b[1], f"the emulation did not change kernels and threads: {unpinned}"
    assert a[2] != b[2], "unpinned, the two emulated machines trained to the same bits: the check would show nothing"
    pins = pinned_env({"pinned": True, "kernels": "avx2"})
    pinned = {name: _train(m, pins) for name, m in MACHINES.items()}
    assert {p[0] for p in pinned.values()} == {"AVX2"}, pinned
    a, b = pinned.values()
    assert a[2] == b[2], f"pinned, the two emulated machines still differ: {pinned}"


def test_pinned_env_and_errors(monkeypatch):
    assert pinned_env({"pinned": False}) == {}
    with monkeypatch.context() as m:  # the pins name x86 kernels: on ARM nothing is pinned (nor checked)
        m.setattr("platform.machine", lambda: "aarch64")
        assert pinned_env({"pinned": True}) == {}
    env = pinned_env(None)  # the defaults: AVX2 kernels, sleeping OpenMP threads
    assert env["ATEN_CPU_CAPABILITY"] == "avx2" and env["OMP_WAIT_POLICY"] == "PASSIVE"
    assert env["MKL_CBWR"] == "AVX2,STRICT"  # MKL's products the same bits at any thread count
    assert env["MKL_ENABLE_INSTRUCTIONS"] == "AVX2"  # over an environment that capped MKL lower (machine B)
    assert pinned_env({"kernels": "default"})["MKL_CBWR"] == "COMPATIBLE"
    with pytest.raises(ValueError, match="cpu_numerics.kernels"):
        pinned_env({"kernels": "avx512"})


def test_check_fails_when_torch_runs_other_kernels(monkeypatch):
    # pin() writes os.environ: give it a copy, so no pin leaks into later tests' subprocesses
    monkeypatch.setattr(os, "environ", {k: v for k, v in os.environ.items() if k not in PINNED_VARS})
    assert "not pinned" in check("AVX512")
    pin({"kernels": "avx2"})
    assert "CPU kernels AVX2, ATEN_CPU_CAPABILITY=avx2" in check("AVX2")
    with pytest.raises(RuntimeError, match="cpu_numerics.kernels: default"):
        check("DEFAULT")  # a CPU without AVX2: ATen fell back
    pin({"pinned": False})  # unpinned: the caller's environment stands, and nothing is checked
    assert MARKER not in os.environ and "not pinned" in check("DEFAULT")
