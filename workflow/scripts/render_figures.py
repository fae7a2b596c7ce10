"""Rule figure: one figure from the gathered tables.

figure1_pareto: accuracy vs KV memory per token (ours: measured MB/token at the real shapes;
accuracy from our benchmark), training_curves: loss terms and alpha per run, gate_values:
mean z per layer and loop, memory_sweeps: cache bytes vs loops and window.
"""

import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

sys.path.insert(0, snakemake.scriptdir)
from common import rule_context
from report_common import Results

sm = snakemake


def figure1_pareto(r: Results, ax):
    kv = r.memory.set_index("shape")["kv_mb_per_token_measured"]
    points = [("Ouro", "ouro", kv.get("ouro-1.4b")), ("MELT", r.main_model, kv.get("melt-1.6b"))]
    points += [(f"Ouro {v} (untrained)", f"ouro-{v}", kv.get("melt-1.6b")) for v in r.config["baselines"]["sharing"]]
    for label, model, mem in points:
        acc = r.score(model, "MATH-500")
        if acc is not None and mem is not None:
            ax.scatter(mem, acc, s=60)
            ax.annotate(label, (mem, acc), textcoords="offset points", xytext=(5, 5), fontsize=8)
    kv_paper, acc_paper = r.paper["table2_memory"], r.paper["table1_main"].get("MATH-500", {})
    pts = [(kv_paper.get(shape, {}).get("kv_mb_per_token"), acc_paper.get(model))
           for shape, model in (("ouro-1.4b", "ouro"), ("melt-1.6b", "melt"), ("qwen3-1.7b-shape", "qwen3"))]
    pts = [(x, y) for x, y in pts if x is not None and y is not None]  # what this paper version reports
    if pts:
        ax.scatter(*zip(*pts), marker="x", c="gray", label=f"paper {r.version} (MATH-500)")
    ax.set_xlabel("KV cache MB per token (bf16, real 1.4B/1.6B shapes)")
    ax.set_ylabel(f"accuracy % ({r.columns.get('MATH-500')})")
    ax.set_title("Accuracy vs KV memory (Figure 1)")
    ax.legend(fontsize=8)


def training_curves(r: Results, ax):
    for run, df in r.curves.groupby("run"):
        ax.plot(df.step, df.loss, label=run, lw=1)
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("loss (KD + beta * alignment)")
    ax.set_title("Training curves (alpha 0 -> 1 in Phase 1, then Phase 2)")
    ax.legend(fontsize=6, ncol=2)


def gate_values(r: Results, ax):
    if r.gates.empty:
        ax.text(0.5, 0.5, "no gate with a z", ha="center")
        return
    for (run, layer), df in r.gates.groupby(["run", "layer"]):
        ax.plot(df.loop, df.mean_z, marker="o", label=f"{run} L{layer}", lw=1)
    ax.set_xlabel("loop t")
    ax.set_ylabel("mean z (share of h_prev kept)")
    ax.set_ylim(0, 1)
    ax.set_title("Learned gate values per layer and loop")
    ax.legend(fontsize=6, ncol=2)


def memory_sweeps(r: Results, ax):
    loops = r.sweeps["loops"]
    for model in ("ouro", "melt"):
        pts = [(p["T"], p["kv_mb_per_token"]) for p in loops if p["model"] == model]
        ax.plot(*zip(*pts), marker="o", label=f"{model}: vs loops T (W=0)")
    wins = r.sweeps["windows"]
    ax.plot([4] * len(wins), [w["kv_mb_per_token"] for w in wins], "s", label="melt T=4, W = " +
            ", ".join(str(w["W"]) for w in wins) + f" at {r.sweeps['context']} tokens")
    ax.set_xlabel("loops T")
    ax.set_ylabel("measured KV MB per token (1.6B shape, bf16)")
    ax.set_title("MELT's cache is flat in T; Ouro's grows linearly")
    ax.legend(fontsize=7)


with rule_context(sm, "report"):
    results = Results(sm.config, sm.params.paper)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    globals()[sm.wildcards.figure](results, ax)
    fig.tight_layout()
    fig.savefig(sm.output[0], dpi=120)
