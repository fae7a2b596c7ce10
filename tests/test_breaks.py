"""tests/breaks.py lists the breaks tried on purpose, each with the tests that must fail on it.
Running them takes minutes (``python tests/breaks.py``); this keeps the list true to the code at
every commit: each break's line occurs exactly once where it says, its tests exist, and the broken
code still parses (a break must be a plausible bug, not a syntax error)."""

import ast
from pathlib import Path

import pytest
from breaks import BREAKS, ROOT


@pytest.mark.parametrize("brk", BREAKS, ids=[b.name for b in BREAKS])
def test_each_break_still_applies(brk):
    source = (ROOT / brk.path).read_text()
    assert source.count(brk.old) == 1, f"{brk.path}: the line of break {brk.name!r} moved; update tests/breaks.py"
    if brk.path.endswith(".py"):  # a rule file (.smk) is Snakemake's grammar, not Python's
        ast.parse(source.replace(brk.old, brk.new, 1))
    for test in brk.tests:
        path, _, name = test.partition("::")
        assert (ROOT / path).is_file(), test
        name = name.partition("[")[0]  # a parametrized test's id names its function before the brackets
        assert not name or f"def {name}(" in Path(ROOT / path).read_text(), test


def test_break_names_are_distinct():
    assert len({b.name for b in BREAKS}) == len(BREAKS)
