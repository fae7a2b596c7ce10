"""Rule figure: one figure from the gathered tables.

figure1_pareto: accuracy vs KV memory per token (ours: measured MB/token at the real shapes;
accuracy from our benchmark), training_curves: loss terms and alpha per run, gate_values:
mean z per layer and loop, memory_sweeps: cache bytes vs loops and window, accuracy_vs_length: the
long-answer task's accuracy at every answer length (report.long_column).
"""

import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

sys.path.insert(0, snakemake.scriptdir)
from common import rule_context
from model_id import ModelId, parse_run
from report_common import Results

from melt_core.modeling.config import LEARNED_GATES

sm = snakemake


STYLES = [(c, ls) for ls in ("-", "--", ":", "-.") for c in plt.get_cmap("tab10").colors]  # 40 distinct


def run_label(run: str) -> str:
    """elementwise__full -> "elementwise / full"; gather's reference row "untrained" as it is."""
    return run if run == "untrained" else " / ".join(parse_run(run))


def model_label(model: str) -> str:
    """melt-elementwise__full-seed0 -> "elementwise / full, seed 0"; other ids as they are."""
    m = ModelId.parse(model)
    if m.kind != "trained":
        return model
    seed = f", seed {m.seed}" if m.seed is not None else ""
    return run_label(m.run) + seed + (f" @{m.variant}" if m.variant else "")


def figure1_pareto(r: Results, ax):
    """Each point its own marker and legend entry (no text labels to overprint); the paper's points
    only when our stand-in is the paper's own benchmark (one quantity on the y-axis)."""
    kv = r.memory.set_index("shape")["kv_mb_per_token_measured"]
    points = [("Ouro (per-loop cache)", "ouro", kv.get("ouro-1.4b")), ("MELT (main run)", r.main_model,
                                                                         kv.get("melt-1.6b"))]
    points += [(f"Ouro, {v} sharing (untrained)", r.sharing_model(v), kv.get("melt-1.6b"))
               for v in r.config["baselines"]["sharing"]]
    markers = "osD^v<>p"
    for i, (label, model, mem) in enumerate(points):
        est = r.estimate(model, "MATH-500")
        if est is not None and mem is not None:
            ax.errorbar(mem, est.mean, yerr=[[est.mean - est.lo], [est.hi - est.mean]], fmt=markers[i % len(markers)],
                        markersize=7, capsize=3, color=STYLES[i][0], label=label, alpha=0.8, zorder=3)
    stand_in = r.columns.get("MATH-500", "")
    if stand_in.startswith("math500/"):
        kv_paper, acc_paper = r.paper["table2_memory"], r.paper["table1_main"].get("MATH-500", {})
        for j, (shape, model, name) in enumerate((("ouro-1.4b", "ouro", "Ouro"), ("melt-1.6b", "melt", "MELT"),
                                                  ("qwen3-1.7b-shape", "qwen3", "Qwen3-1.7B"))):
            x, y = kv_paper.get(shape, {}).get("kv_mb_per_token"), acc_paper.get(model)
            if x is not None and y is not None:
                ax.scatter(x, y, marker="x", s=70, color=STYLES[len(points) + j][0], label=f"{name}, paper {r.version}")
        title = "Accuracy vs KV memory (Figure 1): ours and the paper's"
    else:
        title = f"Accuracy vs KV memory (Figure 1); ours on the stand-in {stand_in} (paper points omitted)"
    ax.set_xlabel("KV cache MB per token (bf16, real 1.4B/1.6B shapes)")
    ax.set_ylabel(f"accuracy % ({stand_in or 'MATH-500'}), 95% interval")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))


