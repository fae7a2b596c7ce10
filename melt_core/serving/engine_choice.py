"""Which engine may run a model: the one decision, torch-free so the Snakefile (rule plan), the eval
jobs (inference.spec_vllm_refusal) and the vLLM model itself (vllm_models) all ask it."""

from __future__ import annotations


def vllm_refusal(cache_mode: str = "default", keep_prompt: bool = False, window: int | None = None,
                 early_exit: str | None = None) -> str | None:
    """Why vLLM cannot run a model as the eval asks (None: it can): the one place that decides, used by
    the eval jobs (spec_vllm_refusal), the plan (rule plan's native models) and the vLLM model itself.
    vLLM runs Ouro with its per-loop cache, MELT with its shared one and dense checkpoints as vLLM's own
    models; what melt_core's caches and loop alone express stays on the native engine. ``window``: MELT's
    sliding window, asked by the eval or kept in the checkpoint; ``early_exit``: the label of an exit
    rule that stops tokens before the last loop."""
    if cache_mode != "default" or keep_prompt:
        why = f"the untrained sharing cache {cache_mode}{' + prompt' if keep_prompt else ''} is melt_core's"
    elif window:
        why = f"MELT's sliding window (W = {window}) keeps per-loop rows that vLLM's paged cache cannot hold"
    elif early_exit:
        why = f"early exit ({early_exit}) stops tokens between loops; vLLM runs every loop"
    else:
        return None
    return f"{why}; it runs on melt_core's engine (eval.engine: native runs every model there)"
