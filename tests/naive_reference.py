"""A slow, literal re-statement of the decoding semantics, written without melt_core's
cache or attention code, for the equivalence tests to compare against.

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
    # x: (H, D); rotate pairs (x[j], x[j + D/2]) by pos * theta^(-2j/D)
    D = x.shape[-1]
    half = D // 2
    freq = theta ** (-torch.arange(half, dtype=torch.float64) * 2 / D)
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
def naive_decode(model, ids, mode="melt", prompt_len=0):
    """Per-loop logits (T, L, V) for one sequence ``ids`` (L,)."""
    cfg = model.config
    N, T, W = cfg.num_hidden_layers, cfg.total_ut_steps, cfg.window if mode == "melt" else 0
    H, Hkv, D = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    layers = model.model.layers
    loop_rows = [[[] for _ in range(T)] for _ in range(N)]  # [l][t][j] -> (k, v)
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
                if not (mode == "first-loop" and shared and t > 0):
                    own[l] = row
                keys, values = [], []
                for j in range(i):
                    if not shared or j < prompt_len or (mode == "melt" and j >= i - W):
                        k, v = loop_rows[l][t][j]
                    else:
                        k, v = final_rows[l][j]
                    keys.append(k)
                    values.append(v)
                keys.append(own[l][0])
                values.append(own[l][1])
                o = _attention(q, keys, values).reshape(H * D)
                x = x + layer.input_layernorm_2(att.o_proj.weight @ o)
                x = x + layer.post_attention_layernorm_2(layer.mlp(layer.post_attention_layernorm(x)))
                loop_rows[l][t].append(row)
            x = model.model.norm(x)
            logits_i.append(model.lm_head.weight @ x)
        for l in range(N):
            final_rows[l].append(own[l])
        out.append(torch.stack(logits_i))
    return torch.stack(out, 1)  # (T, L, V)
