"""Protects claims.md's verdicts that are not plain accuracy comparisons
(workflow/scripts/claims.py), fed fabricated results: the "~10x slower" training claim against a
stated margin around the paper's 0.105x, and the early-exit claim corrected for the number of rules
the sweep tried (a rule that holds on its own 95% interval by luck of many tries must not)."""

import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from helpers import rate

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "workflow" / "scripts"))
import claims  # noqa: E402
from report_common import Results, escapes, pool_early_exit  # noqa: E402
from verdicts import FAILS, HOLDS, INCONCLUSIVE  # noqa: E402


@pytest.mark.parametrize("rounds,expected", [
    ([0.105] * 5, HOLDS), ([0.07, 0.09, 0.2, 0.1, 0.12], HOLDS), ([0.34, 0.3, 0.5, 0.25, 0.4], FAILS),
    ([0.03, 0.04, 0.02, 0.05, 0.03], FAILS), ([1.0] * 5, FAILS), ([0.14, 0.26, 0.18, 0.2, 0.22], INCONCLUSIVE),
    ([0.04, 0.06, 0.05, 0.07, 0.06], INCONCLUSIVE)])
def test_training_slowdown_is_judged_on_its_rounds_against_the_papers_ratio(rounds, expected):
    """profiler.train_throughput's rows (as gather writes them: the rounds as a JSON list); the
    slowest MELT run decides, every round inside the band holds, every round outside fails."""
    median = sorted(rounds)[2]
    tt = pd.DataFrame({"model": ["ouro-parallel", "melt-C16", "melt-C64"],
                       "ratio_to_ouro": [1.0, median, median + 0.3],
                       "ratio_rounds": [json.dumps([1.0] * 5), json.dumps(rounds),
                                        json.dumps([x + 0.3 for x in rounds])]})
    (_, evidence, verdict), = claims.train_speed_claim(tt)
    assert verdict.startswith(expected), verdict
    assert f"{median:.2f}x" in evidence
    assert f"melt-C16: 5 rounds in turn, {min(rounds):.2f}-{max(rounds):.2f}x" in evidence


def sweep(gap_questions: int, n_rules: int, n: int = 400, seed: int = 0) -> pd.DataFrame:
    """MELT's every-loop run (of training seed ``seed``) solves every question; each early-exit rule
    loses ``gap_questions``."""
    full, model = [100.0] * n, f"melt-elementwise__full-seed{seed}"
    rows = [{"model": model, "variant": "converted", "rule": "all loops", "loop_fraction": 1.0,
             "per_question": json.dumps(full), "accuracy": 100.0, "mean_loops": 4.0, "loops": 4, "speedup": 1.0,
             "tokens_per_s": 10.0}]
    for k in range(n_rules):
        scores = [0.0 if (i + 7 * k) % n < gap_questions else 100.0 for i in range(n)]
        rows.append({"model": model, "variant": "converted", "rule": f"q={k}",
                     "loop_fraction": 0.5, "per_question": json.dumps(scores), "accuracy": sum(scores) / n,
                     "mean_loops": 2.0, "loops": 4, "speedup": 1.8, "tokens_per_s": 18.0})
    return pd.DataFrame(rows)


class R:
    def __init__(self, df):
        self.early_exit = pool_early_exit(df)  # as report_common.Results reads the gathered sweep


def test_early_exit_holds_on_a_clear_margin_and_fails_on_a_clear_loss():
    (_, _, verdict), = claims.early_exit_claims(R(sweep(gap_questions=4, n_rules=3)))  # 1 pt of a 5 pt margin
    assert verdict == HOLDS
    (_, _, verdict), = claims.early_exit_claims(R(sweep(gap_questions=60, n_rules=3)))  # 15 pts lost
    assert verdict == FAILS


