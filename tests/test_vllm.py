"""Ouro and MELT served by vLLM (melt_core/serving/vllm_models.py, CPU backend, the serving environment
.venv-vllm) against melt_core's own generation on the same checkpoints: the same greedy tokens, and
per-token log-probabilities within what float32 arithmetic in other kernels justifies.

One engine per checkpoint and module (a worker process each, started on first use). The tiny models
have head dim 32: vLLM's CPU attention takes 32, 64, 80, ... only. Their weights are drawn wide
(std 0.3), so next-token distributions are peaked but not degenerate: a wrong row in the cache
changes tokens within a few steps (the breaks in tests/breaks.py show it).
"""

import json
import os
from pathlib import Path

import pytest
import torch
from conftest import under_ci

from melt_core.generation.generate import SamplingParams, generate
from melt_core.modeling import checkpoint as ck
from melt_core.modeling.config import ModelConfig
from melt_core.modeling.model import LoopedLM
from melt_core.serving.vllm_engine import MELT_SCHEDULER, VllmEngine, engine_args, vllm_python

try:
    vllm_python()
except FileNotFoundError as e:
    if under_ci():
        raise
    pytest.skip(str(e), allow_module_level=True)

# float32 in both engines: the log-probabilities of one token differ by rounding in other kernels (vLLM's
# CPU attention, its fused RMSNorm) through 2 layers x 3 loops; seen <= 2e-5 here. 1e-3 is far above that
# and far below the gap a wrong cache row makes (> 0.1 at the first wrong step).
LOGPROB_ATOL = 1e-3
SHAPE = dict(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
             num_key_value_heads=2, total_ut_steps=3, max_position_embeddings=256)
MODELS = {  # name -> ModelConfig fields over SHAPE
    "ouro": dict(model_type="ouro"),
    "melt-elementwise": dict(model_type="melt", gate="elementwise"),
    "melt-scalar": dict(model_type="melt", gate="scalar"),
    "melt-mean": dict(model_type="melt", gate="mean"),
    "melt-ema": dict(model_type="melt", gate="ema"),
    "melt-last": dict(model_type="melt", gate="last"),
    "melt-h0-first": dict(model_type="melt", gate="elementwise", gate_h0="first"),
}
PROMPTS = [[1, 5, 9, 3, 7, 2, 8, 30, 41, 12, 3], [2, 4], [11, 12, 13, 14, 15, 16, 17], [40],
           [9, 8, 7, 6, 5, 4, 3, 2, 1]]
STOP = (0,)  # token 0 ends a completion, as EOS does; included in its tokens in both engines


def make_checkpoint(root: Path, name: str) -> Path:
    torch.manual_seed(sorted(MODELS).index(name))
    model = LoopedLM(ModelConfig(**SHAPE, **MODELS[name]))
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(std=0.3)
    return ck.save_pretrained(model, root / name)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("vllm-models")
    return {name: make_checkpoint(root, name) for name in MODELS}


@pytest.fixture(scope="module")
def engines(checkpoints):
    """name (or (name, prefill_chunk)) -> a started engine, each started once for the module."""
    started = {}

    def get(name, prefill_chunk=None):
        key = (name, prefill_chunk)
        if key not in started:
            started[key] = VllmEngine(checkpoints[name], dtype="float32", max_model_len=256, max_num_seqs=8,
                                      kv_cache_bytes=64 << 20, prefill_chunk=prefill_chunk)
        return started[key]

    yield get
    for engine in started.values():
        engine.close()


def native(checkpoint, prompts, params, prefill_chunk=None):
    model = ck.load_pretrained(checkpoint)
    return generate(model, prompts, params, prefill_chunk=prefill_chunk, batch_size=len(prompts))


def exact_logprobs(checkpoint, prompt, tokens) -> list[float]:
    """Log-probabilities of ``tokens`` after ``prompt``, teacher-forced through melt_core's exact forward
    (token by token for MELT, in parallel for Ouro)."""
    model = ck.load_pretrained(checkpoint)
    ids = torch.tensor([list(prompt) + list(tokens[:-1])])
    with torch.no_grad():
        logits = model(ids, chunk_size=1 if model.config.is_melt else None).logits[0]
    logp = torch.log_softmax(logits.float(), -1)[len(prompt) - 1:]
    return [float(logp[i, t]) for i, t in enumerate(tokens)]


