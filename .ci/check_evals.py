"""Fail when a run's evaluations do not show that each model was the one evaluated.

    python .ci/check_evals.py results/rehearsal               # checkpoints apart, on every task
    python .ci/check_evals.py results/smoke --some-task       # the models differ on one task at least

An eval that ran one model under several names (a loader that ignored the checkpoint it was given,
a model kept from the previous one in the same job) prints a full table of plausible numbers.
Scores cannot show it at miniature scale, where the models all score 0; completions can. By
default, on every task, every two checkpoints must differ in their completions of some question,
except where they may legitimately coincide: a checkpoint's inference variants (``@...``) and the
teacher under a sharing cache answer like the checkpoint, and a converted MELT model and the runs
trained from it (same seed; same gate, or the untrained conversion) answer alike when training
barely moved them (the rehearsal trains a few steps at the paper's 8e-6). Teacher, dense baselines
and MELT with another gate or seed must differ. `--some-task` is for runs whose models barely
differ at all (the smoke run: a 60-step teacher whose greedy answers are all empty): there, on one
task at least, the models must not all answer alike.
"""

import argparse
import itertools
import json
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "workflow" / "scripts"))
from model_id import ModelId  # noqa: E402


def completions_by_task(outdir: Path) -> dict[str, dict[str, str]]:
    """{"<eval dir>/<task>": {model: its completions of every question, as one JSON string}}."""
    by_task: dict[str, dict[str, str]] = defaultdict(dict)
    for path in sorted(outdir.glob("**/eval/*/*.json")):
        if ".shard-" in path.name:
            continue  # merged into the task's own JSON
        details = json.loads(path.read_text())["details"]
        by_task[f"{path.parents[1].relative_to(outdir)}/{path.stem}"][path.parent.name] = json.dumps(
            [(d["prompt"], d["completions"]) for d in details])
    return by_task


def is_checkpoint(model: str) -> bool:
    parsed = ModelId.parse(model)
    return parsed.kind != "sharing" and not parsed.variant


def may_answer_alike(a: str, b: str) -> bool:
    """A converted MELT model and the runs trained from it (same seed; same gate or the untrained
    conversion) may give the same completions when training barely moved them."""
    a, b = ModelId.parse(a), ModelId.parse(b)
    melt = ("untrained", "trained")
    if a.kind not in melt or b.kind not in melt or a.seed != b.seed:
        return False
    return "untrained" in (a.kind, b.kind) or a.gate == b.gate


def problems(outdir: Path, some_task: bool = False, by_task: dict | None = None) -> list[str]:
    """What fails the check (nothing: []); ``by_task``: completions_by_task(outdir), if read already."""
    by_task = completions_by_task(outdir) if by_task is None else by_task
    if some_task:
        compared = {t: m for t, m in by_task.items() if len(m) > 1}
        if not compared:
            return [f"no task evaluated on two models or more under {outdir}"]
        if any(len(set(m.values())) > 1 for m in compared.values()):
            return []
        return [f"{t}: all {len(m)} models gave the same completions to every question" for t, m in compared.items()]
    found, pairs = [], 0
    for task, models in sorted(by_task.items()):
        ckpts = sorted(m for m in models if is_checkpoint(m))
        for a, b in itertools.combinations(ckpts, 2):
            if may_answer_alike(a, b):
                continue
            pairs += 1
            if models[a] == models[b]:
                found.append(f"{task}: {a} and {b} gave the same completions to every question")
    return found if pairs else [f"no task evaluated on two checkpoints or more under {outdir}"]


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("outdir", type=Path)
    p.add_argument("--some-task", action="store_true", help="pass if the models differ on one task at least")
    a = p.parse_args()
    tasks = completions_by_task(a.outdir)
    found = problems(a.outdir, a.some_task, tasks)
    if found:
        print("EVAL CHECK FAILED (is each eval running the model it names?):\n- " + "\n- ".join(found[:20])
              + (f"\n- ... {len(found) - 20} more" if len(found) > 20 else ""))
        sys.exit(1)
    what = ("the models differ on one task at least" if a.some_task else
            "every two checkpoints that must differ gave different completions on every task")
    print(f"eval check passed: {len(tasks)} tasks under {a.outdir}; {what}")
