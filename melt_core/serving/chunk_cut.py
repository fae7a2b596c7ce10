"""Where MELT's prompt chunks start and end, as melt_core cuts them (chunks of C from the prompt's first
token, as training cuts a sequence; every later token alone), and how much of a prompt a prefix-cache
hit can keep. Pure arithmetic, with no vLLM import: vllm_scheduler schedules by it and the cost plan
(ops/plan.py) prices by it."""

from __future__ import annotations


def next_chunk_end(done: int, prompt_len: int, chunk: int) -> int:
    """Where the chunk that starts at ``done`` ends, for a prompt of ``prompt_len`` tokens cut in
    chunks of ``chunk`` from its first token, every later token alone. Raises if ``done`` is not
    where a chunk starts (a scheduling bug: the rows computed so far would be wrong)."""
    if done >= prompt_len:
        return done + 1
    if done % chunk:
        raise RuntimeError(f"MELT in vLLM: {done} tokens of a {prompt_len}-token prompt are computed, which is "
                           f"inside a chunk of {chunk} (chunks start at 0, {chunk}, {2 * chunk}, ...)")
    return min(done + chunk, prompt_len)  # the last chunk ends with the prompt


def is_chunk_start(pos: int, prompt_len: int, chunk: int) -> bool:
    return pos % chunk == 0 or pos >= prompt_len


def shareable_tokens(prompt_len: int, chunk: int, block: int) -> int:
    """The most of a prompt's rows a prefix hit can keep: its last chunk start on a block edge before
    its last token (vLLM computes at least one token of a prompt itself)."""
    edges = range((prompt_len - 1) // block * block, 0, -block)
    return next((n for n in edges if is_chunk_start(n, prompt_len, chunk)), 0)