@pytest.mark.parametrize("name", sorted(MODELS))
def test_greedy_tokens_equal_melt_core_batched_and_alone(name, checkpoints, engines):
    params = SamplingParams(max_new_tokens=24, greedy=True, stop_token_ids=STOP)
    want = [[c.token_ids for c in row] for row in native(checkpoints[name], PROMPTS, params)]
    batched = engines(name).generate(PROMPTS, params, logprobs=True)
    assert [[c.token_ids for c in row] for row in batched] == want
    alone = [engines(name).generate([p], params)[0] for p in PROMPTS[:2]]
    assert [[c.token_ids for c in row] for row in alone] == want[:2]
    for prompt, row in zip(PROMPTS, batched):
        ref = exact_logprobs(checkpoints[name], prompt, row[0].token_ids)
        assert row[0].logprobs == pytest.approx(ref, abs=LOGPROB_ATOL)


def test_melt_chunked_prefill_equals_melt_core_chunks(checkpoints, engines):
    """eval.prefill_chunk C: the prompt in chunks of C from its first token, as the native engine
    computes it, whatever vLLM schedules; and not what token-by-token prefill gives."""
    params = SamplingParams(max_new_tokens=16, greedy=True, stop_token_ids=STOP)
    chunked = [[c.token_ids for c in row] for row in native(checkpoints["melt-elementwise"], PROMPTS, params, 4)]
    got = [[c.token_ids for c in row] for row in engines("melt-elementwise", 4).generate(PROMPTS, params)]
    assert got == chunked
    exact = [[c.token_ids for c in row] for row in native(checkpoints["melt-elementwise"], PROMPTS, params)]
    assert chunked != exact  # the setting matters on these prompts, so the equality above says something


@pytest.mark.parametrize("name", ["ouro", "melt-elementwise"])
def test_sixteen_samples_of_one_prompt_score_as_melt_core(name, checkpoints, engines):
    """n = 16 samples sharing a prompt (the paper's AIME setting): every sample's tokens carry the
    log-probabilities melt_core's exact forward gives them; the samples differ, and repeat with the seed."""
    params = SamplingParams(max_new_tokens=12, temperature=1.0, top_p=1.0, n=16, seed=3, stop_token_ids=STOP)
    prompt = PROMPTS[0]
    samples = engines(name).generate([prompt, PROMPTS[2]], params, logprobs=True)[0]
    assert len(samples) == 16 and len({tuple(s.token_ids) for s in samples}) > 1
    for s in samples:
        assert s.logprobs == pytest.approx(exact_logprobs(checkpoints[name], prompt, s.token_ids), abs=LOGPROB_ATOL)
    again = engines(name).generate([prompt], params)[0]
    assert [s.token_ids for s in again] == [s.token_ids for s in samples]


def _random_prompts(count: int, lo: int, hi: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(1, 64, (int(torch.randint(lo, hi + 1, (1,), generator=g)),), generator=g).tolist()
            for _ in range(count)]


def _tokens(rows) -> list[list[list[int]]]:
    return [[c.token_ids for c in row] for row in rows]


def _engine(checkpoint, prefill_chunk=None, kv_cache_bytes=64 << 20, **kw):
    """A MELT engine with blocks of 32 tokens (the CPU backend's least), started for one test."""
    return VllmEngine(checkpoint, dtype="float32", max_model_len=256, max_num_seqs=16, kv_cache_bytes=kv_cache_bytes,
                      prefill_chunk=prefill_chunk, overrides={"block_size": 32}, **kw)


def test_prompts_of_several_chunks_batch_with_decode_steps_at_a_small_token_budget(checkpoints):
    """Prompts of 4-8 chunks of C = 8 beside short ones that start decoding at once, in engine steps of
    16 tokens: vLLM's scheduler interleaves prefill chunks with decode tokens, and every sequence gets
    the tokens the native engine gives with the same cut."""
    path = checkpoints["melt-elementwise"]
    prompts = _random_prompts(4, 33, 61, seed=1) + PROMPTS
    params = SamplingParams(max_new_tokens=16, greedy=True, stop_token_ids=STOP)
    want = _tokens(native(path, prompts, params, 8))
    with _engine(path, 8, max_num_batched_tokens=16) as engine:
        assert _tokens(engine.generate(prompts, params)) == want
    assert want != _tokens(native(path, prompts, params))  # the cut matters here: the equality says something


