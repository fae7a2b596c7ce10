"""A slow, literal re-statement of the decoding semantics and of the training losses, written
without melt_core's cache, attention or loss code, for the equivalence tests to compare against.

One sequence, one token at a time, plain Python lists of K/V rows:

* ``ouro``: token i at loop t reads every token's loop-t row.
* ``melt``: token i reads earlier tokens' final rows (their row after loop T) or, inside a
  window W, their loop-t rows; and its own row as refined at the current loop.
* ``first-loop`` / ``last-loop`` (Appendix B): one row per token, written at loop 1 only or
  overwritten every loop; with ``prompt_len`` the first prompt_len tokens keep Ouro's
  per-loop rows (the "with prompt cache" variants).
"""

import math

import torch


def _rope(x, pos, theta):
    # x: (H, D); rotate pairs (x[j], x[j + D/2]) by pos * theta^(-2j/D), the frequencies computed in
    # float32 as Ouro's (and every HF Llama-style) code computes them: part of the model's definition
    D = x.shape[-1]
    half = D // 2
    freq = (1.0 / theta ** (torch.arange(0, D, 2, dtype=torch.float32) / D)).to(x.dtype)
    ang = pos * freq
    c, s = torch.cos(ang).to(x.dtype), torch.sin(ang).to(x.dtype)
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)


def _attention(q, keys, values):
    # q: (H, D); keys/values: lists of (H_kv, D)
    K = torch.stack(keys, 1)  # (H_kv, n, D)
    V = torch.stack(values, 1)
    group = q.shape[0] // K.shape[0]
    K, V = K.repeat_interleave(group, 0), V.repeat_interleave(group, 0)
    scores = (K @ q[:, :, None]).squeeze(-1) / math.sqrt(q.shape[-1])  # (H, n)
    return (torch.softmax(scores, -1)[:, None, :] @ V).squeeze(1)  # (H, D)


@torch.no_grad()
def naive_decode(model, ids, mode="melt", prompt_len=0, alpha=1.0):
    """Per-loop logits (T, L, V) for one sequence ``ids`` (L,). ``alpha`` < 1 (MELT, Phase 1): every
    row attention reads at loop t is alpha * (the MELT row it reads) + (1 - alpha) * (that token's
    own loop-t row projected from its normed hidden state, as Ouro would)."""
    cfg = model.config
    N, T, W = cfg.num_hidden_layers, cfg.total_ut_steps, cfg.window if mode == "melt" else 0
    H, Hkv, D = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    layers = model.model.layers
    loop_rows = [[[] for _ in range(T)] for _ in range(N)]  # [l][t][j] -> (k, v)
    ouro_rows = [[[] for _ in range(T)] for _ in range(N)]  # [l][t][j] -> (k, v) from a, for alpha < 1
    final_rows = [[] for _ in range(N)]  # [l][j] -> (k, v)
    out = []
    for i, tok in enumerate(ids.tolist()):
        x = model.model.embed_tokens.weight[tok]
        memory = [None] * N
        own = [None] * N
        shared = mode != "ouro" and i >= prompt_len
        logits_i = []
        for t in range(T):
            for l, layer in enumerate(layers):
                att = layer.self_attn
                a = layer.input_layernorm(x)
                q = _rope((att.q_proj.weight @ a).view(H, D), i, cfg.rope_theta)
                if mode == "melt":
                    memory[l] = layer.gate(a[None], None if memory[l] is None else memory[l][None], t)[0]
                    m = memory[l]
                else:
                    m = a
                row = (_rope((att.k_proj.weight @ m).view(Hkv, D), i, cfg.rope_theta),
                       (att.v_proj.weight @ m).view(Hkv, D))
                ouro_row = (_rope((att.k_proj.weight @ a).view(Hkv, D), i, cfg.rope_theta),
                            (att.v_proj.weight @ a).view(Hkv, D))
                if not (mode == "first-loop" and shared and t > 0):
                    own[l] = row
                keys, values = [], []
                for j in range(i + 1):
                    if j == i:
                        k, v = own[l]
                    elif not shared or j < prompt_len or (mode == "melt" and j >= i - W):
                        k, v = loop_rows[l][t][j]
                    else:
                        k, v = final_rows[l][j]
                    if alpha < 1.0:
                        k_o, v_o = ouro_row if j == i else ouro_rows[l][t][j]
                        k, v = alpha * k + (1 - alpha) * k_o, alpha * v + (1 - alpha) * v_o
                    keys.append(k)
                    values.append(v)
                o = _attention(q, keys, values).reshape(H * D)
                x = x + layer.input_layernorm_2(att.o_proj.weight @ o)
                x = x + layer.post_attention_layernorm_2(layer.mlp(layer.post_attention_layernorm(x)))
                loop_rows[l][t].append(row)
                ouro_rows[l][t].append(ouro_row)
            x = model.model.norm(x)
            logits_i.append(model.lm_head.weight @ x)
        for l in range(N):
            final_rows[l].append(own[l])
        out.append(torch.stack(logits_i))
    return torch.stack(out, 1)  # (T, L, V)


# ----------------------------------------------------------------------------- training losses
# docs/METHOD.md section 3, one token at a time in float64.

def _softmax64(logits):
    z = logits.double()
    e = torch.exp(z - z.max())
    return e / e.sum()


def naive_kd(student_logits, teacher_logits, mask, loops="all", temperature=1.0) -> float:
    """Sum over target tokens (weighted by ``mask``, (B, L)) of the mean over the distilled loops
    (all T, or the last one) of KL(teacher_t || student_t) = sum_v p(v) (log p(v) - log q(v)), p and q
    the softmaxes of teacher and student logits divided by the temperature, times temperature^2
    (the scale that keeps gradients comparable across temperatures). Logits: (T, B, L, V)."""
    T, B, L, _ = student_logits.shape
    distilled = range(T) if loops == "all" else [T - 1]
    total = 0.0
    for b in range(B):
        for i in range(L):
            kls = []
            for t in distilled:
                p = _softmax64(teacher_logits[t, b, i] / temperature)
                q = _softmax64(student_logits[t, b, i] / temperature)
                kls.append(float((p * (p.log() - q.log())).sum()))
            total += float(mask[b, i]) * sum(kls) / len(kls)
    return total * temperature**2


def naive_alignment(student_outs, teacher_outs) -> float:
    """Sum over tokens of (1 / (N T)) sum over the N T (layer, loop) pairs of ||o_s - o_t||^2, each
    o a (B, L, d) attention output."""
    total = 0.0
    for o_s, o_t in zip(student_outs, teacher_outs, strict=True):
        for b in range(o_s.shape[0]):
            for i in range(o_s.shape[1]):
                total += float(((o_s[b, i].detach().double() - o_t[b, i].detach().double()) ** 2).sum())
    return total / len(student_outs)


def naive_lm_loss(logits, targets, mask) -> float:
    """Sum over tokens (weighted by ``mask``) of -log softmax(logits)[target]; logits (B, L, V)."""
    return sum(-float(mask[b, i]) * math.log(float(_softmax64(logits[b, i])[targets[b, i]]))
               for b in range(logits.shape[0]) for i in range(logits.shape[1]))
