"""Rule table: render one paper table as Markdown, LaTeX (booktabs) and CSV, with the paper's
reported value beside ours and the difference."""

import json
import math
import re
import sys

import pandas as pd

sys.path.insert(0, snakemake.scriptdir)
from common import rule_context
from model_id import ModelId
from report_common import Estimate, Results, diff, expand_estimates

sm = snakemake


def table1_main(r: Results) -> tuple[pd.DataFrame, str]:
    rows = []
    dense = r.config["report"]["dense_column"]
    v = r.version
    for bench in dict.fromkeys([*r.paper["table1_main"], *r.columns]):
        paper = r.paper["table1_main"].get(bench, {})
        ours = {"Ouro": r.estimate("ouro", bench), "MELT": r.estimate(r.main_model, bench),
                "Qwen3-1.7B": r.estimate(f"dense-{dense}", bench) if dense else None}
        row = {"benchmark": bench, "ours stands in": r.columns.get(bench, "not measured")}
        for label, key in (("Ouro", "ouro"), ("MELT", "melt"), ("Qwen3-1.7B", "qwen3")):
            row |= {f"{label} paper {v}": paper.get(key), f"{label} ours": ours[label],
                    f"{label} diff": None if r.stand_in(bench) else diff(ours[label], paper.get(key))}
        rows.append(row)
    return pd.DataFrame(rows), f"Table 1: main results (percent; paper {v}). {SEEDS_NOTE(r)} {r.note}"


def table2_memory(r: Results) -> tuple[pd.DataFrame, str]:
    rows = []
    for _, m in r.memory.iterrows():
        paper = r.paper["table2_memory"].get(m["shape"], {})
        rows.append({"model": m["shape"], "weights GB ours": m["weights_bytes_measured"] / 1e9,
                     "weights GB paper": paper.get("weights_gb"),
                     "KV MB/token ours (measured)": m["kv_mb_per_token_measured"],
                     "KV MB/token analytic": m["kv_mb_per_token_analytic"],
                     f"KV MB/token paper {r.version}": paper.get("kv_mb_per_token"),
                     "KV MB/token diff": diff(m["kv_mb_per_token_measured"], paper.get("kv_mb_per_token")),
                     f"total GB at {m['context']} (analytic)": m["total_gb_analytic"],
                     "peak GB paper": paper.get("peak_gb"), "peak GB ours": m["peak_gb"], "peak kind": m["peak_kind"],
                     "max batch ours": m["max_batch"], "max batch paper": paper.get("max_batch"),
                     "max batch kind": m["max_batch_kind"]})
    return pd.DataFrame(rows), ("Table 2/3: memory at the real shapes with random weights (bf16). "
                                "KV bytes are read off the cache tensors; see 'kind' columns for what is measured.")


def bench_columns(r: Results, model: str, paper: dict, benches) -> dict:
    """paper / ours / difference for each benchmark column; where our number is a stand-in (another
    task), the header names it and there is no difference (it would subtract unlike things)."""
    out = {}
    for bench in benches:
        ours, stand_in = r.estimate(model, bench), r.stand_in(bench)
        if stand_in:
            out |= {f"{bench} paper {r.version}": paper.get(bench), f"{bench} ours ({stand_in})": ours}
        else:
            out |= {f"{bench} paper {r.version}": paper.get(bench), f"{bench} ours": ours,
                    f"{bench} diff": diff(ours, paper.get(bench))}
    return out


def table3_gates(r: Results) -> tuple[pd.DataFrame, str]:
    rows = []
    recipe = r.config["ablations"]["gate_recipe"]
    for gate in r.config["ablations"]["gates"]:
        paper = r.paper["table3_gates"].get(gate, {})
        benches = ("AIME24", "AIME25", "MATH-500")
        rows.append({"gate": gate, **bench_columns(r, r.run_model(gate, recipe), paper, benches),
                     f"average paper {r.version}": paper.get("average")})
    return pd.DataFrame(rows), (f"Table 3: gate variants after the `{recipe}` recipe (percent; paper "
                                f"{r.version}). {SEEDS_NOTE(r)} {r.note}")


