"""Protects the data path: the synthetic task is what it claims, the real datasets' schemas
normalise to chat records, templates put the loss on assistant tokens only, packing keeps
every token once, and batches are a pure function of (seed, step)."""

import json
import random

import pytest

from melt_core.data import (
    TEMPLATES,
    DataError,
    PackedData,
    build_char_tokenizer,
    chain_sum_example,
    digit_sum_example,
    load_mixture,
    load_tokenizer,
    make_digit_sum_task,
    normalise,
    prompt_ids,
    read_jsonl,
    render,
    render_all,
    stop_token_ids,
)


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    d = tmp_path_factory.mktemp("tok")
    build_char_tokenizer("0123456789+=abcdefghijklmnopqrstuvwxyz \n", d)
    return load_tokenizer(d)


def test_long_addition_example_is_correct():
    rng = random.Random(5)
    for _ in range(50):
        ex = digit_sum_example(rng, 8)
        prompt, answer = ex["messages"][0]["content"], ex["messages"][1]["content"]
        a, b = prompt[:-1].split("+")
        total = int(a[::-1]) + int(b[::-1])  # numbers are written least-significant digit first
        digits = "".join(str(int("0123456789abcdefghij".index(s)) % 10) for s in answer)
        carry_out = "0123456789abcdefghij".index(answer[-1]) >= 10
        assert int(digits[::-1]) + (10**8 if carry_out else 0) == total


def _terms(answer: str, digits: int) -> list[int]:
    """A chain_sum answer as its terms' values (least-significant symbol first, digit = symbol mod 10)."""
    pieces = [answer[i:i + digits] for i in range(0, len(answer), digits + 1)]
    return [int("".join(str("0123456789abcdefghij".index(s) % 10) for s in p)[::-1]) for p in pieces]


@pytest.mark.parametrize("terms", [1, 2, 7])
def test_chain_sum_is_a_fibonacci_chain_with_a_countdown(terms):
    rng, D = random.Random(terms), 6
    for _ in range(20):
        ex = chain_sum_example(rng, D, terms)
        prompt, answer = ex["messages"][0]["content"], ex["messages"][1]["content"]
        assert prompt[-1] == "ABCDEFGHIJKLMNOPQRSTUVWXYZ"[terms - 1] and len(answer) == terms * (D + 1) - 1
        a, b = (int(x[::-1]) for x in prompt[:-1].split("+"))
        chain = [a, b]
        for _ in range(terms):
            chain.append((chain[-1] + chain[-2]) % 10**D)
        assert _terms(answer, D) == chain[2:]
        # the marker after term j says how many terms are left: the one D+1 tokens back, less one
        markers = [answer[j * (D + 1) - 1] for j in range(1, terms)]
        assert markers == list("ABCDEFGHIJKLMNOPQRSTUVWXYZ"[:terms - 1][::-1])
        # every symbol is its column's total: the digits of the two terms before, plus the carry
        # read off the symbol before it in the same term
        digits = [[int(c) for c in x] for x in prompt[:-1].split("+")]
        for j in range(terms):
            symbols = ["0123456789abcdefghij".index(c) for c in answer[j * (D + 1):j * (D + 1) + D]]
            carries = [0] + [int(t >= 10) for t in symbols[:-1]]
            assert symbols == [x + y + c for x, y, c in zip(digits[-2], digits[-1], carries)]
            digits.append([t % 10 for t in symbols])
    with pytest.raises(ValueError, match="terms must be 1..26"):
        chain_sum_example(rng, D, 27)


def test_task_with_chain_mixes_both_and_tests_the_longest(tmp_path):
    paths = make_digit_sum_task(tmp_path, digits=4, n_train=60, n_test=10, seed=3,
                                chain={"n_train": 40, "n_test": 6, "min_terms": 2, "max_terms": 5})
    train, test, chain = (read_jsonl(paths[k]) for k in ("train", "test", "test_chain"))
    prompts = lambda recs: {r["messages"][0]["content"] for r in recs}  # noqa: E731
    assert len(train) == 100 and sum(r["messages"][0]["content"].endswith("=") for r in train) == 60
    assert {len(r["messages"][1]["content"]) for r in chain} == {5 * 5 - 1}  # every test chain has max_terms
    assert not prompts(train) & (prompts(test) | prompts(chain)) and len(prompts(test) | prompts(chain)) == 16
    lengths = {len(r["messages"][1]["content"]) for r in train if not r["messages"][0]["content"].endswith("=")}
    assert min(lengths) == 2 * 5 - 1 and max(lengths) <= 5 * 5 - 1
    tok = load_tokenizer(paths["tokenizer"])
    for rec in chain[:2]:  # the markers are tokens of their own, one character each
        text = rec["messages"][0]["content"] + rec["messages"][1]["content"]
        ids = tok.encode(text, add_special_tokens=False)
        assert len(ids) == len(text) and tok.unk_token_id not in ids and tok.decode(ids) == text
    with pytest.raises(ValueError, match=r"source.task.chain: unknown key\(s\) \['terms'\]"):
        make_digit_sum_task(tmp_path / "x", digits=4, n_train=5, n_test=2, chain={"terms": 3, "n_train": 1,
                                                                                 "n_test": 1, "max_terms": 3})