@pytest.mark.parametrize("chunk", [None, 4], ids=["token by token", "chunks of 4"])
def test_preempted_sequences_continue_as_if_never_preempted(chunk, checkpoints):
    """16 sequences of ~170 tokens in a KV pool of 24 blocks of 32 tokens: vLLM preempts them (and later
    recomputes prompt + generated tokens); each sequence's tokens are the native engine's, which never
    preempts."""
    path = checkpoints["melt-ema"]
    prompts = _random_prompts(16, 5, 14, seed=2)
    params = SamplingParams(max_new_tokens=160, greedy=True)
    want = _tokens(native(path, prompts, params, chunk))
    with _engine(path, chunk, kv_cache_bytes=24 * 32 * 1024) as engine:  # 1 KiB a token: 2 layers x K, V x 64 x 4 B
        got = _tokens(engine.generate(prompts, params))
        preempted = engine.counters["preemptions"]
    assert preempted > 0, "the pool held every sequence: nothing was preempted, so nothing was tested"
    assert got == want


def test_samples_share_their_prompt_and_other_cuts_do_not(checkpoints):
    """Prefix caching for MELT. n = 8 samples of a 40-token prompt computed token by token (every
    block edge is a chunk start) compute it once: each later sample hits its first block, 32 tokens, and every sample's
    tokens carry the exact forward's log-probabilities. With C = 4 (chunks from a prompt's first token,
    so every block edge is a chunk start), a prompt of the same length with a shared 40-token prefix
    reuses 32 tokens; one a token longer reuses none (its length is in its salt), nor does a follow-up
    prompt that holds an earlier prompt and its answer (whose rows were decoded one at a time); a
    repeated 42-token prompt reuses its first block; with C = 5 a repeated prompt reuses nothing (no
    chunk starts on its block edge); all generate as the native engine."""
    path = checkpoints["melt-elementwise"]
    prompt = _random_prompts(1, 40, 40, seed=3)[0]
    with _engine(path) as engine:
        samples = engine.generate([prompt], SamplingParams(max_new_tokens=8, temperature=1.0, n=8, seed=5),
                                  logprobs=True)[0]  # seeded, over 40 steps of prompt: vLLM's CPU generators
        assert engine.counters["prefix_cache_hits"] >= 7 * 32, engine.counters
    for s in samples:
        assert s.logprobs == pytest.approx(exact_logprobs(path, prompt, s.token_ids), abs=LOGPROB_ATOL)
    a = _random_prompts(1, 44, 44, seed=4)[0]
    same_cut, other_cut = a[:40] + [5, 6, 7, 8], a[:40] + [5, 6, 7, 8, 9]
    params = SamplingParams(max_new_tokens=12, greedy=True)
    with _engine(path, 4) as engine:
        answer = engine.generate([a], SamplingParams(max_new_tokens=20, greedy=True))[0][0].token_ids
        first = engine.counters["prefix_cache_hits"]
        # a follow-up holding the answer: its first 64 tokens are cached, the answer's computed token by token
        follow_up = a + answer + [5, 6, 7, 8]
        # a 42-token prompt twice: the second hits the first's block [0, 32), which ends where a chunk starts
        shorter = a[:42]
        asked = (same_cut, other_cut, follow_up, shorter, shorter)
        got = [engine.generate([p], params)[0] for p in asked]
        assert engine.counters["prefix_cache_hits"] - first == 2 * 32, engine.counters  # same_cut's, shorter's
    assert _tokens(got) == _tokens(native(path, list(asked), params, 4))
    with _engine(path, 5) as engine:  # C = 5: the block edge at 32 is no chunk start (30, 35): nothing to keep
        again = [engine.generate([a], params)[0] for _ in range(2)]
        assert engine.counters["prefix_cache_hits"] == 0, engine.counters
    assert _tokens(again) == _tokens(native(path, [a, a], params, 5))


def test_samples_wait_for_a_sibling_only_where_a_hit_can_be_kept():
    """shareable_tokens: the last chunk start on a block edge before a prompt's last token; where there is
    none, MeltScheduler lets the samples prefill side by side instead of one after another."""
    from melt_core.serving.chunk_cut import shareable_tokens

    cases = [(300, 500, 16), (256, 64, 128), (300, 1, 16), (260, 64, 128), (16, 1, 16), (132, 4, 32)]
    assert [shareable_tokens(*c) for c in cases] == [0, 128, 288, 256, 0, 128]