def table4_recipe(r: Results) -> tuple[pd.DataFrame, str]:
    rows = []
    gate = r.config["main_run"]["gate"]
    for recipe in r.config["ablations"]["recipes"]:
        paper = r.paper["table4_recipe"].get(recipe, {})
        rows.append({"recipe (cumulative removal)": recipe,
                     **bench_columns(r, r.run_model(gate, recipe), paper, ("AIME24", "MATH-500"))})
    rows.append({"recipe (cumulative removal)": "untrained (conversion only)",
                 **bench_columns(r, r.untrained, r.paper["table4_recipe"].get("untrained", {}),
                                 ("AIME24", "MATH-500"))})
    return pd.DataFrame(rows), (f"Table 4: training-recipe ablation, {gate} gate (percent; paper {r.version}). "
                                f"{SEEDS_NOTE(r)} {r.note}")


def table5_sharing(r: Results) -> tuple[pd.DataFrame, str]:
    """The sharing baselines, and (report.long_column) every cache policy on long answers: there the
    main MELT run and its window variants are rows too, since that is where the policies differ."""
    long = r.long_column
    extra = lambda model: {f"{long} ours ({r.columns[long]})": r.estimate(model, long)} if long else {}  # noqa: E731
    rows = [{"variant": "ouro (full per-loop cache)", "MATH-500 ours": r.estimate("ouro", "MATH-500"),
             "AIME24 ours": r.estimate("ouro", "AIME24"), **extra("ouro")}]
    for variant, paper in r.paper["table5_sharing"].items():
        ours = r.estimate(r.sharing_model(variant), "MATH-500")
        rows.append({"variant": variant, f"paper {r.version} (all math)": paper, "MATH-500 ours": ours,
                     "MATH-500 diff": None if r.stand_in("MATH-500") else diff(ours, paper),
                     "AIME24 ours": r.estimate(r.sharing_model(variant), "AIME24"),
                     **extra(r.sharing_model(variant))})
    if long:
        for model in [r.main_model, *r.main_variants()]:
            how = ModelId.parse(model).variant
            rows.append({"variant": f"MELT main run{' ' + how if how else ''}",
                         "MATH-500 ours": r.estimate(model, "MATH-500"), "AIME24 ours": r.estimate(model, "AIME24"),
                         **extra(model)})
    df = pd.DataFrame(rows)
    first = ["variant", f"paper {r.version} (all math)", "MATH-500 ours", "MATH-500 diff"]
    df = df[[c for c in first if c in df.columns] + [c for c in df.columns if c not in first]]
    caption = ("Table 5: untrained KV sharing on plain Ouro weights (percent, with 95% intervals over questions"
               + (", and over seeds for MELT" if long else "") + f"). {r.note}")
    if long:
        caption += (f" {long}: the long-answer task, where generated tokens read generated tokens far back; "
                    "see figure accuracy_vs_length for where each policy fails.")
    return df, caption