def test_schemas_normalise(tmp_path):
    ace = {"input": "What is 1+1?", "output": "<think>\n1+1=2\n</think>\n2", "category": "math"}
    ot = {"conversations": [{"from": "human", "value": "Q"}, {"from": "gpt", "value": "A"}]}
    assert normalise(ace, "acereason", "x")["messages"][1]["content"].startswith("<think>")
    assert normalise(ot, "openthoughts", "x")["messages"] == [{"role": "user", "content": "Q"},
                                                               {"role": "assistant", "content": "A"}]
    with pytest.raises(DataError, match=r"here: record does not follow the 'acereason' schema \(missing 'output'\)"):
        normalise({"input": "q"}, "acereason", "here")
    a, o = tmp_path / "ace.jsonl", tmp_path / "ot.jsonl"
    a.write_text("\n".join(json.dumps({**ace, "input": f"q{i}"}) for i in range(10)))
    o.write_text("\n".join(json.dumps(ot) for _ in range(10)))
    mix = load_mixture([{"kind": "jsonl", "path": str(a), "schema": "acereason", "weight": 0.5, "total": 8},
                        {"kind": "jsonl", "path": str(o), "schema": "openthoughts", "weight": 0.5}])
    assert len(mix) == 8 and sum(m["messages"][0]["content"] == "Q" for m in mix) == 4  # 50/50


def test_chatml_thinking_template_masks_only_the_assistant(tok):
    rec = {"messages": [{"role": "user", "content": "1+2"}, {"role": "assistant", "content": "3"}]}
    ids, mask = render(rec, tok, "chatml-thinking")
    text = tok.decode(ids)
    assert text == "<|im_start|>user\n1+2<|im_end|>\n<|im_start|>assistant\n<think>\n3<|im_end|>\n"
    learned = tok.decode([i for i, m in zip(ids, mask) if m])
    assert learned == "<think>\n3<|im_end|>"
    plain_ids, plain_mask = render(rec, tok, "plain")
    assert tok.decode([i for i, m in zip(plain_ids, plain_mask) if m]) == "3<eos>"


@pytest.mark.parametrize("template,answer", [("plain", "3<eos>"), ("chatml-thinking", "3<|im_end|>\n")])
def test_the_eval_prompt_is_the_training_text_up_to_the_answer(tok, template, answer):
    """What a model is asked at evaluation is what it saw in training before the answer began: the
    prompt's ids are the rendered record's first ids and the rest is the answer and its end (Ouro's
    thinking template opens <think> in the prompt)."""
    rec = {"messages": [{"role": "user", "content": "1+2"}, {"role": "assistant", "content": "3"}]}
    ids, _ = render(rec, tok, template)
    prompt = prompt_ids({"messages": rec["messages"][:1]}, tok, template)
    assert ids[:len(prompt)] == prompt and tok.decode(ids[len(prompt):]) == answer
    assert prompt_ids(rec, tok, template) == prompt  # the record's own answer is never in its prompt


