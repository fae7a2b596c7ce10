"""Protects the figures against the defects a reviewer rejects, where a program can see them:
series that share colour and line style, labels that overprint, a paper point on an axis that
holds another quantity, fractional ticks for counts, a constant drawn as a learned gate."""

import json
import sys
import types
from pathlib import Path

import matplotlib
import pandas as pd
import pytest

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "workflow" / "scripts"))
from report_common import Results  # noqa: E402


def script_functions(name: str) -> types.ModuleType:
    """A rule script's functions (workflow/scripts/<name>.py), without its rule body."""
    src = (ROOT / f"workflow/scripts/{name}.py").read_text().split("with rule_context(sm")[0]
    mod = types.ModuleType(name)
    mod.snakemake = types.SimpleNamespace(scriptdir=str(ROOT / "workflow/scripts"))
    exec(compile(src, f"{name}.py", "exec"), mod.__dict__)  # noqa: S102 - our own module
    return mod


@pytest.fixture(scope="module")
def figures():
    return script_functions("render_figures")


def results(stand_in="digit_sum/pass@1"):
    from report_common import Estimate

    runs = ["elementwise__full", "scalar__full", "mean__full", "ema__full", "last__full", "elementwise__no_align"]
    curves = pd.DataFrame([{"run": r, "seed": seed, "step": s, "kd": 0.1 / s + seed, "align": 0.01 if s > 3 else 0.0,
                            "phase": "phase1" if s <= 3 else "phase2"}
                           for r in runs for seed in (0, 1) for s in range(1, 6)])
    # as gather writes them: each run's gate, and the converted model as the reference run "untrained"
    gates = pd.DataFrame([{"run": r, "seed": seed, "gate": r.split("__")[0] if r != "untrained" else "elementwise",
                           "layer": layer, "loop": t, "mean_z": 0.5}
                          for r in [*runs, "untrained"] for seed in (0, 1) for layer in range(2) for t in range(1, 5)])
    scores = {"ouro": 90.0, "melt-elementwise__full": 85.0}
    return types.SimpleNamespace(
        memory=pd.DataFrame({"shape": ["ouro-1.4b", "melt-1.6b"], "kv_mb_per_token_measured": [0.786, 0.197]}),
        score=lambda model, col: scores.get(model, 0.0), columns={"MATH-500": stand_in},
        estimate=lambda model, col: Estimate(scores.get(model, 0.0), scores.get(model, 0.0) - 4,
                                             min(100.0, scores.get(model, 0.0) + 4)),
        run_model=Results.run_model, sharing_model=Results.sharing_model, untrained=Results.untrained, seeds=[0, 1],
        config={"baselines": {"sharing": ["first-loop", "first-loop+prompt", "last-loop", "last-loop+prompt"]},
                "main_run": {"gate": "elementwise", "recipe": "full"},
                "ablations": {"gates": ["elementwise", "scalar", "mean", "ema", "last"], "gate_recipe": "full",
                              "recipes": ["full", "no_align"]}},
        paper={"table2_memory": {"ouro-1.4b": {"kv_mb_per_token": 0.786}, "melt-1.6b": {"kv_mb_per_token": 0.197},
                                 "qwen3-1.7b-shape": {"kv_mb_per_token": 0.115}},
               "table1_main": {"MATH-500": {"ouro": 94.4, "melt": 93.4, "qwen3": 90.6}}},
        version="v2", main_model="melt-elementwise__full", curves=curves, gates=gates)


def draw(figures, name, r):
    fig, ax = plt.subplots()
    getattr(figures, name)(r, ax)
    return fig, ax


def distinct_styles(ax):
    styles = [(line.get_color(), line.get_linestyle()) for line in ax.get_lines()
              if not line.get_label().startswith("_")]
    return len(styles) == len(set(styles))


def test_pareto_has_no_overprinting_labels_and_one_quantity_per_axis(figures):
    fig, ax = draw(figures, "figure1_pareto", results())
    assert not ax.texts  # a legend entry per point, no annotations that stack at one x
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert len(labels) == len(set(labels)) == 6 and not any("paper" in t for t in labels)  # stand-in: no paper points
    markers = [(line.get_color(), line.get_marker()) for line in ax.get_lines()
               if line.get_marker() not in ("None", "", "_")]
    assert len(markers) == len(set(markers)) == 6  # each point its own colour and marker, with an error bar
    assert len([c for c in ax.collections if c.get_segments()]) >= 6
    plt.close(fig)
    fig, ax = draw(figures, "figure1_pareto", results("math500/pass@1"))
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert {"Ouro, paper v2", "MELT, paper v2", "Qwen3-1.7B, paper v2"} <= set(labels)  # labelled paper points
    plt.close(fig)


