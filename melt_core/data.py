"""Training data: the paper's SFT mix (real path) and the embedded synthetic task.

Every source is normalised to chat records ``{"messages": [{"role", "content"}, ...]}``,
rendered with a template into token ids plus a loss mask (1 on assistant tokens), and
packed into rows of ``seq_len`` tokens.

Real path (docs/METHOD.md section 3): 50% nvidia/AceReason-1.1-SFT (``input``/``output``
columns) + 50% open-thoughts/OpenThoughts3 (``conversations`` of ``from``/``value``),
through ``datasets``, rendered with Ouro's ChatML template in thinking mode.

Embedded path: long addition, one column per token. The prompt is two D-digit numbers
written least-significant digit first, ``a+b=``; the answer gives each column's total
a_i + b_i + carry (0..19, one symbol) where the carry comes from the previous *generated*
symbol. So the answer is tens of tokens long, every token needs two retrievals and an
addition, and each depends on the token before it: what a cache policy keeps of generated
tokens matters. (A running sum mod 10 was tried first: its targets are uniform given any
single input digit, so a tiny model gets no gradient signal and plateaus; writing totals
instead of digits mod 10 keeps every input informative.) A character tokenizer saved in the
transformers format.

The long-answer task (``chain_sum``, optional, mixed into the same training data): the same
additions chained, x_n = x_{n-1} + x_{n-2}, written out for up to 26 terms, so answers run to
hundreds of tokens and, from the second term on, every token reads the model's own generated
tokens one and two terms back: where KV sharing and the sliding window are tested.
"""

from __future__ import annotations

import json
import random
from array import array
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch

CHAT_SPECIAL = ["<|im_start|>", "<|im_end|>", "<think>", "</think>"]
TEMPLATES = ("plain", "chatml-thinking")


class DataError(ValueError):
    """A dataset is missing, empty or malformed; the message names the file and record."""


# ----------------------------------------------------------------------------- tokenizer
def build_char_tokenizer(chars: str, out_dir: str | Path):
    """A character-level ``PreTrainedTokenizerFast`` (ids: pad 0, bos 1, eos 2, ChatML 3-6, chars)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<pad>", "<bos>", "<eos>", *CHAT_SPECIAL, "<unk>"]
    vocab = {tok: i for i, tok in enumerate(specials + sorted(set(chars)))}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()  # characters join without spaces
    tok = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", bos_token="<bos>",
                                  eos_token="<eos>", unk_token="<unk>",
                                  additional_special_tokens=CHAT_SPECIAL)
    tok.save_pretrained(str(out_dir))
    return tok


def load_tokenizer(path: str | Path):
    """A tokenizer saved in the transformers format (never with remote code)."""
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()  # AutoTokenizer warns that config.json's model_type is unknown to it
    if not (Path(path) / "tokenizer.json").is_file() and not (Path(path) / "tokenizer_config.json").is_file():
        raise DataError(f"{path}: no tokenizer.json / tokenizer_config.json; expected a tokenizer "
                        "saved with save_pretrained (the checkpoint directory of the hub model)")
    return AutoTokenizer.from_pretrained(str(path), trust_remote_code=False)


# ------------------------------------------------------------------------- synthetic task
SUM_SYMBOLS = "0123456789abcdefghij"  # a column total 0..19, one symbol per column


def column_totals(a: list[int], b: list[int]) -> list[int]:
    """Long addition of two digit lists (least-significant first): each column's total a_i + b_i +
    carry, 0..19, the carry 1 when the column before totalled >= 10."""
    totals, carry = [], 0
    for x, y in zip(a, b):
        totals.append(x + y + carry)
        carry = int(totals[-1] >= 10)
    return totals


def digit_sum_example(rng: random.Random, digits: int) -> dict:
    """Long addition one column per token, least-significant digit first: the symbol for
    t_i = a_i + b_i + carry, carry = 1 when the previous column's total t_{i-1} >= 10."""
    a = [rng.randrange(10) for _ in range(digits)]
    b = [rng.randrange(10) for _ in range(digits)]
    prompt = "".join(map(str, a)) + "+" + "".join(map(str, b)) + "="
    answer = "".join(SUM_SYMBOLS[t] for t in column_totals(a, b))
    return {"messages": [{"role": "user", "content": prompt}, {"role": "assistant", "content": answer}]}


COUNTDOWN = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"  # chain_sum's markers: COUNTDOWN[r - 1] = r terms still to write


