"""Rule convert: Ouro checkpoint -> MELT checkpoint with fresh gates of one variant."""

import sys

sys.path.insert(0, snakemake.scriptdir)
from common import rule_context

from melt_core.modeling.checkpoint import convert_ouro_to_melt

with rule_context(snakemake, "convert") as log:
    opts = {**snakemake.params.convert, "seed": snakemake.params.seed}  # the training seed draws the gates
    gate = snakemake.wildcards.gate
    out = convert_ouro_to_melt(snakemake.input[0], snakemake.output[0], gate=gate, **opts)
    log.log_params({"gate": gate, **opts})
    print(f"wrote {out}")
