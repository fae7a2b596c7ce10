"""Digests of the arithmetic the embedded default's training is made of, under CPU pin sets, to
compare two machines bit for bit (docs/REPRODUCIBILITY.md): run it on each, diff the JSON.

Equal digests for a pin set mean that set computes the same bits on both machines. Each digest is
taken at one and at two threads, and each run also reports which conditional-numerical-
reproducibility (CNR) branch MKL says it took (MKL_VERBOSE), which may differ from the one asked
for. Beside the primitive operations (GEMMs of the training shapes, a long-sum GEMM, SDPA forward
and backward, the elementwise maths, AdamW) it runs the project's own steps: the teacher's
pretraining step and a MELT phase step (chunk-wise forward, KD loss, backward, AdamW) at the
embedded default's shapes.

    python benchmarks/numerics_probe.py > here.json                 # every pin set, 1 and 2 threads
    python benchmarks/numerics_probe.py --pins compatible > here.json # one pin set
    python benchmarks/numerics_probe.py --record                     # this CPU's `compatible` digests
    diff <(python -m json.tool a.json) <(python -m json.tool b.json)

Measured on an Intel Xeon and an AMD EPYC (docs/REPRODUCIBILITY.md): under `compatible` every GEMM,
SDPA and elementwise digest is equal on both, the training steps' are not, so no pin set gives the
two vendors the same bits. `--record` keeps this CPU's `compatible` digests in
tests/fixtures/numerics/compatible-digests.json (one entry a CPU model, replaced when recorded
again): tests/test_cpu_numerics.py compares a machine with the entry of its own CPU model only, a
regression check of the arithmetic where the same kernels are known to run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "workflow" / "scripts"))
from cpu_numerics import KERNELS, PINNED_VARS, pinned_env  # noqa: E402

# config cpu_numerics.kernels' sets (avx2: config/default.yaml's), and this machine's own kernels
PIN_SETS = {**{k: pinned_env({"kernels": k}) for k in KERNELS}, "unpinned": {}}

CHILD = r'''
import hashlib, json, torch
import torch.nn.functional as F
from melt_core.modeling.checkpoint import melt_from_ouro
from melt_core.modeling.config import ModelConfig
from embedded_steps import phase_step, teacher_step
from melt_core.modeling.model import LoopedLM
from melt_core.modeling.shapes import SPEED_SHAPES
torch.manual_seed(0)
def h(t): return hashlib.sha256(t.detach().contiguous().numpy().tobytes()).hexdigest()[:16]
def params(m): return torch.cat([p.detach().flatten() for p in m.parameters()])
out = {"capability": torch.backends.cpu.get_cpu_capability(), "threads": torch.get_num_threads()}
a, b = torch.randn(3328, 256), torch.randn(256, 1024)
out["gemm 3328x256 @ 256x1024"] = h(a @ b)
c = torch.randn(1024, 256)
out["gemm 3328x1024 @ 1024x256"] = h((a @ b) @ c)
q, k, v = (torch.randn(16, 8, 208, 32, requires_grad=True) for _ in range(3))
o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
out["sdpa forward"] = h(o)
o.square().sum().backward()
out["sdpa backward dq"] = h(q.grad)
x = torch.randn(3328, 256)
out["exp, tanh, sigmoid, log_softmax"] = h(torch.cat([x.exp(), x.tanh(), x.sigmoid(), F.log_softmax(x, -1)]))
mlp = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.SiLU(), torch.nn.Linear(1024, 256))
opt = torch.optim.AdamW(mlp.parameters(), lr=1e-3)
for _ in range(3):
    loss = F.mse_loss(mlp(x), x)
    opt.zero_grad(); loss.backward(); opt.step()
out["mlp: 3 AdamW steps, weights"] = h(params(mlp))
out["mlp: loss after 3 steps (hex)"] = loss.item().hex()
# beyond the first probe (../shared/numerics/probe.py, whose draws come first and match it)
out["gemm 64x16384 @ 16384x64 (long sums)"] = h(torch.randn(64, 16384) @ torch.randn(16384, 64))
# the project's own steps at the embedded default's shapes (config/default.yaml)
cfg = ModelConfig(model_type="ouro", **SPEED_SHAPES["embedded"])
teacher = LoopedLM(cfg)
opt = torch.optim.AdamW(teacher.parameters(), lr=3e-3)
g = torch.Generator().manual_seed(0)
for _ in range(3):  # source.pretrain: per-loop LM loss on packed rows of 208 tokens
    teacher_step(teacher, opt, torch.randint(3, 24, (8, 209), generator=g))
out["teacher: 3 pretraining steps, weights"] = h(params(teacher))
teacher.eval()
student = melt_from_ouro(teacher, gate="elementwise", gate_init_std=0.1).train()
opt = torch.optim.AdamW(student.parameters(), lr=1e-3)
for _ in range(2):  # train: chunk-wise forward (C = 16 of 208), KD on every loop's logits
    loss = phase_step(teacher, student, opt, torch.randint(3, 24, (4, 208), generator=g))
out["melt: 2 chunk-wise phase steps, weights"] = h(params(student))
out["melt: loss of the last step (hex)"] = loss.item().hex()
print("JSON" + json.dumps(out))
'''


def run(pins: dict[str, str], threads: int, python: str = sys.executable) -> dict:
    """The child's digests under `pins` at `threads` threads, in a fresh interpreter (the pins must be
    set before torch loads), with the CNR branch MKL reported for its products."""
    env = {k: v for k, v in os.environ.items() if k not in PINNED_VARS and not k.startswith(("MKL_", "ONEDNN_"))}
    env.update(pins, OMP_NUM_THREADS=str(threads), MKL_VERBOSE="1",
               PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "benchmarks")]))
    done = subprocess.run([python, "-c", CHILD], env=env, capture_output=True, text=True, timeout=600)
    if done.returncode:
        raise RuntimeError(f"the probe failed under {pins} at {threads} thread(s):\n{done.stderr[-3000:]}")
    result = json.loads(done.stdout.split("JSON", 1)[1])
    result["mkl CNR branch taken"] = sorted(set(re.findall(r"CNR:(\S+)", done.stdout))) or ["none reported"]
    return result


RECORDS = ROOT / "tests" / "fixtures" / "numerics" / "compatible-digests.json"
IDENTITY = ("vendor", "cpu", "vendor isa", "machine", "torch")  # what must match for the same kernels to run


def machine(python: str = sys.executable) -> dict:
    """This CPU (and `python`'s torch) as the recorded digests name it: a record applies where every
    IDENTITY field matches."""
    torch_version = subprocess.run([python, "-c", "import torch; print(torch.__version__)"], capture_output=True,
                                   text=True, check=True).stdout.strip()
    info = {}
    for line in open("/proc/cpuinfo") if Path("/proc/cpuinfo").exists() else []:
        key, _, value = line.partition(":")
        info.setdefault(key.strip(), value.strip())
    flags = info.get("flags", "").split()
    return {"vendor": info.get("vendor_id", "?"), "cpu": info.get("model name", "?"), "machine": platform.machine(),
            "vendor isa": sorted(f for f in flags if f in ("avx2", "avx512f", "avx512_bf16", "amx_tile")),
            "torch": torch_version}


def matching_record(records: list[dict], here: dict) -> dict | None:
    """The record taken on this CPU model (and torch build), if any."""
    return next((r for r in records if all(r.get(k) == here[k] for k in IDENTITY)), None)


def record(path: Path, when: str) -> dict:
    """This machine's `compatible` digests at 1 and 2 threads, written into `path` in place of an
    earlier record of the same CPU model."""
    here = machine()
    entry = {**here, "recorded": f"benchmarks/numerics_probe.py --record, {when}",
             "runs": {f"compatible, {t} thread(s)": run(PIN_SETS["compatible"], t) for t in (1, 2)}}
    records = json.loads(path.read_text())["machines"] if path.exists() else []
    records = [r for r in records if any(r.get(k) != here[k] for k in IDENTITY)] + [entry]
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"machines": records}, indent=1) + "\n")
    tmp.replace(path)
    return entry


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pins", nargs="+", choices=sorted(PIN_SETS), default=list(PIN_SETS))
    ap.add_argument("--python", default=sys.executable, help="the interpreter whose torch to probe")
    ap.add_argument("--record", action="store_true", help=f"write this CPU's `compatible` digests into {RECORDS}")
    args = ap.parse_args()
    if args.record:
        import datetime

        entry = record(RECORDS, datetime.date.today().isoformat())
        print(f"recorded {entry['vendor']} {entry['cpu']} (torch {entry['torch']}) into {RECORDS}")
        return
    report = {**machine(args.python), "runs": {}}
    for name in args.pins:
        for threads in (1, 2):
            report["runs"][f"{name}, {threads} thread(s)"] = run(PIN_SETS[name], threads, args.python)
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
