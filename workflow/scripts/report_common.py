"""Shared by the table, figure and claims scripts: the gathered tables, the paper's numbers,
and how our (task, metric) columns stand in for the paper's benchmarks."""

import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import yaml
from model_id import ModelId, parse_run
from verdicts import Cell, clopper_pearson, interval


class Estimate:
    """A score (percent) over training seeds with its 95% interval, as one table cell: Markdown and
    LaTeX print ``mean [lo, hi]``, the CSV gets the three numbers in columns of their own."""

    def __init__(self, mean: float, lo: float, hi: float):
        self.mean, self.lo, self.hi = mean, lo, hi

    def __format__(self, spec: str) -> str:
        return f"{self.mean:{spec or '.1f'}} [{self.lo:{spec or '.1f'}}, {self.hi:{spec or '.1f'}}]"

    def __sub__(self, other):
        return self.mean - other

    __str__ = __format__


class Results:
    untrained = str(ModelId.untrained())  # the converted, untrained MELT model (across seeds)

    def __init__(self, config: dict, paper_values: str):
        self.config = config
        self.out = Path(config["outdir"])
        s = self.out / "summary"
        self.evals = pd.read_csv(s / "evals.csv")
        self.memory = pd.read_csv(s / "memory.csv")
        self.speed = pd.read_csv(s / "speed.csv")
        self.train_throughput = pd.read_csv(s / "train_throughput.csv")
        self.curves = pd.read_csv(s / "training_curves.csv")
        self.gates = pd.read_csv(s / "gate_values.csv")
        self.sweeps = json.loads((s / "sweeps.json").read_text())
        self.early_exit_runs = pd.read_csv(s / "early_exit.csv")  # one row per seed's model and rule
        self.early_exit = pool_early_exit(self.early_exit_runs)  # the seeds pooled (the tables' rows)
        self.version = config["paper_version"]
        values = yaml.safe_load(Path(paper_values).read_text())
        if self.version not in values:
            raise ValueError(f"{paper_values}: no paper values for paper_version {self.version!r}")
        self.paper = values[self.version]  # this version's numbers only; a table it lacks is {}
        for table in ("table1_main", "table2_memory", "table3_gates", "table4_recipe", "table5_sharing",
                      "table10_speed", "table11_train_throughput", "table_early_exit"):
            self.paper.setdefault(table, {})
        self.columns = config["report"]["columns"]
        self.note = config["report"]["note"]
        self.seeds = config["seeds"]
        self._scores: dict[tuple[str, str, str], list[float] | None] = {}  # per-question scores by eval
        self._read: dict[tuple[str, str], list[dict] | None] = {}  # each eval's details, read once
        self.escape_kd = config["report"].get("escape_kd")
        self.escaped = escapes(self.curves, self.escape_kd, config["report"].get("escape_last", 10))
        self.long_column = config["report"]["long_column"]  # a column whose answers are long
        main = config["main_run"]
        self.main_model = self.run_model(main["gate"], main["recipe"])

    def _rows(self, model: str | None, paper_column: str) -> pd.DataFrame | None:
        """The evals rows of a model (None: every model) in a paper column."""
        spec = self.columns.get(paper_column)
        if spec is None:
            return None
        task, metric = spec.split("/")
        hit = self.evals[(self.evals.task == task) & (self.evals.metric == metric)]
        return hit if model is None else hit[hit.model == model]

    def score(self, model: str, paper_column: str) -> float | None:
        """Our score (percent) standing in for a paper benchmark column, the mean over the model's
        training seeds, or None if not measured. ``model``: an id without its seed."""
        hit = self._rows(model, paper_column)
        return float(hit.value.mean()) if hit is not None and len(hit) else None

    def per_seed(self, model: str, paper_column: str) -> list[float]:
        """Each training seed's own score (percent), in seed order; [] for a model without seeds."""
        hit = self._rows(model, paper_column)
        if hit is None or not hit.seed.notna().any():
            return []
        return [float(v) for v in hit.sort_values("seed").value]

    def estimate(self, model: str, paper_column: str) -> Estimate | None:
        """The score with its 95% interval (verdicts.cell_interval)."""
        cell = self.cell(model, paper_column)
        return None if cell is None else Estimate(*interval(cell))

    def cell(self, model: str, paper_column: str) -> Cell | None:
        """A model's per-question scores in a column with what the verdicts need beside them: each
        seed's escape (trained runs, where ``report.escape_kd`` is set) and which weights it
        evaluates (a trained run's checkpoint; every untrained model is its seed's teacher)."""
        scores = self.per_question(model, paper_column)
        if scores is None:
            return None
        mid = ModelId.parse(model)
        if mid.kind != "trained":
            return Cell(scores, None, "dense" if mid.kind == "dense" else "teacher")
        flags = self.escape_flags(model)
        return Cell(scores, flags if flags and len(flags) == len(scores) else None, str(mid.checkpoint_id))

    def escape_flags(self, model: str) -> tuple[bool, ...] | None:
        """Per training seed (in seed order) whether the run a trained model evaluates escaped its
        plateau; None where no escape is modelled or the curves lack the run."""
        if self.escape_kd is None:
            return None
        run = ModelId.parse(model).run
        rows = [self.escaped[k] for k in sorted(k for k in self.escaped if k[0] == run)]
        return tuple(bool(flag) for flag, _ in rows) or None

    def per_question(self, model: str, paper_column: str):
        """Per-question scores (percent) behind a paper column: each question's own value of the
        column's metric (pass@1: the share of its samples judged correct; pass@k: the unbiased
        estimate from its samples), an array (seeds, questions) in the task's question order, whose
        mean is the table's score; None if not evaluated."""
        hit = self._rows(model, paper_column)
        if hit is None or not len(hit):
            return None
        task, metric = self.columns[paper_column].split("/")
        rows = [self._question_scores(model_id, task, metric) for model_id in by_seed(hit.model_id.unique())]
        return None if any(r is None for r in rows) else np.asarray(rows)

    def _question_scores(self, model_id: str, task: str, metric: str) -> list[float] | None:
        """One eval's per-question scores, read once: tables and claims ask for the same evals many
        times, and a paper-scale results file holds every completion."""
        key = (model_id, task, metric)
        if key not in self._scores:
            details = self._details(model_id, task)
            self._scores[key] = None if details is None else [100.0 * d["scores"][metric] for d in details]
        return self._scores[key]

    def _details(self, model_id: str, task: str) -> list[dict] | None:
        key = (model_id, task)
        if key not in self._read:
            path = self.out / "eval" / model_id / f"{task}.json"
            self._read[key] = json.loads(path.read_text())["details"] if path.is_file() else None
        return self._read[key]

    def prefix_match(self, model: str, paper_column: str, length: int):
        """Per question (seeds, questions), percent: the share of its completions whose first
        ``length`` characters are the reference's, over the questions whose reference is at least
        that long; None if not evaluated. Where accuracy falls as the answer grows: a model that
        loses the thread after n characters scores 100 below n and 0 above."""
        hit = self._rows(model, paper_column)
        if hit is None or not len(hit):
            return None
        task = self.columns[paper_column].split("/")[0]
        rows = []
        for model_id in by_seed(hit.model_id.unique()):
            details = self._details(model_id, task)
            if details is None:
                return None
            rows.append([100.0 * sum(c[:length] == d["gold"][:length] for c in d["completions"])
                         / max(1, len(d["completions"])) for d in details if len(str(d["gold"])) >= length])
        return np.asarray(rows) if rows and rows[0] else None

    def answer_length(self, paper_column: str) -> int:
        """The longest reference answer (characters) of a column's task, read off the teacher's eval
        (every model is evaluated on the same questions)."""
        task = self.columns[paper_column].split("/")[0]
        teachers = sorted(self.evals[self.evals.model == "ouro"].model_id.unique())  # one, or one a seed
        details = (self._details(teachers[0], task) if teachers else None) or []
        return max((len(str(d["gold"])) for d in details), default=0)

    def stand_in(self, paper_column: str) -> str | None:
        """The task/metric that stands in for a paper benchmark when it is not that benchmark itself
        (the embedded task), else None: a difference to the paper's number only means something then."""
        spec = self.columns.get(paper_column)
        if spec is None:
            return None
        squash = lambda text: re.sub(r"[^a-z0-9]", "", text.lower())  # noqa: E731
        return None if squash(spec.split("/")[0]) == squash(paper_column) else spec

    def main_variants(self, kind: str = "") -> list[str]:
        """The main run's inference variants that were evaluated (``@prefill-...``, ``@window-W``;
        ``kind`` e.g. ``window`` picks one kind), in order of kind and then number."""
        ids = [ModelId.parse(m) for m in self.evals.model.unique()]
        found = [m for m in ids if m.variant.startswith(kind) and m.variant and str(m.checkpoint_id) == self.main_model]
        return [str(m) for m in sorted(found, key=ModelId.variant_sort_key)]

    @staticmethod
    def run_model(gate: str, recipe: str) -> str:
        """The model id (across seeds) of the run of ``gate`` with ``recipe``."""
        return str(ModelId.trained(gate, recipe))

    @staticmethod
    def sharing_model(mode: str) -> str:
        """The model id of Ouro with the untrained KV-sharing cache ``mode``."""
        return str(ModelId.sharing(mode))

    def sharing_models(self) -> list[str]:
        return [self.sharing_model(v) for v in self.config["baselines"]["sharing"]]


