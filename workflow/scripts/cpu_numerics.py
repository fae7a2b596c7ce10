"""Each job's CPU arithmetic pinned (config `cpu_numerics`), so that a config's results depend on
what was pinned, not on the machine's core count or CPU model (docs/REPRODUCIBILITY.md).

Without pins the embedded default's conclusions changed with the CPU: ATen picks its vectorised
kernels by the CPU's widest ISA, MKL its GEMM code path by CPU model and vendor; the last bits of a
sum differ between them, and training amplifies such differences until a tiny teacher's checkpoints
score differently. The pins choose the kernels by name instead (`kernels`):

- avx2 (default): ATen's AVX2 kernels (ATEN_CPU_CAPABILITY) and MKL's AVX2 path in strict
  conditional-numerical-reproducibility (CNR) mode (MKL_CBWR=AVX2,STRICT), the same bits at any
  thread count. MKL honours that branch on Intel CPUs only: on others (an AMD EPYC) it runs its AUTO
  path, strictly, capped at AVX2 (MKL_ENABLE_INSTRUCTIONS). So an Intel and an AMD machine compute
  different bits, and train different models, from the same config.
- compatible: ATen's AVX2 kernels and MKL's COMPATIBLE branch (SSE2 code) at a fixed thread count,
  for 1.6-1.8x a training step (benchmarks/pin_cost.py). Its GEMMs, SDPA and elementwise maths gave
  the same bits on an Intel Xeon and an AMD EPYC, but a training step did not (AdamW steps of an MLP,
  the teacher's and a MELT phase step differ: docs/REPRODUCIBILITY.md), so no pin set here gives
  Intel and AMD the same bits. It was called `vendor-neutral` until that was measured.
- default: ATen's unvectorised kernels and MKL's COMPATIBLE branch, for CPUs without AVX2.

OpenMP threads sleep instead of spinning when they wait (OMP_WAIT_POLICY=PASSIVE): a two-thread job
beside another busy process slows in proportion, not several-fold.

No torch import at module level: these variables must be set before torch loads. The Snakefile
sets them in its own environment, which every job inherits (local jobs, sbatch, submitit);
workflow/scripts/common.py then checks in each job that torch runs the pinned ATen kernels and that
MKL took the branch the pins lead to on this CPU (check(), with mkl_branch()'s answer).
"""

from __future__ import annotations

import os
import platform
import re
import tempfile

# AVX2: any x86-64 CPU since 2013-2015 (Intel Haswell, AMD Excavator). MKL's strict mode (the same
# bits at any thread count) exists for its AVX2-and-up branches only: under COMPATIBLE a product's
# bits may depend on the job's thread count (a rule's `threads`, fixed by the config wherever --cores
# allows it; one and two threads gave the same bits at the embedded default's shapes on an AMD EPYC:
# benchmarks/numerics_probe.py), so MKL may not pick its thread count itself (MKL_DYNAMIC).
KERNELS = {
    "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2,STRICT", "MKL_ENABLE_INSTRUCTIONS": "AVX2",
             "ONEDNN_MAX_CPU_ISA": "AVX2"},
    "compatible": {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "COMPATIBLE", "MKL_DYNAMIC": "FALSE",
                   "ONEDNN_MAX_CPU_ISA": "AVX2"},
    "default": {"ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "COMPATIBLE", "MKL_ENABLE_INSTRUCTIONS": "SSE4_2",
                "ONEDNN_MAX_CPU_ISA": "SSE41"},
}


def expected_branch(cbwr: str, vendor: str) -> str:
    """The CNR branch MKL reports for MKL_CBWR=`cbwr` on a CPU of `vendor`: an Intel CPU runs the
    branch asked for; on others MKL runs AUTO in place of an ISA branch (measured on an AMD EPYC;
    MKL's documentation: on non-Intel CPUs only its AUTO and COMPATIBLE branches are supported)."""
    if vendor == "GenuineIntel" or cbwr.split(",")[0] in ("COMPATIBLE", "AUTO", "OFF"):
        return cbwr
    return ",".join(["AUTO", *cbwr.split(",")[1:]])


def cpu_vendor() -> str:
    """/proc/cpuinfo's vendor_id (GenuineIntel, AuthenticAMD, ...); '?' where there is none."""
    try:
        with open("/proc/cpuinfo") as fh:
            return next((line.split(":", 1)[1].strip() for line in fh if line.startswith("vendor_id")), "?")
    except OSError:
        return "?"


MARKER = "MELT_CPU_KERNELS"  # set with the pins: a job checks that torch runs what was pinned
PINNED_VARS = sorted({k for env in KERNELS.values() for k in env} | {"OMP_WAIT_POLICY", MARKER})  # all pin() sets