def test_early_exit_is_judged_over_every_seed_paired_seed_by_seed():
    """The sweep of each seed's main run, pooled: a rule that loses 1 point on seed 0 and 15 on seed
    1 does not hold over both (seed 0 alone it would); losing 1 point on each of six seeds holds; the
    pooled row pairs each seed's rule with that seed's every-loop row whatever the rows' order, and
    says how many seeds it is over."""
    mixed = pd.concat([sweep(4, 1, seed=1).assign(per_question=lambda d: [json.dumps(
        [0.0 if i < 60 else 100.0 for i in range(400)]) if r != "all loops" else p
        for r, p in zip(d.rule, d.per_question)]), sweep(4, 1, seed=0)])
    (_, _, alone), = claims.early_exit_claims(R(sweep(4, 1, seed=0)))
    (_, evidence, both), = claims.early_exit_claims(R(mixed))
    assert alone == HOLDS and both == INCONCLUSIVE and "2 seeds" in evidence
    six = pd.concat([sweep(4, 1, seed=s) for s in (5, 3, 1, 0, 2, 4)])
    (_, evidence, verdict), = claims.early_exit_claims(R(six))
    assert verdict == HOLDS and "6 seeds" in evidence
    pooled = pool_early_exit(six)
    assert len(pooled) == 2 and all(p == [0, 1, 2, 3, 4, 5] for p in pooled.seeds)
    assert np.asarray(json.loads(pooled.per_question.iloc[1])).shape == (6, 400)


def test_early_exit_is_corrected_for_the_rules_tried():
    """A gap whose 95% interval just clears the margin holds for one rule tried, not among twenty."""
    one = claims.early_exit_claims(R(sweep(gap_questions=12, n_rules=1)))[0]
    many = claims.early_exit_claims(R(sweep(gap_questions=12, n_rules=20)))[0]
    assert one[2] == HOLDS and "1 rules tried" in one[0]
    assert many[2] == INCONCLUSIVE and "20 rules tried" in many[0] and "99.75% interval" in many[0]


@pytest.mark.parametrize("melt_rounds,expected", [([8.0, 8.5, 9.0], HOLDS), ([14.0, 15.0, 16.0], FAILS),
                                                  ([12.0, 13.0, 14.5], INCONCLUSIVE)])
def test_decode_speed_is_judged_on_the_rounds_interleaved(melt_rounds, expected):
    """Ouro decodes 13.5 tok/s in every round: MELT always under it holds, always over it fails,
    rounds on both sides are not judged either way."""
    speed = pd.DataFrame({"model": ["ouro", "melt", "ouro"], "batch": [1, 1, 1], "context": [128, 128, 512],
                          "decode_tok_s_rounds": [json.dumps([13.5] * 3), json.dumps(melt_rounds), "[1.0]"]})
    memory = pd.DataFrame({"shape": ["ouro-1.4b"]})
    (_, evidence, verdict), = claims.decode_speed_claim(speed, memory, "cpu-mid")
    assert verdict.startswith(expected) and "3 rounds in turn" in evidence and "context 128" in evidence


# --------------------------------------------------------------------------- the accuracy claims
CONFIG = yaml.safe_load((Path(__file__).resolve().parents[1] / "config" / "default.yaml").read_text())


class World(Results):
    """Results of fabricated accuracies (percent, the same in every column and seed), read by
    claims.claims through the real Results' model naming; no timing or memory rows."""

    def __init__(self, accuracy: dict[str, float], escaped: dict | None = None):
        self.config = {**CONFIG, "speed_shape": "cpu-mid"}
        self.escape_kd, self.escaped = (1.2, escaped) if escaped is not None else (None, {})
        self.version, self.seeds = CONFIG["paper_version"], CONFIG["seeds"]
        self.columns, self.long_column = CONFIG["report"]["columns"], CONFIG["report"]["long_column"]
        self.main_model = self.run_model(CONFIG["main_run"]["gate"], CONFIG["main_run"]["recipe"])
        self.untrained = "melt-untrained"
        self.accuracy = accuracy
        self.memory, self.speed = pd.DataFrame({"shape": []}), pd.DataFrame({"model": [], "batch": [], "context": []})
        self.train_throughput, self.early_exit = pd.DataFrame({"model": [], "ratio_to_ouro": []}), pd.DataFrame()
        self.sweeps = {"loops": []}

    def per_question(self, model, paper_column):
        return np.asarray([rate(self.accuracy[model] / 100)] * len(self.seeds))

    def score(self, model, paper_column):
        return self.accuracy[model]

    def main_variants(self, kind=""):
        return [v for v in (f"{self.main_model}@prefill-chunk16", f"{self.main_model}@window-34") if kind in v]