def training_curves(r: Results, ax):
    """KD (solid) and alignment (dashed) per run on one log axis, a colour per run: the mean over
    training seeds, shaded between the seeds' lowest and highest; the main run's phase boundaries
    as vertical lines, integer steps."""
    from matplotlib.ticker import MaxNLocator

    for i, (run, df) in enumerate(r.curves.groupby("run")):
        colour = STYLES[i % 10][0]
        kd = df.assign(kd=df["kd"].clip(lower=1e-12)).groupby("step")["kd"]
        seeds = df["seed"].nunique()
        ax.plot(kd.mean().index, kd.mean(), color=colour, lw=1.2,
                label=f"{run_label(run)}: KD" + (f" ({seeds} seeds)" if seeds > 1 else ""))
        if seeds > 1:
            ax.fill_between(kd.min().index, kd.min(), kd.max(), color=colour, alpha=0.15, lw=0)
        if (df["align"] > 0).any():
            align = df.groupby("step")["align"].mean()
            ax.plot(align.index, align.where(align > 0), color=colour, lw=1, ls="--",
                    label=f"{run_label(run)}: alignment")
    main = r.curves[r.curves["run"] == ModelId.parse(r.main_model).run]
    main = main[main["seed"] == main["seed"].min()]
    for step in main["step"][main["phase"] != main["phase"].shift()].iloc[1:]:
        ax.axvline(step - 0.5, color="gray", lw=0.8, ls=":")
    ax.set_yscale("log")
    # the first steps at alpha ~ 0 distil the teacher into itself (KD ~ 1e-10): keep them from
    # stretching the axis over decades where nothing else lies
    kd = r.curves["kd"][r.curves["kd"] > 0]
    if len(kd):
        ax.set_ylim(bottom=float(kd.quantile(0.02)) / 2)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("step (dotted: phase boundaries of the main run)")
    ax.set_ylabel("loss term")
    ax.set_title("Training curves: KD (solid) and alignment (dashed); mean over seeds, band: min-max", fontsize=10)
    ax.legend(fontsize=6, loc="center left", bbox_to_anchor=(1.01, 0.5))


def gate_values(r: Results, ax):
    """Learned gates only (EMA's z is a constant, not learned): a colour per run, a line style per
    layer, integer loops."""
    from matplotlib.ticker import MaxNLocator

    learned = r.gates[r.gates.gate.isin(LEARNED_GATES)]
    if learned.empty:
        ax.text(0.5, 0.5, "no learned gate in this run", ha="center")
        return
    runs = list(dict.fromkeys(learned.run))
    styles = ("-", "--", ":", "-.")
    for (run, layer), df in learned.groupby(["run", "layer"]):  # the mean over training seeds
        z = df.groupby("loop")["mean_z"].mean()
        ax.plot(z.index, z, marker="o", lw=1, color=STYLES[runs.index(run) % 10][0],
                ls=styles[int(layer) % len(styles)], label=f"{run_label(run)}, layer {layer}")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("loop t")
    ax.set_ylabel("mean z (share of h_prev kept)")
    ax.set_ylim(0, 1)
    ax.set_title("Learned gate values per layer and loop (mean over training seeds)", fontsize=10)
    ax.legend(fontsize=6, loc="center left", bbox_to_anchor=(1.01, 0.5))


def ablation_accuracy(r: Results, ax):
    """Tables 3 and 4 as bars: each gate (after the gate recipe) and each recipe (element-wise gate),
    the mean over training seeds with its 95% interval, beside the teacher and the untrained model."""
    col = "MATH-500"
    gate, recipe = r.config["main_run"]["gate"], r.config["ablations"]["gate_recipe"]
    bars = [("Ouro (teacher)", "ouro", "black"), ("untrained", r.untrained, "gray")]
    bars += [(f"gate: {g}", r.run_model(g, recipe), STYLES[0][0]) for g in r.config["ablations"]["gates"]]
    bars += [(f"recipe: {x}", r.run_model(gate, x), STYLES[1][0]) for x in r.config["ablations"]["recipes"]]
    shown = [(label, r.estimate(model, col), colour) for label, model, colour in bars]
    shown = [b for b in shown if b[1] is not None]
    for i, (_, est, colour) in enumerate(shown):
        ax.bar(i, est.mean, color=colour, alpha=0.75)
        ax.errorbar(i, est.mean, yerr=[[est.mean - est.lo], [est.hi - est.mean]], color="black", capsize=3, lw=1)
        ax.text(i, est.hi + 1, f"{est.mean:.1f}", ha="center", fontsize=7)
    ax.set_xticks(range(len(shown)), [b[0] for b in shown], rotation=35, ha="right", fontsize=7)
    ax.set_ylabel(f"accuracy % ({r.columns.get(col, col)})")
    ax.set_ylim(0, 105)
    ax.set_title(f"Gate (Table 3, recipe {recipe}) and recipe (Table 4, {gate} gate) ablations\nmean over "
                 f"{len(r.seeds)} training seed(s), 95% interval over seeds and questions", fontsize=9)


