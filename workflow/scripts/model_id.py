"""The model-id grammar: every id the workflow builds or reads is formatted and parsed here, and
nowhere else (the Snakefile, the rule scripts and the report all go through ``ModelId``).

    ouro[-seed<s>]                    the teacher (Ouro, downloaded or pretrained; -seed<s>: the
                                      teacher pretrained for training seed s, source.pretrain.per_seed)
    ouro-<sharing>[-seed<s>]          Ouro with an untrained KV-sharing cache (Table 5), e.g.
                                      ``ouro-last-loop+prompt``
    dense-<name>                      a dense baseline, e.g. ``dense-qwen3-1.7b``
    melt-untrained[-seed<s>]          MELT as converted from Ouro, not trained
    melt-<gate>__<recipe>[-seed<s>]   a trained (gate, recipe) run, e.g. ``melt-elementwise__full-seed1``
    ...@<variant>                     the same checkpoint under another inference setting:
                                      ``@prefill-exact``, ``@prefill-chunk<C>``, ``@window-<W>``

Without ``-seed<s>`` an id names a model across its training seeds (the tables' rows); a dense
baseline has no seed. A run id
(``<gate>__<recipe>``, without ``melt-``) names a training run: ``run_id`` / ``parse_run``.
Torch-free: the Snakefile imports it while it builds the DAG.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

_RUN_SEP = "__"
_ID = re.compile(r"(?P<base>[^@]+?)(?:-seed(?P<seed>\d+))?(?:@(?P<variant>[^@]+))?")
_VARIANT = re.compile(r"prefill-exact|prefill-chunk[1-9]\d*|window-\d+")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]*")


def run_id(gate: str, recipe: str) -> str:
    """The id of the training run of ``gate`` with ``recipe``: ``elementwise__full``."""
    for what, name in (("gate", gate), ("recipe", recipe)):
        if _RUN_SEP in name or not _NAME.fullmatch(name):
            raise ValueError(f"{what} name {name!r} cannot be part of a run id: use letters, digits, '_', '-', "
                             f"'.', '+' and no {_RUN_SEP!r}")
    return f"{gate}{_RUN_SEP}{recipe}"


def parse_run(run: str) -> tuple[str, str]:
    """``elementwise__full`` -> (``elementwise``, ``full``)."""
    gate, sep, recipe = run.partition(_RUN_SEP)
    if not sep or not gate or not recipe or _RUN_SEP in recipe:
        raise ValueError(f"{run!r} is not a run id (<gate>{_RUN_SEP}<recipe>)")
    return gate, recipe


@dataclass(frozen=True)
class ModelId:
    """One model id, parsed. ``kind``: ``teacher`` (ouro), ``sharing`` (ouro-<name>), ``dense``
    (dense-<name>), ``untrained`` (melt-untrained) or ``trained`` (melt-<gate>__<recipe>)."""

    kind: str
    name: str = ""          # the sharing mode, or the dense baseline's name
    gate: str = ""          # trained runs
    recipe: str = ""
    seed: int | None = None  # training seed (a per-seed teacher's too); None: across seeds, or one teacher
    variant: str = ""       # prefill-exact | prefill-chunk<C> | window-<W>; "" = as the config evaluates

    # -- building ------------------------------------------------------------------------------
    @classmethod
    def teacher(cls, seed: int | None = None) -> ModelId:
        return cls("teacher", seed=seed)

    @classmethod
    def sharing(cls, mode: str, seed: int | None = None) -> ModelId:
        return cls("sharing", name=mode, seed=seed)

    @classmethod
    def dense(cls, name: str) -> ModelId:
        return cls("dense", name=name)

    @classmethod
    def untrained(cls, seed: int | None = None) -> ModelId:
        return cls("untrained", seed=seed)

    @classmethod
    def trained(cls, gate: str, recipe: str, seed: int | None = None, variant: str = "") -> ModelId:
        run_id(gate, recipe)  # checks the names
        return cls("trained", gate=gate, recipe=recipe, seed=seed, variant=variant)

    def with_seed(self, seed: int | None) -> ModelId:
        return replace(self, seed=seed)

    def with_variant(self, variant: str) -> ModelId:
        return replace(self, variant=variant)

    # -- reading -------------------------------------------------------------------------------
    @classmethod
    def parse(cls, text: str) -> ModelId:
        """An id as ``str(ModelId)`` writes it; anything else raises ValueError naming the grammar."""
        m = _ID.fullmatch(text)
        if m is None:
            raise ValueError(f"{text!r} is not a model id (see workflow/scripts/model_id.py)")
        base, seed, variant = m["base"], m["seed"], m["variant"] or ""
        head, _, rest = base.partition("-")
        if base == "ouro":
            out = cls.teacher()
        elif head == "ouro" and rest:
            out = cls.sharing(rest)
        elif head == "dense" and rest:
            out = cls.dense(rest)
        elif base == "melt-untrained":
            out = cls.untrained()
        elif head == "melt" and _RUN_SEP in rest:
            try:
                out = cls.trained(*parse_run(rest))
            except ValueError as e:
                raise ValueError(f"{text!r} is not a model id: {e}") from None
        else:
            raise ValueError(f"{text!r} is not a model id: it starts with none of ouro, ouro-<sharing>, "
                             f"dense-<name>, melt-untrained, melt-<gate>{_RUN_SEP}<recipe>")
        if seed is not None and out.kind == "dense":
            raise ValueError(f"{text!r}: a dense baseline carries no training seed")
        if variant and not _VARIANT.fullmatch(variant):
            raise ValueError(f"{text!r}: unknown variant @{variant} (prefill-exact, prefill-chunk<C>, window-<W>)")
        out = replace(out, seed=None if seed is None else int(seed), variant=variant)
        if str(out) != text:
            raise ValueError(f"{text!r} is not a model id in its written form ({out})")
        return out

    def __str__(self) -> str:
        base = {"teacher": "ouro", "sharing": f"ouro-{self.name}", "dense": f"dense-{self.name}",
                "untrained": "melt-untrained"}.get(self.kind) or f"melt-{self.run}"
        seed = f"-seed{self.seed}" if self.seed is not None else ""
        return base + seed + (f"@{self.variant}" if self.variant else "")

    @property
    def family(self) -> str:
        """Whose architecture (and cache) the model has: ``ouro``, ``melt`` or ``dense``."""
        return {"teacher": "ouro", "sharing": "ouro", "dense": "dense"}.get(self.kind, "melt")

    @property
    def run(self) -> str:
        """The training run's id (``gate__recipe``) of a trained model, else ""."""
        return f"{self.gate}{_RUN_SEP}{self.recipe}" if self.kind == "trained" else ""

    @property
    def checkpoint_id(self) -> ModelId:
        """The model whose checkpoint this id evaluates: the id without its variant."""
        return replace(self, variant="")

    @property
    def across_seeds(self) -> ModelId:
        """The id without its training seed: the row the tables average the seeds into."""
        return replace(self, seed=None)

    @property
    def prefill(self) -> str | int | None:
        """The variant's prefill: ``"exact"``, a chunk size, or None (the config's own)."""
        mode = self.variant.removeprefix("prefill-") if self.variant.startswith("prefill-") else None
        return mode if mode in (None, "exact") else int(mode.removeprefix("chunk"))

    @property
    def window(self) -> int | None:
        """The variant's sliding window at inference, or None (the checkpoint's own)."""
        return int(self.variant.removeprefix("window-")) if self.variant.startswith("window-") else None

    @property
    def cache(self) -> tuple[str, bool]:
        """The cache this id evaluates with: a sharing baseline's (sharing_cache), else the model's own
        ("default", no kept prompt)."""
        return self.sharing_cache if self.kind == "sharing" else ("default", False)

    @property
    def sharing_cache(self) -> tuple[str, bool]:
        """A sharing baseline's cache mode and whether it keeps the prompt's per-loop K/V."""
        return self.name.removesuffix("+prompt"), self.name.endswith("+prompt")

    def variant_sort_key(self) -> tuple[str, int]:
        """Variants ordered by kind, then number (``window-8`` before ``window-34``)."""
        name, number = re.fullmatch(r"(.*?)(\d*)", self.variant).groups()
        return name, int(number) if number else -1