def test_training_curves_distinct_series_integer_steps_and_phase_boundaries(figures):
    fig, ax = draw(figures, "training_curves", results())
    assert distinct_styles(ax)
    assert isinstance(ax.xaxis.get_major_locator(), MaxNLocator)
    assert ax.xaxis.get_major_locator()._integer
    boundaries = [line for line in ax.get_lines() if line.get_label().startswith("_") and line.get_xdata()[0] == 3.5]
    assert boundaries  # the main run's Phase 1 -> Phase 2 boundary
    assert any("alignment" in t.get_text() for t in ax.get_legend().get_texts())  # loss terms, not only the total
    assert any("(2 seeds)" in t.get_text() for t in ax.get_legend().get_texts())
    assert len(ax.collections) == 6  # a band between the seeds per run
    kd = next(line for line in ax.get_lines() if line.get_label() == "elementwise / full: KD (2 seeds)")
    assert kd.get_ydata()[0] == pytest.approx(0.1 + 0.5)  # the mean over the seeds
    plt.close(fig)


def test_ablation_bars_carry_intervals(figures):
    fig, ax = draw(figures, "ablation_accuracy", results())
    assert len(ax.patches) == 2 + 5 + 2  # teacher, untrained, five gates, two recipes
    caps = [line for line in ax.get_lines() if line.get_marker() == "_"]
    assert caps  # error bars with caps
    labels = [t.get_text() for t in ax.get_xticklabels()]
    assert labels[0].startswith("Ouro") and "gate: scalar" in labels and "recipe: no_align" in labels
    plt.close(fig)


def test_gate_values_learned_gates_only_in_distinct_styles(figures):
    fig, ax = draw(figures, "gate_values", results())
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert not any(label.startswith(("ema", "mean", "last")) for label in labels)  # constants are not learned gates
    assert len(labels) == 4 * 2 and distinct_styles(ax)  # elementwise x2 runs, scalar, untrained: 4 x 2 layers
    assert "untrained, layer 0" in labels
    assert ax.xaxis.get_major_locator()._integer
    plt.close(fig)


@pytest.fixture(scope="module")
def tables():
    return script_functions("render_tables")


def test_tables_name_stand_ins_and_format_by_column(tables):
    from report_common import Results

    r = object.__new__(Results)
    r.columns, r.version = {"MATH-500": "digit_sum/pass@1", "AIME24": "aime24/pass@1"}, "v2"
    from report_common import Estimate, expand_estimates

    r.estimate = lambda model, bench: Estimate(12.5, 8.25, 16.75)
    assert r.stand_in("MATH-500") == "digit_sum/pass@1" and r.stand_in("AIME24") is None
    cols = tables.bench_columns(r, "m", {"MATH-500": 93.4, "AIME24": 46.7}, ("MATH-500", "AIME24"))
    assert "MATH-500 diff" not in cols  # no unlike subtraction
    assert cols["MATH-500 ours (digit_sum/pass@1)"].mean == 12.5
    assert cols["AIME24 diff"] == pytest.approx(12.5 - 46.7)
    df = pd.DataFrame([{"model": "a", "KV MB/token ours": 0.196608, "acc ours": Estimate(27.272443, 20.0, 35.04),
                        "decode tok/s": 1.166}])
    assert tables.to_markdown(df, "Table 2: x").splitlines()[-1] == "| a | 0.196608 | 27.3 [20.0, 35.0] | 1.2 |"
    flat = expand_estimates(df)  # the CSV: numbers in columns of their own
    assert list(flat.columns) == ["model", "KV MB/token ours", "acc ours", "acc ours CI low", "acc ours CI high",
                                  "decode tok/s"]
    assert flat.iloc[0]["acc ours CI high"] == pytest.approx(35.04)
    latex = tables.to_latex(df, "Table 2/3 (v3 only): memory")
    assert r"\caption{memory}" in latex  # LaTeX numbers the table itself


def early_exit_frame(melt_cheap: list[float], full: float = 90.0, n: int = 40):
    """Sweep rows as gather writes them: MELT and Ouro, every loop plus two cheaper rules."""
    rows = []
    for model, cheap in (("melt-elementwise__full", melt_cheap), ("ouro", [full, full])):
        for rule, frac, acc in (("all loops", 1.0, full), ("q=0.6", 0.6, cheap[0]), ("exit at loop 2", 0.5, cheap[1])):
            per_q = [100.0] * round(n * acc / 100) + [0.0] * (n - round(n * acc / 100))
            rows.append({"model": model, "variant": "converted gate", "rule": rule, "accuracy": acc,
                         "ci_lo": acc - 5, "ci_hi": min(100, acc + 5), "mean_loops": 4 * frac, "loops": 4,
                         "loop_fraction": frac, "tokens_per_s": 10 / frac, "speedup": 1 / frac,
                         "per_question": json.dumps(per_q), "metric": "pass@1", "batch_size": 1, "device": "cpu"})
    return pd.DataFrame(rows)