def chain_sum_example(rng: random.Random, digits: int, terms: int) -> dict:
    """The long-answer task: a Fibonacci chain of D-digit numbers mod 10^D, written out term by term.

    Prompt ``a+b`` and a marker saying how many terms to write (``C`` = 3); answer x_2, marker,
    x_3, marker, ..., x_{terms+1} with x_n = x_{n-1} + x_{n-2}, each term as digit_sum writes a sum
    (one column total per symbol, least-significant first, the carry read off the previous symbol)
    and each marker one less than the one D+1 tokens back. So every symbol reads the two terms
    D+1 and 2(D+1) tokens back, the same offsets as digit_sum's answer, but from the model's own
    generated tokens from the second term on: what a cache keeps of generated tokens decides
    whether the chain survives, and one wrong symbol spoils every later term."""
    if not 1 <= terms <= len(COUNTDOWN):
        raise ValueError(f"chain_sum: terms must be 1..{len(COUNTDOWN)}, got {terms}")
    prev = [rng.randrange(10) for _ in range(digits)]
    cur = [rng.randrange(10) for _ in range(digits)]
    prompt = "".join(map(str, prev)) + "+" + "".join(map(str, cur)) + COUNTDOWN[terms - 1]
    parts = []
    for left in range(terms - 1, -1, -1):
        totals = column_totals(prev, cur)
        parts.append("".join(SUM_SYMBOLS[t] for t in totals) + (COUNTDOWN[left - 1] if left else ""))
        prev, cur = cur, [t % 10 for t in totals]
    return {"messages": [{"role": "user", "content": prompt}, {"role": "assistant", "content": "".join(parts)}]}


def _unique(make, n: int, seen: set[str], exclude: bool = False) -> list[dict]:
    """``n`` examples from ``make()`` whose prompts are new (``exclude``: not in ``seen``, which
    stays as it is; else also not repeated within, and added to ``seen``)."""
    out = []
    while len(out) < n:
        ex = make()
        key = ex["messages"][0]["content"]
        if key in seen:
            continue
        if not exclude:
            seen.add(key)
        out.append(ex)
    return out


