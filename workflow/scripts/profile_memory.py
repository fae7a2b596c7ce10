"""Rule profile_memory: weights, KV bytes/token, peak and max batch for one real model shape."""

import dataclasses
import json
import sys

import torch

sys.path.insert(0, snakemake.scriptdir)
from common import rule_context

from melt_core.ops.profiler import profile_memory

sm = snakemake
p = sm.params.profile
with rule_context(sm, "profile") as log:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    report = profile_memory(sm.wildcards.shape, getattr(torch, p["dtype"]), p["kv_tokens"],
                            p["context_for_batch"], p["memory_cap_gb"], device,
                            speed_context=p["real_shape_speed_context"], prefill_chunk=sm.params.prefill_chunk)
    row = dataclasses.asdict(report)
    print(json.dumps(row, indent=2))
    log.log_params({"shape": sm.wildcards.shape, "dtype": p["dtype"], "device": device})
    log.log_metrics({k: v for k, v in row.items() if isinstance(v, (int, float))})
    if row["speed"]:
        log.log_metrics({f"real_shape/{k}": v for k, v in row["speed"].items() if isinstance(v, (int, float))})
    with open(sm.output[0], "w") as fh:
        json.dump(row, fh, indent=2)