def test_early_exit_figure_distinct_series_with_intervals(figures):
    fig, ax = draw(figures, "early_exit_tradeoff", types.SimpleNamespace(early_exit=early_exit_frame([88.0, 60.0])))
    assert distinct_styles(ax)
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert len(labels) == len(set(labels)) == 2
    assert len(ax.containers) == 4  # error bars: Q-exit and fixed-loop points of each series
    assert all(float(t).is_integer() for t in ax.get_xticks())
    plt.close(fig)


@pytest.mark.parametrize("melt_cheap, full, verdict", [
    ([90.0, 60.0], 90.0, "holds"),  # q=0.6 keeps every question at 60% of the loops
    ([40.0, 30.0], 90.0, "does not hold"),  # every cheap rule loses far more than the margin
    ([0.0, 0.0], 0.0, "not measurable"),  # a model that scores nothing at full depth judges nothing
])
def test_early_exit_claim_can_hold_fail_and_abstain(melt_cheap, full, verdict):
    claims = script_functions("claims")
    r = types.SimpleNamespace(early_exit=early_exit_frame(melt_cheap, full))
    (claim, evidence, got), = claims.early_exit_claims(r)
    assert got.startswith(verdict), (got, evidence)
    assert "melt-elementwise__full" in evidence and "ouro" in evidence


def long_answer_results(tmp_path, breaks: dict[str, list[int | None]]):
    """A Results over fabricated long-answer evals: ``breaks`` maps a model id to the character
    where each seed's completions first go wrong (None: never), 10 questions of 40 down to 31 characters."""
    from report_common import Results

    gold = "0123456789" * 4
    golds = [gold[:len(gold) - i] for i in range(10)]  # 40 down to 31 characters
    rows = []
    for model, per_seed in breaks.items():
        for seed, at in enumerate(per_seed):
            model_id = f"{model}-seed{seed}" if model.startswith("melt-") else model
            answers = [g if at is None else g[:at] + "x" * (len(g) - at) for g in golds]
            details = [{"prompt": f"q{i}", "gold": g, "completions": [a], "correct": [at is None],
                        "scores": {"pass@1": float(at is None)}} for i, (g, a) in enumerate(zip(golds, answers))]
            (tmp_path / "eval" / model_id).mkdir(parents=True, exist_ok=True)
            (tmp_path / "eval" / model_id / "chain_sum.json").write_text(json.dumps({"details": details}))
            rows.append({"model": model, "seed": seed, "model_id": model_id, "task": "chain_sum",
                         "metric": "pass@1", "value": 100.0 * (at is None)})
    r = object.__new__(Results)
    r.out, r.evals, r._read, r._scores = tmp_path, pd.DataFrame(rows), {}, {}
    r.columns, r.long_column = {"long answers": "chain_sum/pass@1"}, "long answers"
    r.main_model = "melt-elementwise__full"
    r.config = {"baselines": {"sharing": ["first-loop", "last-loop+prompt"]}}
    return r


def test_accuracy_vs_length_shows_where_each_model_loses_the_thread(figures, tmp_path):
    r = long_answer_results(tmp_path, {"ouro": [None], "ouro-first-loop": [3], "ouro-last-loop+prompt": [17],
                                       "melt-elementwise__full": [None, 25],
                                       "melt-elementwise__full@window-34": [30, 30]})
    # the share of questions right up to each length: 100 before a model's break, 0 after
    assert r.answer_length("long answers") == 40
    assert r.prefix_match("ouro-last-loop+prompt", "long answers", 17).mean() == 100
    assert r.prefix_match("ouro-last-loop+prompt", "long answers", 18).mean() == 0
    assert r.prefix_match("melt-elementwise__full", "long answers", 30).tolist() == [[100.0] * 10, [0.0] * 10]
    assert r.prefix_match("melt-untrained", "long answers", 5) is None  # not evaluated
    fig, ax = draw(figures, "accuracy_vs_length", r)
    assert distinct_styles(ax)
    curves = {line.get_label(): line.get_ydata() for line in ax.get_lines()}
    assert set(curves) == {"Ouro teacher (per-loop cache)", "Ouro, untrained first-loop sharing",
                           "Ouro, untrained last-loop+prompt sharing", "MELT (main run)", "MELT (main run), window-34"}
    xs = next(line.get_xdata() for line in ax.get_lines())
    assert list(xs) == list(range(1, 41))  # every length up to the longest answer
    assert list(curves["MELT (main run)"]) == [100.0] * 25 + [50.0] * 15  # one seed of two breaks at 25
    assert list(curves["Ouro, untrained first-loop sharing"]) == [100.0] * 3 + [0.0] * 37
    assert len(ax.collections) == 5  # each curve's 95% interval, shaded
    plt.close(fig)