def table10_speed(r: Results) -> tuple[pd.DataFrame, str]:
    def row(model, shape, context, decode, prefill, ttft):
        paper = r.paper["table10_speed"].get(model, {})
        return {"model": model, "shape": shape, "context": int(context),
                "decode tok/s ours": decode, "decode tok/s paper": paper.get("decode_tok_s"),
                "prefill tok/s ours": prefill, "prefill tok/s paper": paper.get("prefill_tok_s"),
                "TTFT s ours": ttft, "TTFT s paper": paper.get("ttft_s")}

    rows = [row(s["model"], s["shape"], s["context"], s["decode_tok_s"], s["prefill_tok_s"], s["ttft_s"])
            for _, s in r.speed.iterrows()]
    role = {"ouro-1.4b": "ouro", "melt-1.6b": "melt", "qwen3-1.7b-shape": "dense-gqa", "ouro-2.6b": "ouro",
            "melt-3.1b": "melt"}
    if "speed_decode_tok_s" in r.memory:  # the real shapes, measured at a short context
        rows += [row(role.get(m["shape"], m["shape"]), m["shape"], m["speed_context"], m["speed_decode_tok_s"],
                     m["speed_prefill_tok_s"], m["speed_ttft_s"])
                 for _, m in r.memory.dropna(subset=["speed_decode_tok_s"]).iterrows()]
    df = pd.DataFrame(rows)
    # each row against Ouro of the same size class and context
    same_class = {"melt-1.6b": "ouro-1.4b", "qwen3-1.7b-shape": "ouro-1.4b", "melt-3.1b": "ouro-2.6b"}
    ouro_of = {shape: same_class.get(shape, shape) for shape in df["shape"]}
    ouro = df[df.model == "ouro"].set_index(["shape", "context"])["decode tok/s ours"]
    df["decode ratio to Ouro (ours)"] = [v / ouro.get((ouro_of[s], c), float("nan"))
                                         for v, s, c in zip(df["decode tok/s ours"], df["shape"], df.context)]
    paper = r.paper["table10_speed"]
    base = paper.get("ouro", {}).get("decode_tok_s")
    df["decode ratio to Ouro (paper)"] = [paper[m]["decode_tok_s"] / base if base and m in paper else None
                                          for m in df.model]
    return df, ("Table 10 (the paper's v3 only): batch-1 speed. Ours: on this machine's CPU, the "
                f"{r.config['speed_shape']} shape and the real shapes at a short context; the paper: "
                "H100 at the real shape. Compare the ratios, not the absolute rates.")


def table11_train_throughput(r: Results) -> tuple[pd.DataFrame, str]:
    df = r.train_throughput.copy()
    if "ratio_rounds" in df:  # each round's ratio (the models timed in turn), shown as its range
        rounds = [json.loads(v) if isinstance(v, str) else v for v in df.pop("ratio_rounds")]
        df["ratio range over rounds"] = [f"{min(x):.2f}–{max(x):.2f}" for x in rounds]
    paper = r.paper["table11_train_throughput"]
    # the paper measured one chunk size (C = 500): its row stands alone, not repeated beside each of ours
    df["paper tok/s"] = [paper.get("ouro-parallel") if m == "ouro-parallel" else None for m in df.model]
    if paper.get("melt-chunked") and paper.get("ouro-parallel"):
        df = pd.concat([df, pd.DataFrame([{"model": "melt-C500 (paper)", "chunk": 500,
                                           "paper tok/s": paper["melt-chunked"]}])], ignore_index=True)
    base = paper.get("ouro-parallel")
    df["paper ratio"] = [None if t is None or pd.isna(t) or not base else t / base for t in df["paper tok/s"]]
    return df, ("Table 11 (the paper's v3 only): training tokens/s, chunk-wise MELT (chunk C) vs parallel Ouro "
                "distillation, same shape, "
                "sequence and batch, measured side by side.")


def table_early_exit(r: Results) -> tuple[pd.DataFrame, str]:
    df = r.early_exit
    out = pd.DataFrame({"model": df.model, "exit gate": df.variant, "rule": df.rule,
                        "seeds": [len(s) for s in df.seeds] if len(df) else [],
                        "accuracy": df.accuracy, "95% CI": [f"{a:.1f}–{b:.1f}" for a, b in zip(df.ci_lo, df.ci_hi)],
                        "loops per token": df.mean_loops, "loop share %": 100 * df.loop_fraction,
                        "tok/s": df.tokens_per_s, "speed ratio to all loops": df.speedup})
    where = f"{df.device.iloc[0]}, batch {int(df.batch_size.iloc[0])}" if len(df) else ""
    return out, ("Real early exit (beyond the paper, its future work): accuracy on the sweep task "
                 f"({df.metric.iloc[0] if len(df) else ''}; the mean over the seeds' models with a 95% interval "
                 "over seeds and questions), loops per decoded token and measured decode speed "
                 f"({where}; the seeds' means) per exit rule. The prompt runs every loop; Ouro's stopped tokens "
                 "leave their last loop's K/V to deeper loops, MELT's their memory row.")


