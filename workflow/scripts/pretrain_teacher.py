"""Rule pretrain_teacher: the embedded default's tiny Ouro-architecture teacher, pretrained on the
synthetic task (melt_core.training.pretrain)."""

import sys

sys.path.insert(0, snakemake.scriptdir)
from common import rule_context

from melt_core.training.pretrain import PretrainConfig, pretrain

with rule_context(snakemake, "source") as log:
    cfg = PretrainConfig(train_file=snakemake.input.train, test_file=snakemake.input.test,
                         tokenizer=snakemake.input.tokenizer, out_dir=snakemake.output[0],
                         extra_tests={"chain": snakemake.input.test_chain} if "test_chain" in snakemake.input.keys()
                         else None, **snakemake.params.pretrain)
    pretrain(cfg, log)