def test_melt_under_vllm_own_scheduler_is_refused(checkpoints):
    """vLLM's own scheduler would cut MELT prompts where its token budget ends: the model refuses it."""
    with pytest.raises(RuntimeError, match="needs vLLM's scheduler_cls"):
        VllmEngine(checkpoints["melt-elementwise"], dtype="float32", max_model_len=256, kv_cache_bytes=64 << 20,
                   overrides={"scheduler_cls": "vllm.v1.core.sched.scheduler.Scheduler"}, log=open(os.devnull, "w"))


def test_melt_window_is_refused_by_name(tmp_path):
    model = LoopedLM(ModelConfig(**SHAPE, model_type="melt", window=8))
    path = ck.save_pretrained(model, tmp_path / "melt-window")
    with pytest.raises(RuntimeError, match="sliding window"):
        VllmEngine(path, dtype="float32", max_model_len=256, kv_cache_bytes=64 << 20, log=open(os.devnull, "w"))


def test_engine_args_for_ouro_keep_vllm_defaults_and_melt_gets_its_scheduler(checkpoints):
    args = engine_args(checkpoints["ouro"], max_model_len=256, kv_cache_bytes=1 << 26)
    assert "enable_prefix_caching" not in args and "scheduler_cls" not in args and "hf_overrides" not in args
    assert args["trust_remote_code"] is False
    for name, arch in (("ouro", "OuroForCausalLM"), ("melt-mean", "MeltForCausalLM")):  # as the hub's name theirs
        assert json.loads((checkpoints[name] / "config.json").read_text())["architectures"] == [arch]
    melt = engine_args(checkpoints["melt-mean"], prefill_chunk=8, kv_cache_bytes=1 << 26)
    assert melt["scheduler_cls"] == MELT_SCHEDULER and melt["enable_chunked_prefill"] and melt["enable_prefix_caching"]
    assert melt["hf_overrides"] == {"melt_prefill_chunk": 8}
    with pytest.raises(ValueError, match="prefill_chunk must be >= 1"):
        engine_args(checkpoints["melt-mean"], prefill_chunk=0, kv_cache_bytes=1 << 26)
    with pytest.raises(ValueError, match="below one MELT chunk"):
        engine_args(checkpoints["melt-mean"], prefill_chunk=32, max_num_batched_tokens=16, kv_cache_bytes=1 << 26)


@pytest.fixture(scope="module")
def task_models(tmp_path_factory):
    """A tokenizer and test split of the embedded task, an Ouro teacher with head dim 32 on it, and its
    MELT conversion: checkpoint directories as the workflow writes them."""
    from melt_core.data import load_tokenizer, make_digit_sum_task
    from melt_core.modeling.checkpoint import convert_ouro_to_melt

    root = tmp_path_factory.mktemp("vllm-eval")
    paths = make_digit_sum_task(root / "data", digits=4, n_train=16, n_test=8, seed=0)
    tok = load_tokenizer(paths["tokenizer"])
    torch.manual_seed(0)
    model = LoopedLM(ModelConfig(**{**SHAPE, "vocab_size": len(tok)}, bos_token_id=1, eos_token_id=2, pad_token_id=0))
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(std=0.3)
    ouro = ck.save_pretrained(model, root / "ouro", write_extra=tok.save_pretrained)
    melt = convert_ouro_to_melt(ouro, root / "melt", gate="elementwise", gate_init_std=0.3, seed=0)
    return paths, {"ouro": ouro, "melt": melt}


