"""Fail when a run's evaluations cannot tell its models apart.

    python .ci/check_evals.py results/smoke

For every task evaluated on two models or more, the models' completions (every question, every
sample) must not all be the same: an eval that scored the same model under every name (a loader
that ignored the checkpoint it was given, a cache shared across models) would otherwise print a
full table of plausible numbers. Scores alone cannot show it at miniature scale, where untrained
models all score 0; their completions still differ.
"""

import json
import sys
from collections import defaultdict
from pathlib import Path


def completions(result: dict) -> list:
    return [(d["prompt"], d["completions"]) for d in result["details"]]


def problems(outdir: Path) -> list[str]:
    by_task: dict[str, dict[str, list]] = defaultdict(dict)
    for path in sorted(outdir.glob("**/eval/*/*.json")):
        if ".shard-" in path.name:
            continue  # merged into the task's own JSON
        result = json.loads(path.read_text())
        by_task[f"{path.parents[1].relative_to(outdir)}/{path.stem}"][path.parent.name] = completions(result)
    if not by_task:
        return [f"no eval results under {outdir}"]
    found = []
    for task, models in sorted(by_task.items()):
        if len(models) > 1 and len({json.dumps(c) for c in models.values()}) == 1:
            names = ", ".join(sorted(models)[:3]) + (", ..." if len(models) > 3 else "")
            found.append(f"{task}: all {len(models)} models gave the same completions to every question "
                         f"({names}): the eval does not see which model it runs")
    return found


if __name__ == "__main__":
    outdir = Path(sys.argv[1])
    found = problems(outdir)
    if found:
        print("EVAL CHECK FAILED:\n- " + "\n- ".join(found))
        sys.exit(1)
    n = len({p.parent for p in outdir.glob("**/eval/*/*.json")})
    print(f"eval check passed: {n} models' completions under {outdir} differ between models on every task")