def memory_sweeps(r: Results, ax):
    loops = r.sweeps["loops"]
    for model in ("ouro", "melt"):
        pts = [(p["T"], p["kv_mb_per_token"]) for p in loops if p["model"] == model]
        ax.plot(*zip(*pts), marker="o", label=f"{model}: vs loops T (W=0)")
    wins = r.sweeps["windows"]
    ax.plot([4] * len(wins), [w["kv_mb_per_token"] for w in wins], "s", label="melt T=4, W = " +
            ", ".join(str(w["W"]) for w in wins) + f" at {r.sweeps['context']} tokens")
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("loops T")
    ax.set_ylabel("measured KV MB per token (1.6B shape, bf16)")
    ax.set_title("MELT's cache is flat in T; Ouro's grows linearly")
    ax.legend(fontsize=7)


def early_exit_tradeoff(r: Results, ax):
    """Accuracy against loops per decoded token under each exit rule, one series per model and exit
    gate (circles: Q-exit thresholds and every loop; squares: a fixed exit loop), 95% intervals."""
    df = r.early_exit
    for i, ((model, variant), g) in enumerate(df.groupby(["model", "variant"], sort=True)):
        color, ls = STYLES[i]
        g = g.sort_values("mean_loops")
        ax.plot(g.mean_loops, g.accuracy, color=color, linestyle=ls, linewidth=1,
                label=f"{model_label(model)} ({variant})")
        for fixed, marker in ((False, "o"), (True, "s")):
            pts = g[g.rule.str.startswith("exit at loop") == fixed]
            ax.errorbar(pts.mean_loops, pts.accuracy, yerr=[pts.accuracy - pts.ci_lo, pts.ci_hi - pts.accuracy],
                        fmt=marker, color=color, markersize=5, capsize=2, linewidth=0.8)
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("mean loops per decoded token (circles: Q-exit / all loops; squares: fixed exit loop)")
    ax.set_ylabel(f"accuracy, % ({df.metric.iloc[0] if len(df) else ''})")
    ax.set_title("Real early exit: accuracy against loop compute (95% intervals over questions)", fontsize=10)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))


def accuracy_vs_length(r: Results, ax):
    """Where each model loses the thread on the long-answer task (report.long_column): the share of
    questions whose completion matches the reference up to each length, mean over seeds with its
    95% interval (shaded), for the teacher, its untrained sharing baselines, the main MELT run and
    the main run's inference variants (window, prefill)."""
    from verdicts import interval

    col = r.long_column
    longest = r.answer_length(col)
    step = max(1, longest // 24)
    lengths = sorted({*range(step, longest + 1, step), longest})
    models = ["ouro", *r.sharing_models(), r.main_model, *r.main_variants(), r.untrained]
    labels = {"ouro": "Ouro teacher (per-loop cache)", r.main_model: "MELT (main run)",
              r.untrained: "MELT, converted, untrained"}
    for i, model in enumerate(models):
        points = [(n, r.prefix_match(model, col, n)) for n in lengths]
        points = [(n, interval(scores)) for n, scores in points if scores is not None]
        if not points:
            continue
        color, ls = STYLES[i]
        xs, (mean, lo, hi) = [n for n, _ in points], zip(*(iv for _, iv in points))
        m = ModelId.parse(model)
        label = labels.get(model) or (f"Ouro, untrained {m.name} sharing" if m.kind == "sharing"
                                      else f"MELT (main run), {m.variant}")
        ax.plot(xs, mean, color=color, linestyle=ls, linewidth=1.4, label=label)
        ax.fill_between(xs, lo, hi, color=color, alpha=0.12, linewidth=0)
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("answer length so far (characters of the reference; one token each on the embedded task)")
    ax.set_ylabel(f"% of questions correct up to that length ({r.columns[col].split('/')[0]})")
    ax.set_ylim(-3, 103)
    ax.set_title("Accuracy as the answer grows: where each cache policy loses the thread (95% intervals)",
                 fontsize=10)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))


with rule_context(sm, "report"):
    results = Results(sm.params.settings, sm.input.paper)
    fig, ax = plt.subplots(figsize=(9, 4.5))
    globals()[sm.wildcards.figure](results, ax)
    fig.tight_layout()
    fig.savefig(sm.output.png, dpi=120)
    fig.savefig(sm.output.pdf)  # vector, for the paper-style copy