def by_seed(model_ids) -> list[str]:
    """Model ids in training-seed order (seed 10 after seed 9, as the escape flags and per_seed)."""
    def key(m):
        try:
            seed = ModelId.parse(m).seed
        except ValueError:  # an id outside the grammar (a hand-made fixture): by name
            seed = None
        return (seed is not None, seed or 0, m)
    return sorted(model_ids, key=key)


def escapes(curves: pd.DataFrame, threshold: float | None, last: int) -> dict[tuple[str, int], tuple[bool, float]]:
    """{(run, seed): (escaped, final KD)}: a run escaped when its KD loss, the mean of its last ``last``
    logged steps, is below ``threshold``; {} when no threshold is set or no curve was logged."""
    if threshold is None or not len(curves) or "kd" not in curves:
        return {}
    out = {}
    for (run, seed), g in curves.groupby(["run", "seed"], sort=True):
        kd = float(g.sort_values("step").kd.tail(last).mean())
        out[(str(run), int(seed))] = (kd < threshold, kd)
    return out


def escape_rows(r: Results) -> list[dict]:
    """Per trained run: its seeds' final KD and escape, k of n with the exact 95% interval of the
    escape rate, and each column's mean over the seeds that escaped and over those that did not."""
    rows = []
    for run in sorted({run for run, _ in r.escaped}):
        seeds = sorted((seed, *r.escaped[(run, seed)]) for rr, seed in r.escaped if rr == run)
        k, n = sum(e for _, e, _ in seeds), len(seeds)
        lo, hi = clopper_pearson(k, n, 0.95)
        row = {"run": run, "escaped": f"{k} of {n}", "rate CI low": 100 * lo, "rate CI high": 100 * hi,
               "final KD (seeds)": ", ".join(f"{kd:.2f}" for _, _, kd in seeds)}
        model = str(ModelId.trained(*parse_run(run)))
        for col in r.columns:
            x = r.per_question(model, col)
            if x is None or len(x) != n:
                continue
            flags = np.array([e for _, e, _ in seeds], dtype=bool)
            row[f"{col} escaped"] = float(x[flags].mean()) if flags.any() else None
            row[f"{col} stuck"] = float(x[~flags].mean()) if (~flags).any() else None
        rows.append(row)
    return rows


