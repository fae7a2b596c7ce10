"""The CPU pins (config cpu_numerics, workflow/scripts/cpu_numerics.py): two emulated machines, one
with this CPU's own kernels and two threads, one with ATen's unvectorised kernels and one thread,
train a small looped model to different bits unpinned (so the emulation really changes the
arithmetic) and to the same bits pinned."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "workflow" / "scripts"))
from cpu_numerics import MARKER, PINNED_VARS, check, cpu_vendor, expected_branch, pin, pinned_env  # noqa: E402

# A few AdamW steps of the embedded teacher's shape (4 loops) with per-loop LM loss: the teacher's step.
PROBE = """
import hashlib, torch
from melt_core.modeling.config import ModelConfig
from melt_core.modeling.losses import lm_loss_sum
from melt_core.modeling.model import LoopedLM
from melt_core.modeling.shapes import SPEED_SHAPES
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
    # MKL's COMPATIBLE branch at a fixed thread count (not the same bits on Intel and AMD: measured)
    compatible = pinned_env({"kernels": "compatible"})
    assert compatible["MKL_CBWR"] == "COMPATIBLE" and compatible["MKL_DYNAMIC"] == "FALSE"
    assert compatible["ATEN_CPU_CAPABILITY"] == "avx2"
    with pytest.raises(ValueError, match="'vendor-neutral' was withdrawn.*kernels: compatible"):
        pinned_env({"kernels": "vendor-neutral"})
    assert pinned_env({"kernels": "default"})["MKL_CBWR"] == "COMPATIBLE"
    # what MKL runs for a branch: the one asked for on Intel; AUTO in place of an ISA branch elsewhere
    assert expected_branch("AVX2,STRICT", "GenuineIntel") == "AVX2,STRICT"
    assert expected_branch("AVX2,STRICT", "AuthenticAMD") == "AUTO,STRICT"
    assert expected_branch("COMPATIBLE", "AuthenticAMD") == "COMPATIBLE"
    with pytest.raises(ValueError, match="cpu_numerics.kernels"):
        pinned_env({"kernels": "avx512"})


def test_check_fails_when_torch_runs_other_kernels(monkeypatch):
    # pin() writes os.environ: give it a copy, so no pin leaks into later tests' subprocesses
    monkeypatch.setattr(os, "environ", {k: v for k, v in os.environ.items() if k not in PINNED_VARS})
    assert "not pinned" in check("AVX512")
    os.environ["MKL_ENABLE_INSTRUCTIONS"] = "SSE4_2"  # a cap the caller set: cleared by pins that set none
    pin({"kernels": "compatible"})
    assert "MKL_ENABLE_INSTRUCTIONS" not in os.environ
    assert "CPU kernels AVX2, MKL branch COMPATIBLE" in check("AVX2", "COMPATIBLE")
    with pytest.raises(RuntimeError, match="MKL reports it ran CNR:AUTO,STRICT"):
        check("AVX2", "AUTO,STRICT")
    pin({"kernels": "avx2"})
    here = expected_branch("AVX2,STRICT", cpu_vendor())
    assert f"CPU kernels AVX2, MKL branch {here}" in check("AVX2", here)
    with pytest.raises(RuntimeError, match="MKL reports it ran CNR:AUTO\\b"):
        check("AVX2", "AUTO")  # not strict: MKL_CBWR was read before the pins were set
    with pytest.raises(RuntimeError, match="cpu_numerics.kernels: default"):
        check("DEFAULT")  # a CPU without AVX2: ATen fell back
    pin({"pinned": False})  # unpinned: the caller's environment stands, and nothing is checked
    assert MARKER not in os.environ and "not pinned" in check("DEFAULT")


# A job's own check, as workflow/scripts/common.py runs it: MKL reads MKL_CBWR when it first computes,
# so pins set after torch has run a product are not the branch it runs, and the check must say so.
JOB = """
import os, sys, torch
sys.path.insert(0, {scripts!r})
from cpu_numerics import check, mkl_branch, pin
if {late}:
    torch.ones(4, 4) @ torch.ones(4, 4)  # MKL starts with the caller's branch
pin({{"kernels": "compatible"}})
print(check(torch.backends.cpu.get_cpu_capability(), mkl_branch()))
"""


@pytest.mark.parametrize("late", [False, True], ids=["pinned before torch computes", "pinned too late"])
def test_a_job_fails_when_mkl_runs_another_branch(late):
    env = {k: v for k, v in os.environ.items() if k not in PINNED_VARS and not k.startswith("MKL_")}
    env["MKL_CBWR"] = "AUTO"  # the caller's own branch, which MKL keeps once it has computed
    env["ATEN_CPU_CAPABILITY"] = "avx2"  # ATen's kernels right from the start: only MKL's branch is late
    code = JOB.format(scripts=str(ROOT / "workflow" / "scripts"), late=late)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    if late:
        assert out.returncode != 0 and "MKL reports it ran CNR:AUTO" in out.stderr, out.stderr[-2000:]
    else:
        assert out.returncode == 0, out.stderr[-2000:]
        assert "MKL branch COMPATIBLE" in out.stdout


# The `compatible` pins' digests as recorded on each CPU model (tests/fixtures/numerics/). An Intel Xeon and an
# AMD EPYC gave different bits for the training steps under these pins, so a machine is compared with its
# own CPU model's record only (a regression check where the same kernels run); on every machine, one and
# two threads must give the same bits (the pins' claim that holds on both vendors).
def test_compatible_arithmetic_is_the_same_at_one_and_two_threads_and_as_recorded_on_this_cpu():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from numerics_probe import IDENTITY, PIN_SETS, RECORDS, machine, matching_record, run

    records = json.loads(RECORDS.read_text())["machines"]
    assert {r["vendor"] for r in records} >= {"GenuineIntel", "AuthenticAMD"}, "a record of each vendor is kept"
    got = {t: run(PIN_SETS["compatible"], t) for t in (1, 2)}
    differ = sorted(k for k in got[1] if k != "threads" and got[1][k] != got[2].get(k))
    assert not differ, f"under the compatible pins one and two threads differ here in {differ}"
    here = machine()
    mine = matching_record(records, here)
    if mine is None:  # another CPU model: its own arithmetic, not comparable bit for bit with any record
        print(f"no recorded digests for {[here[k] for k in IDENTITY]}: "
              "`python benchmarks/numerics_probe.py --record` adds them")
        return
    for t in (1, 2):
        want = mine["runs"][f"compatible, {t} thread(s)"]
        differ = sorted(k for k in want if got[t].get(k) != want[k])
        assert not differ, (f"at {t} thread(s) the compatible pins' arithmetic differs from that recorded on this CPU "
                            f"model ({mine['recorded']}) in {differ}: here {[got[t].get(k) for k in differ]}, "
                            f"there {[want[k] for k in differ]}. Re-record it (numerics_probe.py --record) only "
                            "if the change is meant (a torch or MKL update); see docs/REPRODUCIBILITY.md")


def test_machine_records_match_by_cpu_model():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from numerics_probe import IDENTITY, matching_record

    a = dict.fromkeys(IDENTITY, "x") | {"vendor": "AuthenticAMD", "runs": {}}
    b = a | {"vendor": "GenuineIntel"}
    assert matching_record([a, b], {k: b[k] for k in IDENTITY}) is b
    assert matching_record([a], {k: b[k] for k in IDENTITY}) is None  # another vendor's digests never apply
    assert matching_record([a], {k: a[k] for k in IDENTITY} | {"torch": "y"}) is None  # nor another torch's