def test_generation_stops_at_eos_and_at_a_chatml_end_of_turn(tok):
    """A thinking-template answer ends with <|im_end|> (the tokenizer's EOS may be another token), so
    both stop generation; a tokenizer without ChatML tokens stops at EOS alone."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    assert stop_token_ids(tok) == tuple(sorted({tok.eos_token_id, tok.convert_tokens_to_ids("<|im_end|>")}))
    assert len(set(stop_token_ids(tok))) == 2
    plain = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel({"<eos>": 0, "<unk>": 1, "a": 2},
                                                                                unk_token="<unk>")),
                                    eos_token="<eos>", unk_token="<unk>")
    assert stop_token_ids(plain) == (0,)


@pytest.fixture(scope="module")
def bpe_tok():
    """A byte-level BPE tokenizer, as the hub's are: merges could join a piece to its neighbour."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<pad>", "<bos>", "<eos>", "<|im_start|>", "<|im_end|>"]
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    corpus = [f"{a}+{b}={a + b} user assistant again three be brief" for a in range(60) for b in range(0, 60, 7)]
    bpe.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=300, special_tokens=specials))
    return PreTrainedTokenizerFast(tokenizer_object=bpe, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>")


@pytest.mark.parametrize("which", ["char", "bpe"])
def test_batched_rendering_equals_encoding_each_piece_alone(which, request):
    """render_all encodes every record's pieces in one tokenizer call; the ids must be those of
    encoding each piece on its own (a piece never merges with its neighbour's tokens)."""
    tok = request.getfixturevalue({"char": "tok", "bpe": "bpe_tok"}[which])
    recs = [digit_sum_example(random.Random(i), 5) for i in range(6)]
    recs += [{"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "1+2 "},
                           {"role": "assistant", "content": ""}, {"role": "user", "content": "again"},
                           {"role": "assistant", "content": "<think>\nthree"}]}]

    def alone(text):
        return tok.encode(text, add_special_tokens=False) if text else []

    for template in TEMPLATES:
        got = render_all(recs, tok, template)
        assert got == [render(r, tok, template) for r in recs]
        for r, (ids, mask) in zip(recs, got):
            if template == "plain":
                want = [tok.bos_token_id] + [t for m in r["messages"] for t in alone(m["content"])] + [tok.eos_token_id]
            else:
                want = [t for m in r["messages"] for text in (
                    f"<|im_start|>{m['role']}\n",
                    ("" if m["role"] != "assistant" or m["content"].startswith("<think>") else "<think>\n")
                    + m["content"] + "<|im_end|>", "\n") for t in alone(text)]
            assert ids == want and len(mask) == len(ids)
    with pytest.raises(DataError, match="unknown chat template 'chatml'"):
        render_all(recs, tok, "chatml")


def test_unpacked_rows_are_records_cut_or_padded(tok):
    recs = [digit_sum_example(random.Random(i), 2 + 3 * i) for i in range(3)]
    data = PackedData.build(recs, tok, "plain", seq_len=12, pack=False)
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    for row, mask_row, r in zip(data.ids.tolist(), data.loss_mask.tolist(), recs):
        ids, mask = render(r, tok, "plain")
        n = min(len(ids), 13)
        assert row == ids[:n] + [pad] * (13 - n) and mask_row == (mask[:n] + [0] * (13 - n))[1:]


def test_packing_keeps_every_token_and_batches_are_deterministic(tok):
    recs = [digit_sum_example(random.Random(i), 4) for i in range(20)]
    data = PackedData.build(recs, tok, "plain", seq_len=16, seed=3)
    stream = [t for r in recs for t in render(r, tok, "plain")[0]]
    rebuilt = data.ids[0].tolist() + [t for row in data.ids[1:] for t in row[1:].tolist()]
    assert rebuilt == stream[:len(rebuilt)] and len(stream) - len(rebuilt) < 17
    a, _ = data.batch(7, 4)
    b, _ = PackedData.build(recs, tok, "plain", seq_len=16, seed=3).batch(7, 4)
    assert a.equal(b)
    r0, _ = data.batch(7, 4, rank=0, world=2)
    r1, _ = data.batch(7, 4, rank=1, world=2)
    assert r0.shape[0] == 2 and a.equal(__import__("torch").cat([r0, r1]))
    # each epoch visits every row once, and the next epoch in a new order
    rows = [tuple(r) for r in data.ids.tolist()]
    per_epoch = len(rows)  # batches of one row: step k is the k-th row drawn
    drawn = [tuple(data.batch(step, 1)[0][0].tolist()) for step in range(2 * per_epoch)]
    first, second = drawn[:per_epoch], drawn[per_epoch:]
    assert sorted(first) == sorted(rows) == sorted(second) and first != second


def test_too_little_data_is_an_error(tok):
    with pytest.raises(DataError, match="fewer than seq_len"):
        PackedData.build([digit_sum_example(random.Random(0), 2)], tok, "plain", seq_len=500)