def SEEDS_NOTE(r: Results) -> str:  # noqa: N802 (reads as the constant sentence it is)
    n = len(r.seeds)
    per_seed = r.config.get("per_seed_teacher")
    return ("Ours: the mean over training seeds " + ", ".join(map(str, r.seeds)) + " with a 95% interval "
            "[low, high] over seeds and questions (a trained run's cell a mixture of its seeds that escaped their "
            "plateau and those that did not, the rate exact; otherwise Student's t, Satterthwaite; "
            + ("each seed with its own teacher, so the seeds are reruns of everything trained)." if per_seed else
               "one teacher for every seed: its own variation is not covered, and the teacher and sharing "
               "baselines' intervals are over questions only).") if n > 1 else
            f"Ours: one training seed ({r.seeds[0]}), with a 95% interval [low, high] over questions only.")


def decimals(column: str) -> int:
    """One format per column, by what it holds (percent unless the header says otherwise)."""
    for key, n in (("MB/token", 6), ("ratio", 2), ("tok/s", 1), ("GB", 2), (" s ", 3), ("TTFT", 3), ("per token", 2),
                   ("batch", 0), ("context", 0), ("tokens", 0)):
        if key in column:
            return n
    return 1


def fmt(v, column: str = ""):
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "–"
    if isinstance(v, Estimate):
        return format(v, f".{decimals(column)}f")
    if isinstance(v, float):
        return f"{v:.{decimals(column)}f}"
    return str(v)


def to_markdown(df: pd.DataFrame, caption: str) -> str:
    head = "| " + " | ".join(df.columns) + " |"
    sep = "|" + "|".join("---" for _ in df.columns) + "|"
    body = ["| " + " | ".join(fmt(v, c) for v, c in zip(row, df.columns)) + " |" for row in df.itertuples(index=False)]
    return f"{caption}\n\n" + "\n".join([head, sep, *body]) + "\n"


def tex_escape(s: str) -> str:
    for a, b in (("\\", r"\textbackslash{}"), ("&", r"\&"), ("%", r"\%"), ("_", r"\_"), ("#", r"\#"),
                 ("–", "--")):
        s = s.replace(a, b)
    return s


def to_latex(df: pd.DataFrame, caption: str) -> str:
    cols = "l" + "r" * (len(df.columns) - 1)
    caption = re.sub(r"^Tables? [\d/]+(?: \([^)]*\))?: ", "", caption)  # LaTeX numbers the table itself
    lines = [r"\begin{table}[t]", r"\centering", rf"\caption{{{tex_escape(caption)}}}", rf"\begin{{tabular}}{{{cols}}}",
             r"\toprule", " & ".join(tex_escape(str(c)) for c in df.columns) + r" \\", r"\midrule"]
    lines += [" & ".join(tex_escape(fmt(v, c)) for v, c in zip(row, df.columns)) + r" \\"
              for row in df.itertuples(index=False)]
    lines += [r"\bottomrule", r"\end{tabular}", r"\end{table}"]
    return "\n".join(lines) + "\n"


with rule_context(sm, "report"):
    results = Results(sm.params.settings, sm.input.paper)
    frame, caption = globals()[sm.wildcards.table](results)
    expand_estimates(frame).to_csv(sm.output.csv, index=False)
    with open(sm.output.md, "w") as fh:
        fh.write(to_markdown(frame, caption))
    with open(sm.output.tex, "w") as fh:
        fh.write(to_latex(frame, caption))
    print(to_markdown(frame, caption))