def world(main, sharing, elementwise_gate, other_gates, recipe_chain, prefill, window, ouro=100.0):
    gates, recipe = CONFIG["ablations"]["gates"], CONFIG["ablations"]["gate_recipe"]
    acc = {"ouro": ouro, **{World.sharing_model(m): sharing for m in CONFIG["baselines"]["sharing"]},
           **{World.run_model(g, recipe): other_gates for g in gates}}
    acc.update({World.run_model("elementwise", r): a for r, a in zip(CONFIG["ablations"]["recipes"], recipe_chain)})
    acc[World.run_model("elementwise", recipe)] = elementwise_gate
    main_id = World.run_model(CONFIG["main_run"]["gate"], CONFIG["main_run"]["recipe"])
    acc.update({main_id: main, f"{main_id}@prefill-chunk16": prefill, f"{main_id}@window-34": window})
    return World(acc)


# every claim true by a wide margin
TRUE_WORLD = dict(main=99, sharing=10, elementwise_gate=75, other_gates=40, recipe_chain=[99, 85, 75, 60, 5],
                  prefill=98.5, window=98.5)
ACCURACY_CLAIMS = ("MELT stays near Ouro in accuracy", "MELT stays near Ouro on long answers",
                   "Untrained KV sharing loses", "The element-wise gate beats", "Each recipe component helps",
                   "Chunk-wise training is indispensable", "Ours, not the paper's: MELT prefilled",
                   "Ours, not the paper's: v3's sliding window")


def verdicts_of(r) -> dict[str, str]:
    found = {}
    for claim, _, verdict in claims.claims(r):
        for start in ACCURACY_CLAIMS:
            if claim.startswith(start):
                found[start] = verdict
    assert set(found) == set(ACCURACY_CLAIMS)
    return found


def test_accuracy_claims_hold_where_the_results_say_so_and_fail_where_they_say_the_opposite():
    """Each claim reads its models in the right order: in a world where every claim is true by a
    wide margin each holds, and in the mirror world each fails (a comparison read backwards, or
    against the wrong model, turns one of them around)."""
    assert verdicts_of(world(**TRUE_WORLD)) == dict.fromkeys(ACCURACY_CLAIMS, HOLDS)
    false = world(main=50, sharing=100, elementwise_gate=75, other_gates=95, recipe_chain=[50, 60, 75, 85, 95],
                  prefill=20, window=20, ouro=90)
    assert all(v.startswith(FAILS) for v in verdicts_of(false).values()), verdicts_of(false)


def test_two_seeds_of_two_valued_training_decide_only_what_shares_the_teachers_weights():
    """The true world again, now with every trained run's two seeds flagged as escaped: the sharing
    claim (the teacher against its own weights under other caches, seed by seed) still holds, but
    no claim that compares separately trained runs can hold or fail on two draws of a two-valued
    outcome, and the prefill claim (the main run's own weights) is judged seed by seed."""
    r = world(**TRUE_WORLD)
    runs = {Results.run_model(g, rc) for g in CONFIG["ablations"]["gates"] for rc in CONFIG["ablations"]["recipes"]}
    r.escape_kd = 1.2
    r.escaped = {(m.removeprefix("melt-"), s): (True, 0.1) for m in runs for s in CONFIG["seeds"]}
    found = verdicts_of(r)
    assert found["Untrained KV sharing loses"] == HOLDS
    assert found["Ours, not the paper's: MELT prefilled"] == HOLDS
    for claim in ("MELT stays near Ouro in accuracy", "The element-wise gate beats", "Each recipe component helps"):
        assert found[claim] == INCONCLUSIVE, (claim, found[claim])


def test_escape_is_read_off_the_last_steps_kd():
    """A run escaped when the mean KD of its last logged steps is under the threshold: the plateau
    at 2.4 with one low step at the end is stuck, a run that fell to 0.1 escaped; seeds keep their
    own flags; no threshold models no escape."""
    rows = [{"run": "elementwise__full", "seed": s, "step": t, "kd": kd}
            for s, curve in ((0, [2.4] * 19 + [0.5]), (1, [2.4] * 10 + [0.1] * 10)) for t, kd in enumerate(curve)]
    found = escapes(pd.DataFrame(rows), 1.2, 10)
    assert {k: v[0] for k, v in found.items()} == {("elementwise__full", 0): False, ("elementwise__full", 1): True}
    assert found[("elementwise__full", 0)][1] == pytest.approx(2.21)
    assert escapes(pd.DataFrame(rows), None, 10) == {}


