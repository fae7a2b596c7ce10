"""Each job's CPU arithmetic pinned (config `cpu_numerics`), so one config gives bitwise the same
results on x86-64 machines with AVX2 whatever their CPU model and core count (checked on two
emulated machines: benchmarks/cross_machine.py; docs/REPRODUCIBILITY.md).

Without it the embedded default's conclusions changed with the CPU (docs/REPRODUCIBILITY.md): ATen
picks its vectorised kernels by the CPU's widest ISA (AVX512 here, AVX2 elsewhere), MKL its GEMM
code path by CPU model and, on some CPUs, splits a product's long sums between its threads; the last
bits of a sum differ between them, and training amplifies such differences until a tiny teacher's
checkpoints score differently. The pins choose the kernels by name instead: ATen's AVX2 kernels
(ATEN_CPU_CAPABILITY), MKL's AVX2 path (MKL_ENABLE_INSTRUCTIONS) in strict conditional-numerical-
reproducibility mode (MKL_CBWR=AVX2,STRICT: the same bits at any MKL thread count), oneDNN capped at
AVX2. OpenMP threads sleep instead of spinning when they wait (OMP_WAIT_POLICY=PASSIVE): a
two-thread job beside another busy process slows in proportion, not several-fold. A job's thread
count is its rule's `threads`; the results do not depend on it at these shapes
(benchmarks/cross_machine.py runs one and two threads per job).

No torch import here: these variables must be set before torch loads. The Snakefile sets them in
its own environment, which every job inherits (local jobs, sbatch, submitit); workflow/scripts/
common.py then checks in each job that torch really runs the pinned kernels.
"""

from __future__ import annotations

import os
import platform

# kernels: the ISA every job computes with. avx2: any x86-64 CPU since 2013-2015 (Intel Haswell,
# AMD Excavator), no slower here than this CPU's own AVX512 kernels; default: ATen's unvectorised
# kernels and MKL's SSE2 path, for CPUs without AVX2, ~1.7x slower per training step here.
# MKL: its AVX2 code (MKL_CBWR's branch, and MKL_ENABLE_INSTRUCTIONS over any cap the environment
# set) in strict mode, whose matrix products are the same bits whatever MKL's thread count: without
# STRICT, MKL on an Intel Xeon splits a two-thread job's long sums between its threads and on an AMD
# EPYC did not, so the same config trained different teachers on the two (docs/REPRODUCIBILITY.md).
# MKL has no strict mode for its COMPATIBLE branch: with `default` kernels the results also depend on
# each job's thread count (a rule's `threads`, fixed by the config wherever --cores allows it).
KERNELS = {
    "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2,STRICT", "MKL_ENABLE_INSTRUCTIONS": "AVX2",
             "ONEDNN_MAX_CPU_ISA": "AVX2"},
    "default": {"ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "COMPATIBLE", "MKL_ENABLE_INSTRUCTIONS": "SSE4_2",
                "ONEDNN_MAX_CPU_ISA": "SSE41"},
}
MARKER = "MELT_CPU_KERNELS"  # set with the pins: a job checks that torch runs what was pinned
PINNED_VARS = sorted({k for env in KERNELS.values() for k in env} | {"OMP_WAIT_POLICY", MARKER})  # all pin() sets


def pinned_env(cfg: dict | None) -> dict[str, str]:
    """The environment variables that pin a job's CPU arithmetic; {} when `pinned` is false."""
    cfg = cfg or {}
    if not cfg.get("pinned", True) or platform.machine().lower() not in ("x86_64", "amd64"):
        return {}  # the pins name x86 kernels; elsewhere (ARM login or GPU nodes) each machine's own
    kernels = cfg.get("kernels", "avx2")
    if kernels not in KERNELS:
        raise ValueError(f"config cpu_numerics.kernels: {kernels!r} is not one of {sorted(KERNELS)}")
    return {**KERNELS[kernels], "OMP_WAIT_POLICY": cfg.get("wait_policy", "passive").upper(), MARKER: kernels}


def pin(cfg: dict | None) -> dict[str, str]:
    """Set the pins in this process's environment (over whatever the caller had): the pins. Unpinned,
    the environment is left as the caller set it (the machine's own), and nothing is checked."""
    env = pinned_env(cfg)
    if not env:
        os.environ.pop(MARKER, None)
    os.environ.update(env)
    return env


def check(capability: str) -> str:
    """One line for the job's log saying how it computes; raises if the pinned kernels (the
    environment pin() set, which the job inherited) are not the ones torch runs (`capability`:
    torch.backends.cpu.get_cpu_capability(); e.g. a CPU without AVX2, where ATen falls back)."""
    pinned = os.environ.get(MARKER)
    line = ("CPU kernels " + capability + ", " + ", ".join(f"{k}={os.environ.get(k, 'unset')}" for k in PINNED_VARS)
            + ("" if pinned else " (not pinned: this machine's own kernels)"))
    want = os.environ.get("ATEN_CPU_CAPABILITY")
    if pinned and capability.lower() != want:
        raise RuntimeError(f"cpu_numerics.kernels: {pinned} asks ATen's {want} kernels, but torch runs {capability}: "
                           "this CPU lacks them or torch was imported before the pins were set; set "
                           "cpu_numerics.kernels: default in the config (the results then match other machines "
                           "run with default kernels), or cpu_numerics.pinned: false")
    return line
