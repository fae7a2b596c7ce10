"""The vLLM engine process: ``python -m melt_core.serving.vllm_worker``, run by
melt_core.serving.vllm_engine.VllmEngine in the serving environment (.venv-vllm). One engine per
process, started once; requests and replies are JSON lines (stdin in; replies on the process's
original stdout, while everything vLLM prints goes to stderr, which the parent passes on to its log).

    {"op": "start", "engine": {...vllm.LLM keywords, from vllm_engine.engine_args...}}
    {"op": "generate", "prompts": [[ids], ...], "params": {...melt_core SamplingParams fields...},
     "logprobs": false, "max_new_tokens_each": null or [n, ...] (a budget per prompt, over the params')}
     -> {"outputs": ..., "seconds": s, "counters": {preemptions, prefix_cache_queries, prefix_cache_hits,
                                                     engine_steps, step_tokens}}
    {"op": "stop"}

Each reply is {"ok": true, ...} or {"ok": false, "error": "<type>: <message>"}; the process ends on
stdin's end or "stop".
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback


def sampling(params: dict, prompt: list[int], logprobs: bool, max_new_tokens: int | None = None):
    """vLLM's SamplingParams for one prompt, as melt_core's generate() samples: greedy or temperature
    + top-p; n samples; stop on the given token ids (EOS among them, never implicitly) or strings;
    one seed per prompt drawn from (seed, prompt), so a prompt samples the same in any batch."""
    from vllm import SamplingParams

    from ..generation.generate import sample_seed

    greedy = params.get("greedy", False)
    return SamplingParams(
        n=params.get("n", 1), temperature=0.0 if greedy else params.get("temperature", 1.0),
        top_p=1.0 if greedy else params.get("top_p", 1.0), max_tokens=max_new_tokens or params["max_new_tokens"],
        stop_token_ids=list(params.get("stop_token_ids", ())), stop=list(params.get("stop_strings", ())) or None,
        ignore_eos=True, seed=None if greedy else sample_seed(params.get("seed", 0), prompt, 0),
        logprobs=0 if logprobs else None, detokenize=bool(params.get("stop_strings")))


def outputs(request_output, logprobs: bool) -> list[dict]:
    out = []
    for o in request_output.outputs:
        item = {"token_ids": list(o.token_ids), "finish_reason": "stop" if o.finish_reason == "stop" else "length",
                "text": o.text if o.text else None}
        if logprobs:
            item["logprobs"] = [step[t].logprob for step, t in zip(o.logprobs, o.token_ids)]
        out.append(item)
    return out


COUNTERS = {"preemptions": "vllm:num_preemptions", "prefix_cache_queries": "vllm:prefix_cache_queries",
            "prefix_cache_hits": "vllm:prefix_cache_hits"}  # vLLM's own counters, totals since the engine started


STEPS = "vllm:iteration_tokens_total"  # a histogram: one observation per engine step, the step's tokens


def counters(llm) -> dict[str, int]:
    metrics = llm.get_metrics()
    values = {m.name: m.value for m in metrics if hasattr(m, "value")}
    steps = next((m for m in metrics if m.name == STEPS and hasattr(m, "count")), None)
    return {**{key: int(values.get(name, 0)) for key, name in COUNTERS.items()},
            "engine_steps": steps.count if steps else 0, "step_tokens": int(steps.sum) if steps else 0}


def main() -> None:
    reply = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # vLLM's prints and logs go to stderr
    llm = None
    for line in sys.stdin:
        if not line.strip():
            continue
        req = json.loads(line)
        try:
            if req["op"] == "stop":
                break
            if req["op"] == "start":
                from vllm import LLM

                t0 = time.perf_counter()
                if llm is not None:
                    raise RuntimeError("one engine per worker process (vLLM cannot start a second in one)")
                llm = LLM(**req["engine"])
                answer = {"seconds": time.perf_counter() - t0}
            elif req["op"] == "generate":
                from vllm.inputs import TokensPrompt

                if llm is None:
                    raise RuntimeError("generate before start")
                prompts = req["prompts"]
                want = bool(req.get("logprobs"))
                t0 = time.perf_counter()
                budgets = req.get("max_new_tokens_each") or [None] * len(prompts)
                results = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts],
                                       [sampling(req["params"], p, want, n) for p, n in zip(prompts, budgets)],
                                       use_tqdm=False)
                answer = {"outputs": [outputs(r, want) for r in results], "seconds": time.perf_counter() - t0,
                          "counters": counters(llm)}
            else:
                raise ValueError(f"unknown op {req['op']!r}")
            reply.write(json.dumps({"ok": True, **answer}) + "\n")
        except Exception as e:  # the parent raises it, with the worker's traceback in its log
            traceback.print_exc()
            reply.write(json.dumps({"ok": False, "error": f"{type(e).__name__}: {e}"}) + "\n")


if __name__ == "__main__":
    main()
