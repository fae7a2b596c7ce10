"""Rule gather: every result file -> a few tidy tables under summary/ (one row per observation)."""

import json
import shutil
import sys
from pathlib import Path

import pandas as pd
import torch

sys.path.insert(0, snakemake.scriptdir)
from common import rule_context
from model_id import ModelId
from verdicts import interval

from melt_core.data import load_tokenizer, prompt_ids, read_jsonl
from melt_core.modeling.checkpoint import load_pretrained
from melt_core.modeling.config import LEARNED_GATES
from melt_core.modeling.gate import mean_retention

sm = snakemake
SETTINGS = sm.params.settings
OUT = Path(SETTINGS["outdir"])


def read_json(path):
    return json.loads(Path(path).read_text())


with rule_context(sm, "report"):
    rows = []
    for path in sm.input.evals:
        r = read_json(path)
        model = ModelId.parse(r["model"]["name"])  # the tables average a model's training seeds
        for metric, value in r["metrics"].items():
            rows.append({"model": str(model.across_seeds), "seed": model.seed, "model_id": r["model"]["name"],
                         "task": r["task"]["name"],
                         "metric": metric,
                         "value": 100 * value, "n_questions": r["n_questions"],
                         "generated_tokens": r["generated_tokens"], "seconds": r["seconds"]})
    pd.DataFrame(rows).to_csv(sm.output.evals, index=False)

    memory = []
    for path in (p for p in sm.input.profiles if "/memory/" in p):
        row = read_json(path)
        speed = row.pop("speed", None) or {}
        memory.append({**row, **{f"speed_{k}": v for k, v in speed.items()}})
    pd.DataFrame(memory).to_csv(sm.output.memory, index=False)
    profile_dir = OUT / "profile"
    pd.DataFrame(read_json(profile_dir / "speed.json")).to_csv(sm.output.speed, index=False)
    pd.DataFrame(read_json(profile_dir / "train_throughput.json")).to_csv(sm.output.train_throughput, index=False)
    shutil.copy(profile_dir / "sweeps.json", sm.output.sweeps)

    curves = []  # each run's curve stitched from its phases' jobs (a shared phase appears in every run)
    for where in sm.params.runs.values():
        for phase_dir in where["phases"]:
            for line in (Path(phase_dir) / "metrics.jsonl").read_text().splitlines():
                curves.append({"run": where["run"], "seed": where["seed"], **json.loads(line)})
    pd.DataFrame(curves).to_csv(sm.output.curves, index=False)

    # Learned gate values: mean z per (layer, loop) over held-out prompts, for every trained run
    # whose gate has a z, and for the untrained conversion as the reference.
    test = read_jsonl(OUT / "data" / "test.jsonl", limit=16) if (OUT / "data" / "test.jsonl").exists() else None
    gate_rows = []
    if test is not None:
        candidates = [(where["run"], where["seed"], Path(where["final"])) for where in sm.params.runs.values()]
        candidates += [("untrained", seed, Path(path)) for seed, path in sm.params.untrained.items()]
        for run, seed, path in candidates:
            model = load_pretrained(path)
            if model.config.gate not in (*LEARNED_GATES, "ema"):
                continue
            tok = load_tokenizer(path)
            ids = [prompt_ids(r, tok, SETTINGS["template"]) for r in test]
            width = min(map(len, ids))
            z = mean_retention(model, torch.tensor([i[:width] for i in ids]))
            for layer in range(z.shape[0]):
                for loop in range(z.shape[1]):
                    gate_rows.append({"run": run, "seed": seed, "gate": model.config.gate, "layer": layer,
                                      "loop": loop + 1, "mean_z": float(z[layer, loop])})
    pd.DataFrame(gate_rows, columns=["run", "seed", "gate", "layer", "loop", "mean_z"]).to_csv(sm.output.gates,
                                                                                              index=False)

    # Early exit: per (model, gate variant, rule) accuracy with its 95% interval over
    # questions, loops per token and tokens/s, each against the same model's every-loop row.
    exits = []
    for path in sm.input.early_exit:
        sweep = read_json(path)
        full = {r["variant"]: r for r in sweep["rows"] if not r["rule"].get("exit_at_loop") and r["rule"]["q"] >= 1}
        for row in sweep["rows"]:
            ref = full.get(row["variant"])
            acc, lo, hi = interval(row["per_question"])  # within [0, 100], as the tables' cells
            exits.append({"model": row["model"], "variant": row["variant"], "rule": row["label"],
                          "rule_json": json.dumps(row["rule"]), "metric": row["metric"], "accuracy": acc,
                          "ci_lo": lo, "ci_hi": hi, "mean_loops": row["mean_loops"], "loops": row["loops"],
                          "loop_fraction": row["mean_loops"] / row["loops"], "tokens_per_s": row["tokens_per_s"],
                          "speedup": row["tokens_per_s"] / ref["tokens_per_s"] if ref else None,
                          "per_question": json.dumps(row["per_question"]), "batch_size": sweep["batch_size"],
                          "device": sweep["device"]})
    pd.DataFrame(exits).to_csv(sm.output.early_exit, index=False)
