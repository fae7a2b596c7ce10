"""The model-id grammar (workflow/scripts/model_id.py): every id the workflows build reads back as
what it was built from, malformed ids are refused with the grammar named, and no other file cuts
ids apart by hand."""

import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "workflow" / "scripts"))
from model_id import ModelId, parse_run, run_id  # noqa: E402


@pytest.mark.parametrize("text, kind, family, fields", [
    ("ouro", "teacher", "ouro", {}),
    ("ouro-first-loop", "sharing", "ouro", {"name": "first-loop"}),
    ("ouro-last-loop+prompt", "sharing", "ouro", {"name": "last-loop+prompt"}),
    ("ouro-seed1", "teacher", "ouro", {"seed": 1}),  # training seed 1's own teacher (source.pretrain.per_seed)
    ("ouro-first-loop-seed0", "sharing", "ouro",
     {"name": "first-loop", "seed": 0, "sharing_cache": ("first-loop", False)}),
    ("ouro-last-loop+prompt-seed3", "sharing", "ouro", {"name": "last-loop+prompt", "seed": 3}),
    ("dense-qwen3-1.7b", "dense", "dense", {"name": "qwen3-1.7b"}),
    ("melt-untrained", "untrained", "melt", {"seed": None}),
    ("melt-untrained-seed2", "untrained", "melt", {"seed": 2}),
    ("melt-elementwise__full", "trained", "melt", {"gate": "elementwise", "recipe": "full", "seed": None}),
    ("melt-ema__no_allloop_kd-seed10", "trained", "melt", {"gate": "ema", "recipe": "no_allloop_kd", "seed": 10}),
    ("melt-elementwise__full-seed1@prefill-chunk8", "trained", "melt",
     {"seed": 1, "variant": "prefill-chunk8", "prefill": 8, "window": None}),
    ("melt-elementwise__full-seed0@prefill-exact", "trained", "melt", {"prefill": "exact"}),
    ("melt-elementwise__full-seed0@window-34", "trained", "melt", {"window": 34, "prefill": None}),
])
def test_ids_read_back_as_built(text, kind, family, fields):
    m = ModelId.parse(text)
    assert (m.kind, m.family, str(m)) == (kind, family, text)
    for k, v in fields.items():
        assert getattr(m, k) == v, k
    assert ModelId.parse(str(m.checkpoint_id)).variant == ""
    assert ModelId.parse(str(m.across_seeds)).seed is None


def test_built_ids_and_their_parts():
    m = ModelId.trained("scalar", "no_align", seed=3, variant="window-8")
    assert str(m) == "melt-scalar__no_align-seed3@window-8" and m.run == "scalar__no_align"
    assert str(m.checkpoint_id) == "melt-scalar__no_align-seed3"
    assert str(m.across_seeds) == "melt-scalar__no_align@window-8"
    assert ModelId.sharing("last-loop+prompt").sharing_cache == ("last-loop", True)
    assert parse_run(run_id("elementwise", "full")) == ("elementwise", "full")
    assert sorted(["window-34", "window-8", "prefill-exact"],
                  key=lambda v: ModelId.trained("g", "r", variant=v).variant_sort_key()) == \
        ["prefill-exact", "window-8", "window-34"]


@pytest.mark.parametrize("bad", ["", "melt", "melt-elementwise", "ouro-", "dense-", "qwen3", "ouro-seed01",
                                 "ouro-seed1@window-3x", "dense-x-seed1", "melt-a__b@chunk8", "melt-a__b@window-",
                                 "melt-a__b-seed01", "melt-a__b__c", "melt-a__b@prefill-chunk0"])
def test_malformed_ids_are_refused(bad):
    with pytest.raises(ValueError, match="model id|training seed|variant"):
        ModelId.parse(bad)


@pytest.mark.parametrize("gate, recipe", [("a__b", "full"), ("elementwise", ""), ("elementwise", "x@y")])
def test_names_that_would_break_an_id_are_refused(gate, recipe):
    with pytest.raises(ValueError, match="cannot be part of a run id"):
        run_id(gate, recipe)


# Cutting ids apart by hand: what the grammar replaced (the old code did each of these)
HAND_PARSING = [r'split\("__"\)', r'partition\("@', r'-seed\(\\d', r'removeprefix\("(melt|ouro|dense)-"\)',
                r'startswith\("(melt|ouro|dense)-"\)', r'replace\("__"', r'f"ouro-\{', r'f["\']melt-\{[^}]*\}__',
                r'\{[^}]*\}__\{',
                r'"melt-untrained"']


def test_no_file_but_the_grammar_cuts_ids_apart():
    files = [*ROOT.glob("workflow/**/*.py"), *ROOT.glob("workflow/**/*.smk"), *ROOT.glob("melt_core/*.py"),
             ROOT / "Snakefile"]
    found = [f"{f.relative_to(ROOT)}:{i}: {line.strip()}" for f in files if f.name != "model_id.py"
             for i, line in enumerate(f.read_text().splitlines(), 1)
             if any(re.search(p, line) for p in HAND_PARSING)]
    assert not found, "model ids parsed or built by hand (use workflow/scripts/model_id.py):\n" + "\n".join(found)