def pinned_env(cfg: dict | None) -> dict[str, str]:
    """The environment variables that pin a job's CPU arithmetic; {} when `pinned` is false."""
    cfg = cfg or {}
    if not cfg.get("pinned", True) or platform.machine().lower() not in ("x86_64", "amd64"):
        return {}  # the pins name x86 kernels; elsewhere (ARM login or GPU nodes) each machine's own
    kernels = cfg.get("kernels", "avx2")
    if kernels == "vendor-neutral":
        raise ValueError("config cpu_numerics.kernels: 'vendor-neutral' was withdrawn: it trained to other bits on "
                         "Intel and AMD CPUs (docs/REPRODUCIBILITY.md). Set kernels: compatible for the same pins "
                         "(MKL's COMPATIBLE branch), or avx2 (the default)")
    if kernels not in KERNELS:
        raise ValueError(f"config cpu_numerics.kernels: {kernels!r} is not one of {sorted(KERNELS)}")
    return {**KERNELS[kernels], "OMP_WAIT_POLICY": cfg.get("wait_policy", "passive").upper(), MARKER: kernels}


def pin(cfg: dict | None) -> dict[str, str]:
    """Set the pins in this process's environment (over whatever the caller had, and clearing the
    pinned variables the pins leave unset): the pins. Unpinned, the environment is left as the
    caller set it (the machine's own), and nothing is checked."""
    env = pinned_env(cfg)
    if not env:
        os.environ.pop(MARKER, None)
        return env
    for var in PINNED_VARS:
        os.environ.pop(var, None)
    os.environ.update(env)
    return env


def mkl_branch() -> str | None:
    """The CNR branch MKL reports for a matrix product in this process (e.g. 'COMPATIBLE',
    'AUTO,STRICT', 'OFF'), from MKL's own verbose line; None where torch does not use MKL."""
    import torch  # here, not at the top: the pins must be set before torch loads

    if not torch.backends.mkl.is_available():
        return None
    a = torch.ones(8, 8)
    saved = os.dup(1)  # MKL writes its verbose lines to the C stdout: catch them at the descriptor
    with tempfile.TemporaryFile() as caught:
        os.dup2(caught.fileno(), 1)
        try:
            with torch.backends.mkl.verbose(torch.backends.mkl.VERBOSE_ON):
                torch.mm(a, a)
        finally:
            os.dup2(saved, 1)
            os.close(saved)
        caught.seek(0)
        found = re.findall(r"CNR:(\S+)", caught.read().decode(errors="replace"))
    return found[-1] if found else "none reported"


def check(capability: str, branch: str | None = None) -> str:
    """One line for the job's log saying how it computes; raises if the pinned kernels (the
    environment pin() set, which the job inherited) are not the ones torch runs (`capability`:
    torch.backends.cpu.get_cpu_capability(); e.g. a CPU without AVX2, where ATen falls back), or if
    MKL did not take the pinned branch (`branch`: mkl_branch(); None where torch has no MKL)."""
    pinned = os.environ.get(MARKER)
    vendor = cpu_vendor()
    line = ("CPU kernels " + capability + f", MKL branch {branch or 'none (no MKL)'} on {vendor}, "
            + ", ".join(f"{k}={os.environ.get(k, 'unset')}" for k in PINNED_VARS)
            + ("" if pinned else " (not pinned: this machine's own kernels)"))
    if not pinned:
        return line
    want = os.environ.get("ATEN_CPU_CAPABILITY")
    if capability.lower() != want:
        raise RuntimeError(f"cpu_numerics.kernels: {pinned} asks ATen's {want} kernels, but torch runs {capability}: "
                           "this CPU lacks them or torch was imported before the pins were set; set "
                           "cpu_numerics.kernels: default in the config (the results then match other machines "
                           "run with default kernels), or cpu_numerics.pinned: false")
    cbwr = os.environ.get("MKL_CBWR")
    want_branch = expected_branch(cbwr, vendor) if cbwr else None
    if branch is not None and want_branch and branch != want_branch:
        raise RuntimeError(f"cpu_numerics.kernels: {pinned} pins MKL_CBWR={cbwr}, which MKL runs as CNR:{want_branch} "
                           f"on this {vendor} CPU, but MKL reports it ran CNR:{branch}: MKL computed before the pins "
                           "were set (import torch only after workflow/scripts/cpu_numerics.pin) or this MKL "
                           "dispatches otherwise; the job's results would not match other machines'. Set "
                           "cpu_numerics.pinned: false to run on this machine's own kernels knowingly")
    return line