@pytest.mark.parametrize("ouro_bytes,ouro_sweep,expected", [
    (4 * 12582912, [0.786432 * t / 4 for t in (1, 2, 4, 8)], (HOLDS, HOLDS)),  # 1/T exactly; linear in T
    (4 * 12582912 + 2, [0.786432 * t / 4 for t in (1, 2, 4, 8)], (FAILS, HOLDS)),  # two bytes off 1/T
    (4 * 12582912, [0.196608 * t * t for t in (1, 2, 4, 8)], (HOLDS, FAILS)),  # Ouro's cache quadratic in T
])
def test_memory_claims_are_judged_exactly(ouro_bytes, ouro_sweep, expected):
    """Bytes are exact: MELT's cache is 1/T of Ouro's only at a ratio of exactly T, and flat/linear
    in T only when every point of the loop sweep is."""
    r = world(**TRUE_WORLD)
    r.memory = pd.DataFrame({"shape": ["ouro-1.4b", "melt-1.6b"], "kv_bytes_measured": [ouro_bytes, 12582912],
                             "kv_mb_per_token_measured": [ouro_bytes / 64e6, 12582912 / 64e6]})
    r.sweeps = {"loops": [{"model": "melt", "T": t, "kv_mb_per_token": 0.196608} for t in (1, 2, 4, 8)]
                + [{"model": "ouro", "T": t, "kv_mb_per_token": v} for t, v in zip((1, 2, 4, 8), ouro_sweep)]}
    found = {c: v for c, _, v in claims.claims(r)}
    kv = next(v for c, v in found.items() if c.startswith("MELT's KV cache is 1/T"))
    depth = next(v for c, v in found.items() if c.startswith("MELT's memory is constant in loop depth"))
    assert (kv, depth) == expected


def test_results_average_the_seeds_read_from_gathers_files(tmp_path):
    """The real Results on files in gather's and evaluate's formats: a table cell is the mean over
    the training seeds (whatever order gather wrote them in), its interval is centred on it, and the
    per-question scores behind it average to it."""
    model = Results.run_model("elementwise", "full")
    summary = tmp_path / "summary"
    summary.mkdir()
    correct = {2: [1, 1, 1, 1], 0: [1, 1, 0, 0], 1: [1, 0, 0, 0]}  # 100%, 50%, 25%: neither seed nor score order
    rows = []
    for seed, right in correct.items():
        model_id = f"{model}-seed{seed}"
        (tmp_path / "eval" / model_id).mkdir(parents=True)
        details = [{"gold": "1", "completions": ["1" if c else "0"], "correct": [bool(c)], "scores": {"pass@1": c}}
                   for c in right]
        (tmp_path / "eval" / model_id / "digit_sum.json").write_text(json.dumps({"details": details}))
        rows.append({"model": model, "seed": seed, "model_id": model_id, "task": "digit_sum", "metric": "pass@1",
                     "value": 100 * sum(right) / len(right), "n_questions": 4, "generated_tokens": 4, "seconds": 1.0})
    pd.DataFrame(rows).to_csv(summary / "evals.csv", index=False)
    for name in ("memory", "speed", "train_throughput", "training_curves", "gate_values", "early_exit"):
        (summary / f"{name}.csv").write_text("x\n")
    (summary / "sweeps.json").write_text("{}")
    config = {"outdir": str(tmp_path), "paper_version": "v2", "seeds": [0, 1, 2],
              "main_run": {"gate": "elementwise", "recipe": "full"},
              "report": {"columns": {"MATH-500": "digit_sum/pass@1"}, "note": "", "long_column": None}}
    r = Results(config, str(Path(__file__).resolve().parents[1] / "workflow/resources/paper_values.yaml"))
    assert r.score(model, "MATH-500") == pytest.approx(175 / 3)
    assert r.per_seed(model, "MATH-500") == [50.0, 25.0, 100.0]
    per_question = r.per_question(model, "MATH-500")
    assert per_question.shape == (3, 4) and per_question.mean() == pytest.approx(175 / 3)
    estimate = r.estimate(model, "MATH-500")
    assert estimate.mean == pytest.approx(175 / 3) and estimate.lo < estimate.mean < estimate.hi
    assert r.score(Results.run_model("scalar", "full"), "MATH-500") is None
