"""The docs point at what exists: the README opens with its two set-up commands and stays short, and
every file path the README and docs/ name (melt_core modules above all, which move) is there."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# a repository path as the docs write it: melt_core/..., workflow/..., tests/..., ... ending in a file name
PATH = re.compile(r"(?<![\w/.])((?:melt_core|workflow|tests|benchmarks|config|envs|profiles|docs|\.ci)/[\w./-]*\w)")


def named_paths(text: str) -> set[str]:
    """Repository paths a doc names; globs and placeholders (``*``, ``<...>``, ``{a,b}``) are not paths."""
    return {p for p in PATH.findall(text) if not re.search(r"[*<>{}]", p)}


def test_the_readme_opens_with_the_two_commands_and_stays_short():
    lines = (ROOT / "README.md").read_text().splitlines()
    block = lines[lines.index("```bash") + 1:lines.index("```")]
    assert block[0].startswith("bash envs/setup.sh && .venv/bin/snakemake --profile local all")
    assert block[1].startswith("bash envs/setup.sh && .venv/bin/python -m pytest -q")
    assert len(lines) <= 250, f"README.md has {len(lines)} lines (at most 250: the details belong in docs/)"
    long = [i + 1 for i, line in enumerate(lines) if len(line) > 120]
    assert not long, f"README.md lines over 120 characters: {long}"


def test_every_path_the_docs_name_exists():
    missing = {}
    for doc in DOCS:
        gone = sorted(p for p in named_paths(doc.read_text()) if not (ROOT / p).exists()
                      and not (ROOT / p.rstrip(".")).exists())
        if gone:
            missing[doc.name] = gone
    assert not missing, f"paths named in the docs that do not exist: {missing}"


def test_the_path_finder_sees_paths_and_skips_placeholders():
    found = named_paths("see melt_core/serving/vllm_models.py, results/<outdir>/x and tests/*.py; "
                        "`melt_core/cache.py`")
    assert found == {"melt_core/serving/vllm_models.py", "melt_core/cache.py"}
