"""Serving a checkpoint with vLLM: the engine settings each model needs, in one place.

Torch- and vLLM-free at import (eval jobs and tests import it from .venv); vLLM runs only in
``VllmEngine``'s worker process, in the serving environment (envs/requirements-vllm-cpu.txt, or
envs/requirements-cuda.txt on GPU nodes). The models are melt_core's (melt_core/serving/vllm_models.py,
registered by melt_core/serving/vllm_plugin.py).

What differs by model (docs/CHOICES.md):

* MELT: vLLM's chunked prefill and prefix caching, scheduled by ``MELT_SCHEDULER``
  (melt_core/serving/vllm_scheduler.py), which gives each sequence one MELT chunk a step: the prompt in
  ``prefill_chunk`` chunks (token by token when unset) cut as the native engine cuts it, batched with
  other sequences' decode steps; n samples of a prompt share its cached blocks where the cut allows.
* Ouro and dense models: vLLM's defaults (parallel prefill is exact for them).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from ..modeling.config import ARCHITECTURES

PREFILL_CHUNK_KEY = "melt_prefill_chunk"  # melt_core.serving.vllm_scheduler reads it from the hf config
MELT_SCHEDULER = "melt_core.serving.vllm_scheduler.MeltScheduler"  # vLLM's scheduler_cls for MELT checkpoints


def model_type(checkpoint: str | Path) -> str:
    return json.loads((Path(checkpoint) / "config.json").read_text()).get("model_type", "")


def checkpoint_architectures(checkpoint: str | Path) -> list[str]:
    return json.loads((Path(checkpoint) / "config.json").read_text()).get("architectures") or []


def engine_args(checkpoint: str | Path, *, kv_cache_bytes: int, prefill_chunk: int | None = None,
                dtype: str = "auto", max_model_len: int | None = None, max_num_seqs: int = 128,
                max_num_batched_tokens: int | None = None, seed: int = 0, cuda_graphs: bool = False,
                tokenizer: str | Path | None = None, overrides: dict | None = None) -> dict:
    """Keyword arguments of ``vllm.LLM`` for one checkpoint directory. ``kv_cache_bytes``: the KV
    memory to give vLLM (set always: left to itself, vLLM's CPU backend takes 92% of the machine's
    memory, and its GPU backend sizes by a share of the device, not by the plan); ``cuda_graphs``: capture decode
    steps (GPU only; the CPU backend runs eagerly); ``overrides``: vLLM keywords set last, over what
    this function decided (tests use it to force what the defaults prevent); ``max_num_batched_tokens``:
    the tokens of one engine step (vLLM's default when None; for MELT at least one chunk)."""
    checkpoint = Path(checkpoint)
    kind = model_type(checkpoint)
    has_tokenizer = tokenizer is not None or any((checkpoint / f).is_file() for f in
                                                  ("tokenizer.json", "tokenizer_config.json"))
    # runner "generate": a config.json naming no architecture (a bare transformers save) is not taken for a
    # pooling model
    args = dict(model=str(checkpoint), runner="generate", tokenizer=str(tokenizer or checkpoint),
                skip_tokenizer_init=not has_tokenizer,
                dtype=dtype, seed=seed, max_num_seqs=max_num_seqs, trust_remote_code=False,
                enforce_eager=not cuda_graphs, disable_log_stats=False)  # stats: preemptions, prefix-cache hits
    if cuda_graphs:  # whole decode steps captured (Ouro/MELT have no torch.compile regions to split at)
        args["compilation_config"] = {"cudagraph_mode": "FULL_DECODE_ONLY"}
    if max_model_len is not None:
        args["max_model_len"] = max_model_len
    if max_num_batched_tokens is not None:
        args["max_num_batched_tokens"] = max_num_batched_tokens
    args["kv_cache_memory_bytes"] = int(kv_cache_bytes)
    if kind in ARCHITECTURES and not checkpoint_architectures(checkpoint):  # saved before config.json named it
        args["hf_overrides"] = {"architectures": [ARCHITECTURES[kind]]}
    if kind == "melt":
        if prefill_chunk is not None and prefill_chunk < 1:
            raise ValueError(f"prefill_chunk must be >= 1 or None (token by token), got {prefill_chunk}")
        if max_num_batched_tokens is not None and max_num_batched_tokens < (prefill_chunk or 1):
            raise ValueError(f"max_num_batched_tokens={max_num_batched_tokens} is below one MELT chunk "
                             f"(prefill_chunk={prefill_chunk}): no prompt could ever be scheduled")
        args |= dict(enable_prefix_caching=True, enable_chunked_prefill=True, scheduler_cls=MELT_SCHEDULER,
                     hf_overrides={**args.get("hf_overrides", {}), PREFILL_CHUNK_KEY: prefill_chunk})
    elif prefill_chunk is not None:
        raise ValueError(f"{checkpoint}: prefill_chunk is MELT's setting; this checkpoint is {kind!r}")
    return args | (overrides or {})




def vllm_python() -> Path:
    """The serving environment's interpreter: $MELT_VLLM_PYTHON, else .venv-vllm beside this checkout."""
    path = Path(os.environ.get("MELT_VLLM_PYTHON") or Path(__file__).resolve().parents[2] / ".venv-vllm/bin/python")
    if not path.is_file():
        raise FileNotFoundError(f"no vLLM environment at {path}: run `bash envs/setup.sh` (it builds .venv-vllm), "
                                "or set MELT_VLLM_PYTHON to a python with vllm and melt_core installed")
    return path


class VllmEngine:
    """A vLLM engine serving one checkpoint, in a process of the serving environment (melt_core.serving.vllm_worker),
    started once; ``generate`` takes and returns what melt_core.generation.generate.generate does. Use as a
    context manager, or ``close()``. ``log``: where the engine's output goes (default: this stderr)."""

    def __init__(self, checkpoint: str | Path, log=None, **engine_kwargs):
        from ..modeling.checkpoint import read_config  # torch: only where an engine is started

        self.engine = engine_args(checkpoint, **engine_kwargs)
        config = json.loads((Path(checkpoint) / "config.json").read_text())
        self.num_loops = int(config.get("total_ut_steps", 1))  # every token runs every loop here
        self.max_model_len = engine_kwargs.get("max_model_len") or config.get("max_position_embeddings")
        # the checkpoint's ModelConfig, as a loaded model carries it (its exit defaults); a dense one has none
        self.config = read_config(checkpoint) if model_type(checkpoint) in ARCHITECTURES else None
        # the engine in the worker's own process (one process to start, not two);
        # its threads not pinned to cores the caller may be using (a user's setting is kept)
        env = {"VLLM_CPU_OMP_THREADS_BIND": "nobind", **os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
               "TOKENIZERS_PARALLELISM": "false"}
        self.proc = subprocess.Popen([str(vllm_python()), "-m", "melt_core.serving.vllm_worker"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=log, text=True, env=env)
        self.start_seconds = self._ask({"op": "start", "engine": self.engine})["seconds"]

    def _ask(self, request: dict) -> dict:
        if self.proc.poll() is not None:
            raise RuntimeError(f"the vLLM worker has exited (code {self.proc.returncode}); its log has why")
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait()
            raise RuntimeError(f"the vLLM worker died (code {self.proc.returncode}) during {request['op']!r}; "
                               "its log has why")
        answer = json.loads(line)
        if not answer.pop("ok"):
            raise RuntimeError(f"vLLM worker ({self.engine['model']}): {answer['error']}")
        return answer

    def generate(self, prompts, params, logprobs: bool = False, max_new_tokens_each: list[int] | None = None
                 ) -> list[list]:
        """Completions of each prompt (``params``: melt_core.generation.generate.SamplingParams), as generate() returns
        them; with ``logprobs`` each Completion also carries ``logprobs`` (of its tokens);
        ``max_new_tokens_each``: a new-token budget per prompt over the params' (benchmarks fix lengths so)."""
        from ..generation.generate import Completion

        fields = dict(max_new_tokens=params.max_new_tokens, temperature=params.temperature, top_p=params.top_p,
                      n=params.n, greedy=params.greedy, stop_token_ids=list(params.stop_token_ids),
                      stop_strings=list(params.stop_strings), seed=params.seed)
        answer = self._ask({"op": "generate", "prompts": [list(map(int, p)) for p in prompts], "params": fields,
                            "logprobs": logprobs, "max_new_tokens_each": max_new_tokens_each})
        self.last_seconds, self.counters = answer["seconds"], answer["counters"]
        out = []
        for samples in answer["outputs"]:
            row = []
            for s in samples:
                row.append(Completion(s["token_ids"], s["finish_reason"], s["text"], logprobs=s.get("logprobs")))
            out.append(row)
        return out

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write(json.dumps({"op": "stop"}) + "\n")
                self.proc.stdin.close()
                self.proc.wait(timeout=60)
            except (BrokenPipeError, subprocess.TimeoutExpired):
                self.proc.kill()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
