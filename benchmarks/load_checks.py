"""What loading's two whole-file checks cost at the paper's shape (melt_core.modeling.checkpoint.load_pretrained):
the sha256 pass over every file (checksums.json) and the NaN/inf pass over every weight, each timed
on the same Ouro-1.4B-shaped checkpoint (random bf16 weights: the cost depends on bytes, not values),
interleaved round by round.

    python benchmarks/load_checks.py            # writes a 2.8 GB checkpoint under --dir, then times
    python benchmarks/load_checks.py --preset ouro-1.4b --rounds 3

Writes results/benchmarks/load_checks/load_checks.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

from melt_core.modeling.checkpoint import check_finite, read_shapes, read_state_dict, save_pretrained, verify_checksums
from melt_core.modeling.config import ModelConfig
from melt_core.ops.profiler import build_random

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="ouro-1.4b")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dir", type=Path, default=None, help="where to write the checkpoint (default: a temp dir)")
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "benchmarks" / "load_checks")
    args = ap.parse_args()
    cfg = ModelConfig.from_name(args.preset)
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        path = save_pretrained(build_random(cfg, torch.bfloat16), Path(tmp) / "ck")
        size = sum(f.stat().st_size for f in path.iterdir())
        times: dict[str, list[float]] = {"header shapes": [], "sha256 of every file": [], "read weights": [],
                                         "NaN/inf over every weight": [], "... again, pages resident": []}
        for _ in range(args.rounds):
            t0 = time.perf_counter()
            read_shapes(path)
            t1 = time.perf_counter()
            verify_checksums(path)
            t2 = time.perf_counter()
            state = read_state_dict(path)
            t3 = time.perf_counter()
            check_finite(state, str(path))  # the first touch of the mapped file's pages, which the copy
            t4 = time.perf_counter()         # into the model (load_pretrained's next step) pays otherwise
            check_finite(state, str(path))
            t5 = time.perf_counter()
            del state
            for name, t in zip(times, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4)):
                times[name].append(t)
    med = {k: statistics.median(v) for k, v in times.items()}
    ratio = med["... again, pages resident"] / med["sha256 of every file"]
    lines = [f"{args.preset}, {size / 1e9:.2f} GB of bf16 weights, {args.rounds} rounds, {torch.get_num_threads()} "
             "threads", "", "| check | median s | min-max s |", "|---|---:|---:|"]
    lines += [f"| {k} | {med[k]:.3f} | {min(v):.3f}-{max(v):.3f} |" for k, v in times.items()]
    lines += ["", f"NaN/inf arithmetic (pages resident) / sha256 pass: {ratio:.3f}"]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "load_checks.json").write_text(json.dumps({"preset": args.preset, "bytes": size, "times": times,
                                                           "ratio_finite_to_sha256": ratio}, indent=1))
    (args.out / "load_checks.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