@pytest.mark.parametrize("kind", ["ouro", "melt"])
def test_the_eval_route_through_vllm_scores_as_the_native_engine(kind, task_models, tmp_path):
    """eval.engine: vllm through lighteval's pipeline, as the workflow's eval jobs run it: the same
    completions and scores as the native engine (greedy), the engine recorded in the result."""
    from melt_core.evaluation.evaluate import TaskSpec
    from melt_core.evaluation.lighteval_adapter import evaluate_lighteval
    from melt_core.serving.inference import ModelSpec, start_engine

    paths, models = task_models
    task = TaskSpec(name="digit_sum", path=str(paths["test"]), greedy=True, samples=1, max_new_tokens=12)
    native_spec = ModelSpec(name=kind, path=str(models[kind]))
    want = evaluate_lighteval(native_spec, task, tmp_path / "native.json")
    spec = ModelSpec(name=kind, path=str(models[kind]), engine="vllm", vllm={"kv_cache_gb": 0.0625})
    with start_engine(spec, max_model_len=128, dtype="float32") as engine:
        got = evaluate_lighteval(spec, task, tmp_path / "vllm.json", model=engine)
    assert got["model"]["engine"] == "vllm" and want["model"]["engine"] == "native"
    assert [d["completions"] for d in got["details"]] == [d["completions"] for d in want["details"]]
    assert got["metrics"] == want["metrics"]
    assert {t for d in got["details"] for t in d["generated_tokens"]} != {0}


def test_the_dense_baseline_runs_as_vllm_own_qwen3(tmp_path):
    """A Qwen3 checkpoint in transformers' format whose config.json names no architecture (as
    workflow/rehearsal.py's and a bare save_pretrained write it) runs in vLLM's own Qwen3 and generates
    what melt_core's dense wrapper (transformers' forward) generates."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from melt_core.modeling.dense import DenseLM

    cfg = Qwen3Config(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=32, max_position_embeddings=256,
                      tie_word_embeddings=True)
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(std=0.3)
    model.save_pretrained(tmp_path / "qwen3")
    config = json.loads((tmp_path / "qwen3/config.json").read_text())
    config.pop("architectures")  # as a bare Qwen3Config.save_pretrained writes it
    (tmp_path / "qwen3/config.json").write_text(json.dumps(config))
    ck.write_checksums(tmp_path / "qwen3")
    params = SamplingParams(max_new_tokens=16, greedy=True, stop_token_ids=STOP)
    want = generate(DenseLM.from_pretrained(tmp_path / "qwen3"), PROMPTS, params, batch_size=len(PROMPTS))
    with VllmEngine(tmp_path / "qwen3", dtype="float32", max_model_len=256, max_num_seqs=8,
                    kv_cache_bytes=64 << 20) as engine:
        got = engine.generate(PROMPTS, params)
    assert [[c.token_ids for c in row] for row in got] == [[c.token_ids for c in row] for row in want]


def test_vllm_serve_answers_completions_as_the_native_engine(checkpoints, tmp_path):
    """`vllm serve` (vLLM's OpenAI-compatible server, the serving environment's own command) on a MELT
    checkpoint with the README's flags: a completions request gives the native engine's tokens."""
    import socket
    import subprocess
    import time
    import urllib.request

    path = checkpoints["melt-ema"]
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    cmd = [str(vllm_python().parent / "vllm"), "serve", str(path), "--dtype", "float32", "--port", str(port),
           "--scheduler-cls", MELT_SCHEDULER, "--enable-chunked-prefill", "--enable-prefix-caching",
           "--hf-overrides", json.dumps({"melt_prefill_chunk": 4}), "--kv-cache-memory-bytes", str(64 << 20),
           "--max-model-len", "256", "--block-size", "32", "--skip-tokenizer-init"]
    log = open(tmp_path / "serve.log", "w")
    env = {**os.environ, "VLLM_CPU_OMP_THREADS_BIND": "nobind"}
    server = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}/v1/completions"

    def ask(prompt):
        body = json.dumps({"model": str(path), "prompt": prompt, "max_tokens": 12, "temperature": 0, "ignore_eos": True,
                           "return_token_ids": True}).encode()
        request = urllib.request.Request(url, body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as answer:
            return json.load(answer)["choices"][0]["token_ids"]

    try:
        deadline = time.monotonic() + 240
        while True:
            assert server.poll() is None, (tmp_path / "serve.log").read_text()[-3000:]
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=5)
                break
            except OSError:
                assert time.monotonic() < deadline, "vllm serve did not start in 240 s"
                time.sleep(2)
        got = [ask(p) for p in PROMPTS]
    finally:
        server.terminate()
        server.wait(timeout=60)
    want = [row[0].token_ids for row in native(path, PROMPTS, SamplingParams(max_new_tokens=12, greedy=True), 4)]
    assert got == want
    assert len({t for row in want for t in row}) > 3  # varied tokens: the equality says something
