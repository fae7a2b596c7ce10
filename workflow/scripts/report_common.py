"""Shared by the table, figure and claims scripts: the gathered tables, the paper's numbers,
and how our (task, metric) columns stand in for the paper's benchmarks."""

import json
import re
from pathlib import Path

import pandas as pd
import yaml


class Results:
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
        self.early_exit = pd.read_csv(s / "early_exit.csv")
        self.version = config["paper_version"]
        values = yaml.safe_load(Path(paper_values).read_text())
        if self.version not in values:
            raise ValueError(f"{paper_values}: no paper values for paper_version {self.version!r}")
        self.paper = values[self.version]  # this version's numbers only; a table it lacks is {}
        for table in ("table1_main", "table2_memory", "table3_gates", "table4_recipe", "table5_sharing",
                      "table10_speed", "table11_train_throughput", "table_early_exit"):
            self.paper.setdefault(table, {})
        self.columns = config["report"]["columns"]
        self.note = config["report"].get("note", "")
        main = config["main_run"]
        self.main_model = f"melt-{main['gate']}__{main['recipe']}"

    def score(self, model: str, paper_column: str) -> float | None:
        """Our score (percent) standing in for a paper benchmark column, or None if not measured."""
        spec = self.columns.get(paper_column)
        if spec is None:
            return None
        task, metric = spec.split("/")
        hit = self.evals[(self.evals.model == model) & (self.evals.task == task) & (self.evals.metric == metric)]
        return float(hit.value.iloc[0]) if len(hit) else None

    def per_question(self, model: str, paper_column: str):
        """Per-question scores (percent: the share of a question's samples judged correct) behind
        a paper column, in the task's question order; None if not evaluated."""
        spec = self.columns.get(paper_column)
        path = self.out / "eval" / model / f"{spec.split('/')[0]}.json" if spec else None
        if path is None or not path.is_file():
            return None
        details = json.loads(path.read_text())["details"]
        return [100.0 * sum(d["correct"]) / max(1, len(d["correct"])) for d in details]

    def stand_in(self, paper_column: str) -> str | None:
        """The task/metric that stands in for a paper benchmark when it is not that benchmark itself
        (the embedded task), else None: a difference to the paper's number only means something then."""
        spec = self.columns.get(paper_column)
        if spec is None:
            return None
        squash = lambda text: re.sub(r"[^a-z0-9]", "", text.lower())  # noqa: E731
        return None if squash(spec.split("/")[0]) == squash(paper_column) else spec

    def run_model(self, gate: str, recipe: str) -> str:
        return f"melt-{gate}__{recipe}"


def diff(ours, paper):
    return None if ours is None or paper is None else ours - paper
