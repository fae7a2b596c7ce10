"""Breaks tried on purpose: each entry changes one line of the code the way a plausible bug would
and names the tests that must fail on it (the brief's rule: a check that cannot fail is a defect).

    python tests/breaks.py            # every break, ~15 min on 2 cores
    python tests/breaks.py gate kd    # the breaks whose name contains one of these words

Each break is applied in a scratch copy of the tree (the working tree is never touched), its tests
run there with pytest -x, and a line says which test caught it. Exit status 1 when a break passes
all its tests. tests/test_breaks.py keeps the list true to the code: every break's line must occur
exactly once where it says, so a change that moves such a line must move its break too."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COPIED = ("melt_core", "workflow", "benchmarks", "tests", "config", "pyproject.toml", "Snakefile")


@dataclass(frozen=True)
class Break:
    name: str
    path: str  # relative to the repository root
    old: str  # occurs exactly once in the file
    new: str
    tests: tuple[str, ...]  # pytest node ids or files that must fail


EQ = "tests/test_melt_equivalences.py"
TRAIN = "tests/test_train.py"
FIRST_STEP = f"{TRAIN}::test_logged_losses_are_the_definitions_at_the_first_step"
LOSSES = "tests/test_losses.py"
CLAIMS = "tests/test_claims.py"
CODE = "tests/test_code_scoring.py"
SANDBOX = "tests/test_sandbox.py"
JUDGED = f"{CODE}::test_humanevalplus_judges_values_the_benchmarks_way"
LAST_BLOCK = f"{CODE}::test_the_answer_is_the_last_code_block_after_the_thinking"
DIGESTS = f"{CODE}::test_large_outputs_travel_as_digests_and_still_tell_right_from_wrong"
REPORT = "tests/test_report.py"
PROFILE = "tests/test_profiler_download.py"
LENGTHS = "tests/test_figures.py::test_accuracy_vs_length_shows_where_each_model_loses_the_thread"
TEACHER_LOSS = "tests/test_pretrain.py::test_the_loss_averages_the_loops_and_the_learning_rate_warms_up_then_decays"
ACC_CLAIMS = f"{CLAIMS}::test_accuracy_claims_hold_where_the_results_say_so_and_fail_where_they_say_the_opposite"

BREAKS = [
    # the method: gates, RoPE, norms, the cache, Phase-1 mixing, chunking
    Break("gate: z and 1 - z swapped", "melt_core/gate.py", "torch.lerp(a, h_prev, z.to(a.dtype))",
          "torch.lerp(h_prev, a, z.to(a.dtype))", (EQ,)),
    Break("gate: mean over loop + 2", "melt_core/gate.py", "(a - h_prev) / (loop + 1)", "(a - h_prev) / (loop + 2)",
          (EQ,)),
    Break("gate: loop-1 gate keeps z of a", "melt_core/gate.py",
          "return (1 - torch.sigmoid(self.input_proj(a))) * a", "return torch.sigmoid(self.input_proj(a)) * a", (EQ,)),
    Break("gate: EMA's first loop", "melt_core/gate.py", "return (1 - self.ema_z) * a", "return self.ema_z * a", (EQ,)),
    Break("gate: init bias ignored", "melt_core/gate.py", "            self.input_proj.bias.fill_(bias)\n",
          "            self.input_proj.bias.fill_(0.0)\n", ("tests/test_checkpoint.py",)),
    Break("gate: init std ignored", "melt_core/gate.py",
          "w = torch.randn(lin.weight.shape, generator=generator, dtype=torch.float32) * std",
          "w = torch.randn(lin.weight.shape, generator=generator, dtype=torch.float32) * 0.02",
          ("tests/test_checkpoint.py",)),
    Break("rope: rotation sign", "melt_core/model.py", "torch.cat((-x2, x1), dim=-1)", "torch.cat((x2, -x1), dim=-1)",
          (EQ,)),
    Break("model: no sandwich norm", "melt_core/model.py", "x = x + self.input_layernorm_2(o)", "x = x + o", (EQ,)),
    Break("model: RMSNorm eps x100", "melt_core/model.py", ".mean(-1, keepdim=True) + self.eps)",
          ".mean(-1, keepdim=True) + 100 * self.eps)", ("tests/test_ouro_reference.py",)),
    Break("model: exit distribution", "melt_core/model.py", "remaining = remaining * (1 - lam[t])",
          "remaining = remaining * lam[t]", ("tests/test_ouro_reference.py",)),
    Break("model: chunks not aligned to the end", "melt_core/model.py",
          "sl = slice(start, min(start + (first if start == 0 else chunk_size), L))",
          "sl = slice(start, min(start + chunk_size, L))", ("tests/test_generate.py",)),
    Break("cache: loop-1 rows committed", "melt_core/cache.py",
          "        if loop == self.T - 1:\n            self.final[layer].append(keep(cur), self.rows)",
          "        if loop == 0:\n            self.final[layer].append(keep(cur), self.rows)", (EQ,)),
    Break("cache: Phase-1 mixing with alpha^2", "melt_core/cache.py",
          "return tuple(alpha * m + (1 - alpha) * o for m, o in zip(melt, ouro))",
          "return tuple(alpha * alpha * m + (1 - alpha * alpha) * o for m, o in zip(melt, ouro))", (EQ,)),
    Break("cache: window rows left unmixed", "melt_core/cache.py",
          "return tuple(alpha * m + (1 - alpha) * o[..., slots, :] for m, o in zip(melt, ouro))",
          "return tuple(m for m, o in zip(melt, ouro))", (EQ,)),
    Break("config: MELT's KV bytes doubled", "melt_core/config.py",
          "return per_row if self.is_melt else per_row * self.total_ut_steps",
          "return per_row * 2 if self.is_melt else per_row * self.total_ut_steps", ("tests/test_cache_memory.py",)),
    Break("config: window rows one loop short", "melt_core/config.py",
          "rows += min(self.window, num_tokens) * self.total_ut_steps",
          "rows += min(self.window, num_tokens) * (self.total_ut_steps - 1)", ("tests/test_cache_memory.py",)),
    Break("profiler: max batch ignores the weights", "melt_core/profiler.py",
          "max_batch = int((cap_gb * GB - w_analytic) // cfg.kv_bytes(context, nbytes))",
          "max_batch = int((cap_gb * GB) // cfg.kv_bytes(context, nbytes))", ("tests/test_profiler_download.py",)),
    # training
    Break("kd: final loop only", "melt_core/losses.py", "return (kl.mean(0) * mask).sum() * temperature**2",
          "return (kl[-1] * mask).sum() * temperature**2", (LOSSES,)),
    Break("kd: temperature not squared", "melt_core/losses.py", "* temperature**2", "* temperature", (LOSSES,)),
    Break("alignment: summed over pairs", "melt_core/losses.py", "return total / len(student_outs)", "return total",
          (LOSSES,)),
    Break("train: KD over positions", "melt_core/train.py", "kd_part = kd / n_tokens", "kd_part = kd / n_positions",
          (FIRST_STEP,)),
    Break("train: beta dropped", "melt_core/train.py", "align_part = phase.align_beta * align / n_positions",
          "align_part = align / n_positions", (FIRST_STEP,)),
    Break("train: KD arguments swapped", "melt_core/train.py",
          "kd = kd_loss_sum(s_out.per_loop_logits, t_out.per_loop_logits,",
          "kd = kd_loss_sum(t_out.per_loop_logits, s_out.per_loop_logits,", (FIRST_STEP,)),
    Break("train: warmup a step late", "melt_core/train.py", "return min(1.0, (step + 1) / warmup) if warmup else 1.0",
          "return min(1.0, (step + 2) / warmup) if warmup else 1.0",
          (f"{TRAIN}::test_mlflow_gets_each_learning_rate_and_the_step_as_its_axis",)),
    Break("train: gradient clipping dropped", "melt_core/train.py",
          'torch.nn.utils.clip_grad_norm_(student.parameters(), cfg.grad_clip or float("inf"))',
          'torch.nn.utils.clip_grad_norm_(student.parameters(), float("inf"))',
          (f"{TRAIN}::test_gradient_clipping_reaches_the_update",)),
    Break("train: alpha rises as frac^2", "melt_core/train_config.py",
          "return self.alpha_start + (self.alpha_end - self.alpha_start) * frac",
          "return self.alpha_start + (self.alpha_end - self.alpha_start) * frac * frac",
          (f"{TRAIN}::test_alpha_zero_starts_at_the_teacher_and_losses_fall",)),
    Break("teacher cache: key without the teacher", "melt_core/teacher_cache.py",
          'key = {"teacher": data_digest(cfg.teacher), "data": data,', 'key = {"data": data,',
          (f"{TRAIN}::test_shared_teacher_logits_train_bitwise_the_same",)),
    Break("teacher cache: key without the seed", "melt_core/teacher_cache.py", '"seed": cfg.seed, "batch_size"',
          '"batch_size"', (f"{TRAIN}::test_shared_teacher_logits_train_bitwise_the_same",)),
    Break("teacher cache: Phase 2 reads a file", "melt_core/teacher_cache.py",
          "if shared is not None and not need_align and shared.is_file():",
          "if shared is not None and shared.is_file():",
          (f"{TRAIN}::test_shared_teacher_logits_train_bitwise_the_same",)),
    Break("data: rows do not overlap", "melt_core/data.py",
          "ids, mask = (t.unfold(0, seq_len + 1, seq_len).contiguous() for t in (ids, mask))",
          "ids, mask = (t.unfold(0, seq_len + 1, seq_len + 1).contiguous() for t in (ids, mask))",
          ("tests/test_data.py",)),
    Break("data: loss mask on inputs", "melt_core/data.py", "        mask = mask[:, 1:]\n",
          "        mask = mask[:, :-1]\n", ("tests/test_data.py",)),
    Break("data: one order for every epoch", "melt_core/data.py", "order = self._order(step * batch_size // len(self))",
          "order = self._order(0)", ("tests/test_data.py",)),
    Break("exit gate: gain sign", "melt_core/early_exit.py", "gain = (ce[:-1] - ce[1:]).clamp(min=0)",
          "gain = (ce[1:] - ce[:-1]).clamp(min=0)", ("tests/test_early_exit.py",)),
    Break("exit gate: target inverted", "melt_core/early_exit.py",
          'bce = F.binary_cross_entropy_with_logits(exit_logits[:-1].float(), 1 - go_on, reduction="none")',
          'bce = F.binary_cross_entropy_with_logits(exit_logits[:-1].float(), go_on, reduction="none")',
          ("tests/test_early_exit.py",)),
    Break("exit rule: stops later than q", "melt_core/early_exit.py", "return cdf >= self.q if self.q < 1.0 else stop",
          "return cdf > self.q + 0.05 if self.q < 1.0 else stop", ("tests/test_early_exit.py",)),
    # generation and scoring
    Break("sampling: temperature ignored", "melt_core/generate.py",
          "probs = torch.softmax(logits.float() / params.temperature, dim=-1)",
          "probs = torch.softmax(logits.float(), dim=-1)", ("tests/test_generate.py",)),
    Break("sampling: nucleus one token too wide", "melt_core/generate.py",
          "outside = sorted_p.cumsum(-1) - sorted_p > params.top_p", "outside = sorted_p.cumsum(-1) > params.top_p",
          ("tests/test_generate.py",)),
    Break("sampling: one generator for all rows", "melt_core/generate.py",
          "for i, g in enumerate(generators)]).squeeze(-1)",
          "for i, g in enumerate([generators[0]] * len(generators))]).squeeze(-1)", ("tests/test_generate.py",)),
    Break("score: gold anywhere in the completion", "melt_core/lighteval_tasks.py",
          "return float(extract_answer(model_response.text[0], self.style) == gold)",
          "return float(gold in extract_answer(model_response.text[0], self.style))", ("tests/test_evaluate.py",)),
    Break("score: first boxed answer", "melt_core/lighteval_tasks.py", '    start = text.rfind("\\\\boxed{")',
          '    start = text.find("\\\\boxed{")', ("tests/test_benchmark_rows.py",)),
    Break("score: answers inside the thinking", "melt_core/lighteval_tasks.py",
          '    text = text.split("</think>")[-1]\n', "    text = text\n", ("tests/test_benchmark_rows.py",)),
    Break("score: pass@k from one sample", "melt_core/lighteval_tasks.py",
          "for p in model_response.final_text[: self.n]])", "for p in model_response.final_text[:1]] * self.n)",
          ("tests/test_lighteval_suite.py",)),
    Break("score: cached per question, not per sample", "melt_core/lighteval_tasks.py",
          "key = (doc.query, tuple(doc.choices), model_response.text[0])", "key = (doc.query, tuple(doc.choices))",
          ("tests/test_benchmark_rows.py",)),
    Break("metrics: pass@k estimator", "melt_core/metrics.py", "return 1.0 - math.comb(n - c, k) / math.comb(n, k)",
          "return 1.0 - math.comb(n - c, k) / math.comb(n + 1, k)", ("tests/test_evaluate.py",)),
    Break("eval: best question, not the mean", "melt_core/evaluate.py",
          'return {f"pass@{k}": float(np.mean([d["scores"][f"pass@{k}"] for d in details])) for k in ks}',
          'return {f"pass@{k}": float(np.max([d["scores"][f"pass@{k}"] for d in details])) for k in ks}',
          ("tests/test_lighteval_suite.py",)),
    # verdicts and claims
    Break("verdict: a tie at 0 wins", "workflow/scripts/verdicts.py",
          "return (HOLDS if lo > 0 else FAILS if hi < 0 else INCONCLUSIVE), fmt(mean, lo, hi)",
          "return (HOLDS if lo >= 0 else FAILS if hi < 0 else INCONCLUSIVE), fmt(mean, lo, hi)",
          ("tests/test_verdicts.py",)),
    Break("verdict: 'near' on the lower end", "workflow/scripts/verdicts.py",
          "return (HOLDS if hi <= margin else FAILS if lo > margin else INCONCLUSIVE)",
          "return (HOLDS if lo <= margin else FAILS if lo > margin else INCONCLUSIVE)", ("tests/test_verdicts.py",)),
    Break("verdict: no floor for the teacher", "workflow/scripts/verdicts.py",
          "if float(np.mean(reference)) < floor:", "if float(np.mean(reference)) < 0:", ("tests/test_verdicts.py",)),
    Break("verdict: seeds drawn apart", "workflow/scripts/verdicts.py", "sb = sa if b.shape[0] == a.shape[0] else",
          "sb = rng.integers(0, b.shape[0], size=(BOOTSTRAP, b.shape[0])) if True else", ("tests/test_verdicts.py",)),
    Break("verdict: one failing part is enough to hold", "workflow/scripts/verdicts.py",
          "if any(v == FAILS for v in verdicts):\n        return FAILS",
          "if all(v == FAILS for v in verdicts):\n        return FAILS", ("tests/test_verdicts.py",)),
    Break("claims: KV ratio within 1 of T", "workflow/scripts/claims.py",
          "HOLDS if abs(ratio - T) < 1e-9 else FAILS))", "HOLDS if abs(ratio - T) < 1 else FAILS))", (CLAIMS,)),
    Break("claims: Ouro's growth not checked", "workflow/scripts/claims.py", "HOLDS if flat and linear else FAILS))",
          "HOLDS if flat else FAILS))", (CLAIMS,)),
    Break("claims: near Ouro within 50", "workflow/scripts/claims.py",
          "verdict, ci = near(q(r.main_model), ouro, 5.0, ouro)",
          "verdict, ci = near(q(r.main_model), ouro, 50.0, ouro)", (ACC_CLAIMS,)),
    Break("claims: sharing read backwards", "workflow/scripts/claims.py",
          'parts = {v: beats(qs("ouro"), qs(r.sharing_model(v)), qs("ouro"))',
          'parts = {v: beats(qs(r.sharing_model(v)), qs("ouro"), qs("ouro"))', (ACC_CLAIMS,)),
    Break("claims: gates read backwards", "workflow/scripts/claims.py",
          'parts = {g: beats(q(r.run_model("elementwise", recipe)), q(r.run_model(g, recipe)), ouro) for g in others}',
          'parts = {g: beats(q(r.run_model(g, recipe)), q(r.run_model("elementwise", recipe)), ouro) for g in others}',
          (ACC_CLAIMS,)),
    Break("claims: recipe steps read backwards", "workflow/scripts/claims.py",
          "parts = {(a, b): beats(q(r.run_model(gate, a)), q(r.run_model(gate, b)), ouro)",
          "parts = {(a, b): beats(q(r.run_model(gate, b)), q(r.run_model(gate, a)), ouro)", (ACC_CLAIMS,)),
    Break("claims: chunking read backwards", "workflow/scripts/claims.py",
          "verdict, ci = beats(before, after, ouro)", "verdict, ci = beats(after, before, ouro)", (ACC_CLAIMS,)),
    Break("claims: prefill read backwards", "workflow/scripts/claims.py",
          "verdict, ci = near(q(chunked), q(exact), 5.0, q(exact))",
          "verdict, ci = near(q(exact), q(chunked), 5.0, q(exact))", (ACC_CLAIMS,)),
    Break("claims: window read backwards", "workflow/scripts/claims.py",
          'verdict, ci = near(qs(variant), qs(r.main_model), 5.0, qs("ouro"))',
          'verdict, ci = near(qs(r.main_model), qs(variant), 5.0, qs("ouro"))', (ACC_CLAIMS,)),
    Break("claims: early exit without Bonferroni", "workflow/scripts/claims.py", "    level = 1 - 0.05 / tries\n",
          "    level = 0.95\n", (CLAIMS,)),
    Break("claims: early exit past the loop budget", "workflow/scripts/claims.py",
          "for row in g[g.loop_fraction <= EXIT_BUDGET].itertuples():", "for row in g.itertuples():", (CLAIMS,)),
    Break("claims: decode speed from one round", "workflow/scripts/claims.py",
          "verdict = (HOLDS if max(ratios) < 1 else", "verdict = (HOLDS if min(ratios) < 1 else", (CLAIMS,)),
    Break("claims: train speed from one round", "workflow/scripts/claims.py",
          "    if all(lo <= x <= hi for x in rounds):\n", "    if any(lo <= x <= hi for x in rounds):\n", (CLAIMS,)),
    Break("cross machine: one-sided verdicts counted", "benchmarks/cross_machine.py",
          "(flips if all(decided) else one_sided).append(claim)",
          "(flips if any(decided) else one_sided).append(claim)", ("tests/test_cross_machine.py",)),
    Break("cross machine: a bracketed reason hides a flip", "benchmarks/cross_machine.py",
          'decided = [v.split(" (")[0] in DECIDED for v in (va, vb)]', "decided = [v in DECIDED for v in (va, vb)]",
          ("tests/test_cross_machine.py",)),
    Break("config: a trained checkpoint's phases unknown", "melt_core/config.py",
          '"pretrain_report", "phases"}', '"pretrain_report"}',
          (f"{TRAIN}::test_phase_by_phase_equals_one_run",)),
    # round 3: prompts, generation's ends, the report's aggregation
    Break("data: the eval prompt opens no thinking", "melt_core/data.py",
          'return text + "<|im_start|>assistant\\n<think>\\n"', 'return text + "<|im_start|>assistant\\n"',
          ("tests/test_data.py::test_the_eval_prompt_is_the_training_text_up_to_the_answer",)),
    Break("data: the plain prompt without BOS", "melt_core/data.py",
          "return tokenizer.bos_token + user[-1][\"content\"]",
          "return user[-1][\"content\"]",
          ("tests/test_data.py::test_the_eval_prompt_is_the_training_text_up_to_the_answer",)),
    Break("generate: the stop string kept in the text", "melt_core/generate.py",
          'self.reason, self.text = "stop", text[:cut]', 'self.reason, self.text = "stop", text',
          ("tests/test_generate.py",)),
    Break("generate: one token past the budget", "melt_core/generate.py",
          "len(self.tokens) == params.max_new_tokens:", "len(self.tokens) == params.max_new_tokens + 1:",
          ("tests/test_generate.py",)),
    Break("generate: the stop string's first token kept", "melt_core/generate.py", "    return tokens[:lo]\n",
          "    return tokens[:lo + 1]\n", ("tests/test_generate.py::test_stop_token_and_stop_string",)),
    Break("report: a model's score from its first seed", "workflow/scripts/report_common.py",
          "return float(hit.value.mean()) if hit is not None", "return float(hit.value.iloc[0]) if hit is not None",
          (f"{CLAIMS}::test_results_average_the_seeds_read_from_gathers_files",)),
    Break("verdict: a 90% interval called 95%", "workflow/scripts/verdicts.py", "tail = (1 - level) / 2 * 100",
          "tail = (1 - level) * 100", ("tests/test_verdicts.py::test_the_interval_has_the_width_its_level_says",)),
    Break("speed: decode tok/s of one row", "melt_core/profiler.py", '"decode_tok_s": batch / step,',
          '"decode_tok_s": 1 / step,', ("tests/test_compare_decode.py",)),
    Break("speed: names decode one shared cache", "melt_core/profiler.py",
          "cache = prefilled if i == len(names) - 1 and not reused else copy.deepcopy(prefilled)",
          "cache = prefilled", ("tests/test_compare_decode.py",)),
    Break("speed: train ratio rounds inverted", "melt_core/profiler.py",
          '"ratio_rounds": [o / t for o, t in zip(', '"ratio_rounds": [t / o for o, t in zip(',
          ("tests/test_compare_decode.py",)),
    # round 4: merging shards, loops per token, what a resume must agree on
    Break("merge: the last shard's questions dropped", "melt_core/evaluate.py",
          'details = [d for p in parts for d in p["details"]]',
          'details = [d for p in parts[:-1] for d in p["details"]]',
          ("tests/test_lighteval.py",)),
    Break("merge: a missing shard accepted", "melt_core/evaluate.py", "    if got != [(i, n) for i in range(n)]:",
          "    if False:", ("tests/test_lighteval.py", "tests/test_lighteval_suite.py", "tests/test_workflow.py")),
    Break("merge: shards of another model accepted", "melt_core/evaluate.py",
          'if p["model"] != first["model"] or {', 'if False and {',
          ("tests/test_lighteval.py::test_sharded_questions_merge_into_the_unsharded_result",)),
    Break("eval: loops per question, not per token", "melt_core/evaluate.py",
          '"mean_loops": loops / tokens if tokens else None,',
          '"mean_loops": loops / len(details) if tokens else None,',
          ("tests/test_lighteval.py", "tests/test_evaluate.py", "tests/test_early_exit.py")),
    Break("resume: another seed's checkpoint resumed", "melt_core/trainer_state.py",
          '"run_name", "keep_checkpoints", "device",', '"run_name", "seed", "keep_checkpoints", "device",',
          (f"{TRAIN}::test_a_resume_agrees_on_every_setting_but_paths_and_logging",)),
    # code scoring (HumanEval / HumanEval+), the sandbox
    Break("code: float results compared exactly", "melt_core/code_tasks.py",
          "    if atol == 0 and is_floats(exp):\n        atol = 1e-6\n    return atol != 0",
          "    return atol != 0", (JUDGED,)),
    Break("code: rtol 1e-3", "melt_core/code_tasks.py", "rtol: float = 1e-7) -> bool:", "rtol: float = 1e-3) -> bool:",
          (JUDGED,)),
    Break("code: bools equal ints", "melt_core/code_harness.py", 'out.append("T" if x else "F")',
          'out.append("i1" if x else "i0")', (JUDGED,)),
    Break("code: no input is ever asked", "melt_core/code_tasks.py",
          "plan.budgets = [max(MIN_CALL_S, TIME_FACTOR * t) for t in seconds]", "plan.budgets = []", (CODE,)),
    Break("code: a root anywhere within 1", "melt_core/code_tasks.py",
          "for i, c in enumerate(xs))) <= atol", "for i, c in enumerate(xs))) <= 1.0", (JUDGED,)),
    Break("code: the first python block", "melt_core/code_tasks.py", "code = blocks[-1] if blocks else answer",
          "code = blocks[0] if blocks else answer", (LAST_BLOCK,)),
    Break("code: code inside the thinking", "melt_core/code_tasks.py",
          'answer = completion.split("</think>")[-1]', "answer = completion", (LAST_BLOCK,)),
    Break("code: a judge without a verdict passes", "melt_core/code_tasks.py",
          "                    return False\n        return False",
          "                    return False\n        return True",
          (f"{CODE}::test_a_judge_that_ends_without_a_verdict_fails",)),
    Break("code: a large output's digest not compared", "melt_core/code_tasks.py",
          "            return digest(out) == expected.hex", "            return True", (DIGESTS,)),
    Break("sandbox: network shared", "melt_core/sandbox.py", '"--unshare-all", "--die-with-parent"',
          '"--unshare-user", "--unshare-pid", "--die-with-parent"', (SANDBOX,)),
    Break("sandbox: bwrap started with our environment", "melt_core/sandbox.py", "cwd=cwd, env=dict(BWRAP_ENV),",
          "cwd=cwd, env=None,", (f"{SANDBOX}::test_nothing_of_the_scorers_environment_is_readable_inside",)),
    Break("sandbox: address space unlimited", "melt_core/sandbox.py", "(resource.RLIMIT_AS, limits.memory_bytes)",
          "(resource.RLIMIT_AS, resource.RLIM_INFINITY)",
          (f"{SANDBOX}::test_one_process_is_capped_where_no_cgroup_can_be_made",)),
    Break("lighteval: the query alone as the message", "melt_core/lighteval_adapter.py",
          "or CHAT_PROMPTS.prepare_prompt_api(doc)",
          'or [{"role": "user", "content": doc.query}]',
          ("tests/test_lighteval.py::test_prompts_hold_the_messages_lightevals_own_chat_route_builds",)),
    # checkpoints, conversion, resuming
    Break("checkpoint: checksums not verified", "melt_core/checkpoint.py",
          "    verify_checksums(path)\n    state = read_state_dict(path)", "    state = read_state_dict(path)",
          ("tests/test_checkpoint.py",)),
    Break("checkpoint: a changed file's digest ignored", "melt_core/checkpoint.py", "        if got != digest:",
          "        if False:", ("tests/test_checkpoint.py",)),
    Break("convert: the gates' seed ignored", "melt_core/checkpoint.py", "gen = torch.Generator().manual_seed(seed)",
          "gen = torch.Generator().manual_seed(0)", ("tests/test_checkpoint.py",)),
    Break("convert: tokenizer not carried along", "melt_core/checkpoint.py",
          'SIDE_FILES = ("tokenizer.json", ', "SIDE_FILES = (", ("tests/test_checkpoint.py",)),
    Break("resume: optimizer state not restored", "melt_core/trainer_state.py",
          'if resume is not None or cfg.handoff == "continue":', 'if resume is None and cfg.handoff == "continue":',
          (TRAIN,)),
    Break("resume: RNG state not restored", "melt_core/trainer_state.py",
          '    torch.set_rng_state(state["torch_rng"])\n', "",
          (f"{TRAIN}::test_a_checkpoint_restores_the_random_streams_for_its_own_config_only",)),
    Break("resume: another config's checkpoint accepted", "melt_core/trainer_state.py",
          "    if saved != config_hash(_resume_key(cfg)):", "    if False:",
          (f"{TRAIN}::test_a_checkpoint_restores_the_random_streams_for_its_own_config_only",)),
    Break("resume: from the oldest checkpoint", "melt_core/trainer_state.py", "    last = complete[-1]",
          "    last = complete[0]", (TRAIN,)),
    Break("handoff: an unfinished phase accepted", "melt_core/trainer_state.py",
          'if saved.get("train_step") != sum(p["steps"] for p in done):', "if False:",
          (f"{TRAIN}::test_phase_by_phase_equals_one_run",)),
    Break("prune: the newest checkpoints removed", "melt_core/trainer_state.py",
          "for old in _checkpoints(out_dir)[:-keep]:", "for old in _checkpoints(out_dir)[keep:]:",
          (f"{TRAIN}::test_killed_run_resumes_bitwise",)),
    Break("download: every file of the repo taken", "melt_core/download.py", 'ALLOW = ["config.json", ',
          'ALLOW = ["*", "config.json", ',
          ("tests/test_profiler_download.py::test_fetch_takes_no_pickle_and_no_code",)),
    # the cache's masks and the sharing baselines
    Break("cache: window one token wider", "melt_core/cache.py", "(k < q - window) if window",
          "(k <= q - window) if window", (EQ, "tests/test_generate.py", "tests/test_cache_memory.py")),
    Break("cache: window rows one token wider", "melt_core/cache.py", "(slots[None, :] >= q - self.window.size)",
          "(slots[None, :] >= q - self.window.size - 1)", (EQ, "tests/test_generate.py", "tests/test_cache_memory.py")),
    Break("cache: padding keys readable", "melt_core/cache.py",
          "allowed = allowed & (kv_valid[:, None, None, :] | (k == q)[None, None])", "allowed = allowed",
          (EQ, "tests/test_generate.py")),
    Break("cache: a chunk attends to its future", "melt_core/cache.py", "(k <= q) if chunk_causal",
          "torch.ones_like(past) if chunk_causal", (EQ,)),
    Break("cache: first-loop sharing writes every loop", "melt_core/model.py",
          'write_every_loop=mode == "last-loop")', "write_every_loop=True)", (EQ, "tests/test_generate.py")),
    Break("cache: truncated BPTT not truncated", "melt_core/cache.py",
          "if self.detach_past else (lambda kv: kv)", "if False else (lambda kv: kv)",
          (f"{EQ}::test_truncated_bptt_cuts_exactly_the_gradient_into_earlier_chunks",)),

    # a fifth round (2026-12-03): the report (gather, tables), the teacher's objective, the sweep's scores
    Break("r5 gather: scores left as fractions", "workflow/scripts/gather.py", '"value": 100 * value,',
          '"value": value,', (REPORT,)),
    Break("r5 gather: speedup inverted", "workflow/scripts/gather.py",
          '"speedup": row["tokens_per_s"] / ref["tokens_per_s"] if ref else None',
          '"speedup": ref["tokens_per_s"] / row["tokens_per_s"] if ref else None', (REPORT,)),
    Break("r5 gather: curves of one phase only", "workflow/scripts/gather.py", 'for phase_dir in where["phases"]:',
          'for phase_dir in where["phases"][-1:]:', (REPORT,)),
    Break("r5 report: per-seed scores out of seed order", "workflow/scripts/report_common.py",
          'for v in hit.sort_values("seed").value]', 'for v in hit.sort_values("value").value]',
          (f"{CLAIMS}::test_results_average_the_seeds_read_from_gathers_files",)),
    Break("r5 report: interval printed hi, lo", "workflow/scripts/report_common.py",
          "[{self.lo:{spec or '.1f'}}, {self.hi:{spec or '.1f'}}]",
          "[{self.hi:{spec or '.1f'}}, {self.lo:{spec or '.1f'}}]", (REPORT,)),
    Break("r5 report: CSV interval columns swapped", "workflow/scripts/report_common.py",
          'out[f"{col} CI low"] = [v.lo if', 'out[f"{col} CI low"] = [v.hi if', (REPORT,)),
    Break("r5 report: answer length the shortest", "workflow/scripts/report_common.py",
          'return max((len(str(d["gold"])) for d in details), default=0)',
          'return min((len(str(d["gold"])) for d in details), default=0)', (LENGTHS,)),
    Break("r5 report: prefix match one character short", "workflow/scripts/report_common.py",
          'sum(c[:length] == d["gold"][:length] for c in d["completions"])',
          'sum(c[:length - 1] == d["gold"][:length - 1] for c in d["completions"])', (LENGTHS,)),
    Break("r5 table1: MELT column reads Ouro", "workflow/scripts/render_tables.py",
          '"MELT": r.estimate(r.main_model, bench)', '"MELT": r.estimate("ouro", bench)', (REPORT,)),
    Break("r5 table3: gates after the full recipe", "workflow/scripts/render_tables.py",
          '**bench_columns(r, r.run_model(gate, recipe), paper, benches)',
          '**bench_columns(r, r.run_model(gate, "full"), paper, benches)', (REPORT,)),
    Break("r5 table4: a recipe row reads the main run", "workflow/scripts/render_tables.py",
          '**bench_columns(r, r.run_model(gate, recipe), paper, ("AIME24", "MATH-500"))})',
          '**bench_columns(r, r.main_model, paper, ("AIME24", "MATH-500"))})', (REPORT,)),
    Break("r5 table5: sharing rows read plain Ouro", "workflow/scripts/render_tables.py",
          'ours = r.estimate(r.sharing_model(variant), "MATH-500")', 'ours = r.estimate("ouro", "MATH-500")',
          (REPORT,)),
    Break("r5 table10: decode ratio inverted", "workflow/scripts/render_tables.py",
          '[v / ouro.get((ouro_of[s], c), float("nan"))', '[ouro.get((ouro_of[s], c), float("nan")) / v', (REPORT,)),
    Break("r5 early exit table: loop share not in percent", "workflow/scripts/render_tables.py",
          '"loop share %": 100 * df.loop_fraction', '"loop share %": df.loop_fraction', (REPORT,)),
    Break("r5 teacher: loss not averaged over loops", "melt_core/pretrain.py",
          "loss = sum(per_loop) / (mask.sum() * len(per_loop))", "loss = sum(per_loop) / mask.sum()",
          (TEACHER_LOSS,)),
    Break("r5 teacher: no warm-up", "melt_core/pretrain.py",
          "lr = cfg.lr * min(1.0, (step + 1) / cfg.warmup_steps) * 0.5",
          "lr = cfg.lr * 0.5", (TEACHER_LOSS,)),
    Break("r5 teacher: best state not cloned", "melt_core/pretrain.py",
          "{k: v.clone() for k, v in model.state_dict().items()}", "dict(model.state_dict())",
          ("tests/test_pretrain.py",)),
    Break("r5 teacher: stops on its best split", "melt_core/pretrain.py",
          "if cfg.stop_at is not None and min(scores.values()) >= cfg.stop_at:",
          "if cfg.stop_at is not None and max(scores.values()) >= cfg.stop_at:", ("tests/test_pretrain.py",)),
    Break("r5 tracking: folder digest blind to file names", "melt_core/tracking.py",
          'h.update(str(f.relative_to(path)).encode() + b"\\0")', "pass",
          ("tests/test_tracking.py::test_a_folder_digest_follows_its_file_names_as_well_as_their_bytes",)),
    # a sixth round (2026-12-03): training data, the model an eval loads, sharding, memory planning
    Break("r6 data: packed rows do not overlap", "melt_core/data.py", "t.unfold(0, seq_len + 1, seq_len)",
          "t.unfold(0, seq_len + 1, seq_len + 1)", ("tests/test_data.py", TRAIN)),
    Break("r6 data: loss mask one token late", "melt_core/data.py", "        mask = mask[:, 1:]\n",
          "        mask = mask[:, :-1]\n", ("tests/test_data.py", TRAIN)),
    Break("r6 data: every epoch in one order", "melt_core/data.py", "random.Random(self.seed * 100_003 + epoch)",
          "random.Random(self.seed * 100_003)", ("tests/test_data.py", TRAIN)),
    Break("r6 data: ranks take interleaved rows", "melt_core/data.py", "mine = idx[rank * per:(rank + 1) * per]",
          "mine = idx[rank::world]", ("tests/test_data.py", TRAIN)),
    Break("r6 data: thinking prompt without <think>", "melt_core/data.py",
          'return text + "<|im_start|>assistant\\n<think>\\n"', 'return text + "<|im_start|>assistant\\n"',
          ("tests/test_data.py", "tests/test_evaluate.py")),
    Break("r6 data: end of turn not a stop token", "melt_core/data.py", "        ids.add(tid)\n",
          "        pass\n", ("tests/test_data.py::test_generation_stops_at_eos_and_at_a_chatml_end_of_turn",)),
    Break("r6 eval: model's exit over the task's", "melt_core/inference.py",
          "{**default, **(model_spec.exit or {}), **(task_exit or {})}",
          "{**default, **(task_exit or {}), **(model_spec.exit or {})}",
          ("tests/test_evaluate.py::test_exit_settings_layer_task_over_model_over_checkpoint",)),
    Break("r6 eval: window variant not applied", "melt_core/inference.py",
          "        model.config.window = spec.window  # read by", "        pass  # read by",
          ("tests/test_evaluate.py", "tests/test_lighteval.py")),
    Break("r6 eval: bf16 on the CPU", "melt_core/inference.py",
          "return torch.bfloat16 if device == \"cuda\" else torch.float32", "return torch.bfloat16",
          ("tests/test_evaluate.py", "tests/test_lighteval.py")),
    Break("r6 eval: every shard takes shard 0", "melt_core/inference.py", "% shard[1] == shard[0]",
          "% shard[1] == 0", ("tests/test_evaluate.py", "tests/test_lighteval.py")),
    Break("r6 plan: batch ignores the weights", "melt_core/generate.py", "fits = (budget_bytes - weights) // per_seq",
          "fits = budget_bytes // per_seq", ("tests/test_generate.py", "tests/test_cache_memory.py")),
    Break("r6 plan: cache for the prompt only", "melt_core/generate.py",
          "(cache_bytes_per_sequence(model, longest + params.max_new_tokens, cache_mode, keep_prompt)",
          "(cache_bytes_per_sequence(model, longest, cache_mode, keep_prompt)",
          ("tests/test_generate.py", "tests/test_cache_memory.py")),
    # a seventh round (2026-12-03): the memory profile
    Break("r7 profile: measured KV is the formula", "melt_core/profiler.py",
          "kv_measured, kv_analytic, kv_measured / kv_tokens / 1e6",
          "kv_measured, kv_analytic, kv_analytic / kv_tokens / 1e6",
          (f"{PROFILE}::test_the_measured_kv_figure_is_what_the_cache_holds",)),
    Break("r7 profile: cache filled for one loop", "melt_core/profiler.py",
          "        for t in range(cfg.total_ut_steps):\n",
          "        for t in range(1):\n", ("tests/test_cache_memory.py", PROFILE)),
    Break("r7 profile: total at the measured tokens", "melt_core/profiler.py",
          "total = (w_analytic + cfg.kv_bytes(context, nbytes)) / GB",
          "total = (w_analytic + cfg.kv_bytes(kv_tokens, nbytes)) / GB",
          (f"{PROFILE}::test_tied_weights_count_once_and_the_total_grows_with_the_context",)),
]


def run(brk: Break, scratch: Path) -> tuple[bool, str, float]:
    """(caught, the first failing test or the last summary line, seconds)."""
    target = scratch / brk.path
    source = target.read_text()
    target.write_text(source.replace(brk.old, brk.new, 1))
    t0 = time.perf_counter()
    try:
        r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *brk.tests],
                           cwd=scratch, capture_output=True, text=True, timeout=1200)
    finally:
        target.write_text(source)
    failed = [line.split(" - ")[0].removeprefix("FAILED ") for line in r.stdout.splitlines()
              if line.startswith(("FAILED", "ERROR"))]
    lines = [line for line in r.stdout.splitlines() if line.strip()]
    return r.returncode != 0, (failed[0] if failed else lines[-1] if lines else r.stderr[-200:]), \
        time.perf_counter() - t0


def main(words: list[str]) -> int:
    chosen = [b for b in BREAKS if not words or any(w.lower() in b.name.lower() for w in words)]
    with tempfile.TemporaryDirectory(prefix="melt-breaks-") as tmp:
        scratch = Path(tmp)
        for name in COPIED:
            src = ROOT / name
            if src.is_dir():
                shutil.copytree(src, scratch / name, ignore=shutil.ignore_patterns("__pycache__", ".pytest_cache"))
            else:
                shutil.copy2(src, scratch / name)
        survived = []
        for brk in chosen:
            caught, where, seconds = run(brk, scratch)
            print(f"{'caught ' if caught else 'PASSED '} {brk.name:50s} {seconds:5.1f}s  {where}", flush=True)
            if not caught:
                survived.append(brk.name)
    print(f"{len(chosen) - len(survived)} of {len(chosen)} breaks caught"
          + (f"; passed their tests: {survived}" if survived else ""))
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