def make_digit_sum_task(out_dir: str | Path, digits: int = 16, n_train: int = 20000,
                        n_test: int = 256, seed: int = 0, chain: dict | None = None) -> dict[str, Path]:
    """Write train.jsonl / test.jsonl (disjoint prompts) and the tokenizer into ``out_dir``.

    ``chain`` (optional): the long-answer task chain_sum mixed into the same train.jsonl, so one
    teacher and every student learn both: ``{n_train, n_test, min_terms, max_terms}``; training
    chains have min_terms..max_terms terms, the test chains (test_chain.jsonl) all max_terms, so
    accuracy can be read at every length on the same questions."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    seen: set[str] = set()
    test = _unique(lambda: digit_sum_example(rng, digits), n_test, seen)
    train = _unique(lambda: digit_sum_example(rng, digits), n_train, seen, exclude=True)
    splits = {"train": train, "test": test}
    if chain:
        unknown = set(chain) - {"n_train", "n_test", "min_terms", "max_terms"}
        if unknown:
            raise ValueError(f"source.task.chain: unknown key(s) {sorted(unknown)}; "
                             "expected n_train, n_test, min_terms, max_terms")
        lo, hi = chain.get("min_terms", 2), chain["max_terms"]
        splits["test_chain"] = _unique(lambda: chain_sum_example(rng, digits, hi), chain["n_test"], seen)
        train += _unique(lambda: chain_sum_example(rng, digits, rng.randint(lo, hi)), chain["n_train"],
                         seen, exclude=True)
        random.Random(seed + 1).shuffle(train)
    paths = {split: out_dir / f"{split}.jsonl" for split in splits}
    for split, records in splits.items():
        write_jsonl(paths[split], records)
    build_char_tokenizer("0123456789+=" + SUM_SYMBOLS + (COUNTDOWN if chain else ""), out_dir / "tokenizer")
    paths["tokenizer"] = out_dir / "tokenizer"
    return paths


def write_jsonl(path: Path, records: Iterable[dict]) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    with tmp.open("w") as fh:
        for r in records:
            fh.write(json.dumps(r) + "\n")
    tmp.replace(path)


# ----------------------------------------------------------------------------- records
def normalise(record: dict, schema: str, where: str) -> dict:
    """One source record -> ``{"messages": [...]}``. schema: chat | acereason | openthoughts."""
    try:
        if schema == "chat":
            messages = record["messages"]
        elif schema == "acereason":
            messages = [{"role": "user", "content": record["input"]},
                        {"role": "assistant", "content": record["output"]}]
        elif schema == "openthoughts":
            roles = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
                     "system": "system"}
            messages = [{"role": roles[m["from"]], "content": m["value"]} for m in record["conversations"]]
        else:
            raise DataError(f"unknown data schema {schema!r}; choose chat, acereason or openthoughts")
    except (KeyError, TypeError) as err:
        raise DataError(f"{where}: record does not follow the {schema!r} schema (missing {err})") from None
    if not messages or not any(m.get("role") == "assistant" and m.get("content") for m in messages):
        raise DataError(f"{where}: record has no assistant message to learn from")
    return {"messages": messages}


def read_jsonl(path: str | Path, schema: str = "chat", limit: int | None = None) -> list[dict]:
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: dataset file not found")
    out = []
    with path.open() as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                raw = json.loads(line)
            except json.JSONDecodeError as err:
                raise DataError(f"{path}:{n}: not valid JSON ({err.msg})") from None
            out.append(normalise(raw, schema, f"{path}:{n}"))
            if limit and len(out) >= limit:
                break
    if not out:
        raise DataError(f"{path}: no records")
    return out


def read_hub(name: str, schema: str, split: str = "train", revision: str | None = None,
             limit: int | None = None, seed: int = 0) -> list[dict]:
    """Records of a hub dataset through ``datasets`` (needs network or a warm HF cache)."""
    import datasets

    ds = datasets.load_dataset(name, split=split, revision=revision)
    if limit:
        ds = ds.shuffle(seed=seed).select(range(min(limit, len(ds))))
    return [normalise(r, schema, f"{name}[{i}]") for i, r in enumerate(ds)]


def load_mixture(sources: list[dict], seed: int = 0) -> list[dict]:
    """Mix sources by ``weight`` over ``total`` records. Each source: kind (jsonl|hub), path or
    name, schema, weight, plus hub options (split, revision)."""
    total = sum(s.get("weight", 1.0) for s in sources)
    n_total = sources[0].get("total") if sources else None
    records: list[dict] = []
    for s in sources:
        limit = int(round(n_total * s.get("weight", 1.0) / total)) if n_total else None
        if s["kind"] == "jsonl":
            records += read_jsonl(s["path"], s.get("schema", "chat"), limit)
        elif s["kind"] == "hub":
            records += read_hub(s["name"], s.get("schema", "chat"), s.get("split", "train"),
                                s.get("revision"), limit, seed)
        else:
            raise DataError(f"data source kind {s['kind']!r} unknown; use jsonl or hub")
    random.Random(seed).shuffle(records)
    return records


# ----------------------------------------------------------------------------- rendering
def render(record: dict, tokenizer, template: str) -> tuple[list[int], list[int]]:
    """Token ids and loss mask (1 = an assistant token to learn) for one chat record."""
    return render_all([record], tokenizer, template)[0]


def render_all(records: list[dict], tokenizer, template: str) -> list[tuple[list[int], list[int]]]:
    """``render`` of every record, with one tokenizer call over all their text pieces (a training
    set's 50,000 pieces took 7-13 s of every phase job one ``encode`` at a time). Each piece is encoded
    on its own either way, so the ids are the same."""
    if template not in TEMPLATES:
        raise DataError(f"unknown chat template {template!r}; choose one of {TEMPLATES}")
    special = (tokenizer.bos_token_id, tokenizer.eos_token_id)
    layouts = [_pieces(r, template, special) for r in records]  # per record: (text, learn) or (token id, learn)
    texts = [piece for layout in layouts for piece, _ in layout if isinstance(piece, str) and piece]
    encoded = iter(tokenizer(texts, add_special_tokens=False)["input_ids"] if texts else [])
    rendered = []
    for layout in layouts:
        ids, mask = [], []
        for piece, learn in layout:
            tokens = [piece] if isinstance(piece, int) else next(encoded) if piece else []
            ids.extend(tokens)
            mask.extend([int(learn)] * len(tokens))
        rendered.append((ids, mask))
    return rendered


def _pieces(record: dict, template: str, special: tuple[int, int]) -> list[tuple[str | int, bool]]:
    """What a record renders to, in order: text pieces (each encoded on its own, without special
    tokens) or the ids of special tokens (``special``: BOS, EOS), each with whether the loss learns it."""
    messages = record["messages"]
    if template == "plain":  # <bos> user assistant <eos>
        return [(special[0], False), *((m["content"], m["role"] == "assistant") for m in messages), (special[1], True)]
    pieces = []  # chatml-thinking: Ouro's chat template, thinking mode
    for m in messages:
        content = m["content"]
        if m["role"] == "assistant" and not content.startswith("<think>"):
            content = "<think>\n" + content
        pieces += [(f"<|im_start|>{m['role']}\n", False), (content + "<|im_end|>", m["role"] == "assistant"),
                   ("\n", False)]
    return pieces


def prompt_text(record: dict, tokenizer, template: str) -> str:
    """The prompt a model is asked to complete at evaluation (everything before the answer), as text."""
    user = [m for m in record["messages"] if m["role"] != "assistant"]
    if template == "plain":
        return tokenizer.bos_token + user[-1]["content"]
    if template == "chatml-thinking":
        text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in user)
        return text + "<|im_start|>assistant\n<think>\n"
    raise DataError(f"unknown chat template {template!r}; choose one of {TEMPLATES}")


def stop_token_ids(tokenizer) -> tuple[int, ...]:
    """Generation ends at EOS, and at ChatML's end of turn where the tokenizer has one."""
    ids = {tokenizer.eos_token_id}
    tid = tokenizer.convert_tokens_to_ids("<|im_end|>")
    if isinstance(tid, int) and tid != tokenizer.unk_token_id:
        ids.add(tid)
    return tuple(sorted(i for i in ids if i is not None))


def prompt_ids(record: dict, tokenizer, template: str) -> list[int]:
    return tokenizer.encode(prompt_text(record, tokenizer, template), add_special_tokens=False)


@dataclass
class PackedData:
    """Rendered records packed into rows of ``seq_len`` tokens; deterministic batches by step."""

    ids: torch.Tensor  # (rows, seq_len)
    loss_mask: torch.Tensor  # (rows, seq_len) over the *targets*, i.e. aligned with ids[:, 1:]
    seed: int = 0

    @classmethod
    def build(cls, records: list[dict], tokenizer, template: str, seq_len: int, seed: int = 0,
              pack: bool = True) -> PackedData:
        if not records:
            raise DataError("no training records: the dataset is empty")
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        rendered = render_all(records, tokenizer, template)
        if pack:  # one stream cut into rows of seq_len + 1, each row's last token the next row's first
            # through array: torch.tensor reads a 1.7M-element list ~6x slower (0.31 s against 0.05 s here)
            ids = torch.frombuffer(array("q", [t for r_ids, _ in rendered for t in r_ids]), dtype=torch.int64)
            mask = torch.frombuffer(array("q", [m for _, r_mask in rendered for m in r_mask]), dtype=torch.int64)
            if len(ids) < seq_len + 1:
                raise DataError(f"the records hold fewer than seq_len+1={seq_len + 1} tokens in all; "
                                "lower seq_len or add data")
            ids, mask = (t.unfold(0, seq_len + 1, seq_len).contiguous() for t in (ids, mask))
        else:  # one record a row, cut or padded to seq_len + 1
            ids = torch.full((len(rendered), seq_len + 1), pad)
            mask = torch.zeros((len(rendered), seq_len + 1), dtype=torch.long)
            for row, (r_ids, r_mask) in enumerate(rendered):
                n = min(len(r_ids), seq_len + 1)
                ids[row, :n], mask[row, :n] = torch.tensor(r_ids[:n]), torch.tensor(r_mask[:n])
        mask = mask[:, 1:]
        if int(mask.sum()) == 0:
            raise DataError("no token to learn: no assistant content survived rendering")
        return cls(ids, mask, seed)

    def __len__(self) -> int:
        return self.ids.shape[0]

    @property
    def seq_len(self) -> int:
        return self.ids.shape[1] - 1

    def batch(self, step: int, batch_size: int, rank: int = 0, world: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows of global batch ``step`` that belong to ``rank``; a pure function of (seed, step)."""
        order = self._order(step * batch_size // len(self))
        start = step * batch_size
        idx = [order[(start + i) % len(self)] for i in range(batch_size)]
        per = batch_size // world
        mine = idx[rank * per:(rank + 1) * per]
        return self.ids[mine], self.loss_mask[mine]

    def _order(self, epoch: int) -> list[int]:
        order = list(range(len(self)))
        random.Random(self.seed * 100_003 + epoch).shuffle(order)
        return order