def pool_early_exit(df: pd.DataFrame) -> pd.DataFrame:
    """The early-exit sweep of every seed, one row per model (across its seeds), exit gate and rule:
    ``per_question`` a (seeds, questions) list in the order of ``seeds`` (the same order in every
    row of a model, so a rule and the model's every-loop row pair seed by seed), the accuracy's
    interval over seeds and questions (verdicts.interval), loops, tok/s and speed-up the seeds' means."""
    if not len(df):
        return df
    df = df.assign(across=[str(ModelId.parse(m).across_seeds) for m in df.model],
                   seed=[ModelId.parse(m).seed for m in df.model]).sort_values("seed", kind="stable",
                                                                                na_position="first")
    rows = []
    for (model, variant, rule), g in df.groupby(["across", "variant", "rule"], sort=False):
        x = np.asarray([json.loads(p) for p in g.per_question], dtype=float)
        acc, lo, hi = interval(x)
        rows.append({"model": model, "variant": variant, "rule": rule, "seeds": [s for s in g.seed],
                     "accuracy": acc, "ci_lo": lo, "ci_hi": hi, "per_question": json.dumps(x.tolist()),
                     **{k: float(g[k].mean()) for k in ("mean_loops", "loop_fraction", "tokens_per_s", "speedup")},
                     **{k: g[k].iloc[0] for k in ("loops", "metric", "batch_size", "device") if k in g}})
    return pd.DataFrame(rows)


def diff(ours, paper):
    return None if ours is None or paper is None else ours - paper


def expand_estimates(df: pd.DataFrame) -> pd.DataFrame:
    """A table for CSV: each column of Estimates becomes the mean plus ``<column> CI low/high``."""
    out = {}
    for col in df.columns:
        if any(isinstance(v, Estimate) for v in df[col]):
            out[col] = [v.mean if isinstance(v, Estimate) else v for v in df[col]]
            out[f"{col} CI low"] = [v.lo if isinstance(v, Estimate) else None for v in df[col]]
            out[f"{col} CI high"] = [v.hi if isinstance(v, Estimate) else None for v in df[col]]
        else:
            out[col] = df[col]
    return pd.DataFrame(out)
