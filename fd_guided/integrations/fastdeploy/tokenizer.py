"""The tokenizers FastDeploy serves, as fd_guided `TokenizerBundle`s.

FastDeploy's guided backends load ``model_config.model`` (research notes §2.2): ERNIE architectures
through its own sentencepiece ``Ernie4_5Tokenizer`` (``guided_decoding/ernie_tokenizer.py``, the
vocabulary in ``tokenizer.model``, ``spm.model`` or ``ernie_token_100k.model``), everything else
through HF ``AutoTokenizer(use_fast=True)``. We do the same, and read the engine's stop tokens from
``generation_config.json`` too (FastDeploy's backends used only the tokenizer's own EOS).
"""

from __future__ import annotations

import functools
import json
import os
from typing import Any

from ...tokenizer import THINK_END_TEXT, THINK_START_TEXT, TokenizerBundle, join_token_bytes, load_tokenizer
from .config import read

SENTENCEPIECE_FILES = ("tokenizer.model", "spm.model", "ernie_token_100k.model")


def load_fd_tokenizer(fd_config: Any) -> TokenizerBundle:
    """The bundle for the model FastDeploy serves (``fd_config.model_config``)."""
    model_config = getattr(fd_config, "model_config", None)
    path = read(model_config, "model")
    if not path:
        raise ValueError("no tokenizer: pass tokenizer= or set fd_config.model_config.model")
    path = str(path)
    if not os.path.isdir(path):
        return load_tokenizer(path)  # a built-in name ("deepseek", "qwen") or a tokenizer.json file
    if _is_ernie(read(model_config, "architectures")) and _sentencepiece_file(path):
        return ernie_bundle(path)
    if os.path.isfile(os.path.join(path, "tokenizer.json")):
        return _with_generation_eos(load_tokenizer(path), path)
    return _with_generation_eos(_auto_fast_bundle(path), path)


def ernie_bundle(path: str) -> TokenizerBundle:
    """An ERNIE checkpoint's sentencepiece vocabulary, loaded by FastDeploy's ``Ernie4_5Tokenizer``."""
    from fastdeploy.model_executor.guided_decoding.ernie_tokenizer import Ernie4_5Tokenizer

    vocab_file = _sentencepiece_file(path)
    # FastDeploy picks the file by mutating the class-wide vocab_files_names; a subclass says the
    # same without changing the class for everybody else in the process.
    tokenizer_class: Any = type(  # a subclass of FastDeploy's class (untyped here)
        "ErnieTokenizerForGuidedDecoding", (Ernie4_5Tokenizer,), {"vocab_files_names": {"vocab_file": vocab_file}}
    )
    tokenizer = tokenizer_class.from_pretrained(path)
    return _with_generation_eos(bundle_from_sentencepiece(tokenizer, name=os.path.basename(path.rstrip("/"))), path)


def bundle_from_sentencepiece(tokenizer: Any, name: str = "sentencepiece") -> TokenizerBundle:
    """A bundle over an HF slow tokenizer that wraps ``tokenizer.sp_model`` (sentencepiece).

    Pieces map to the bytes they put in the text: ``▁`` is a space, byte-fallback pieces
    (``<0x0A>``) are that byte; control, unknown and added (special) tokens, and the think
    markers, are None, so no grammar ever matches them as text.
    """
    sp = tokenizer.sp_model
    vocab = tokenizer.get_vocab()
    specials = set(getattr(tokenizer, "all_special_ids", ())) | {i for i in vocab.values() if i >= sp.get_piece_size()}
    think_start, think_end = vocab.get(THINK_START_TEXT), vocab.get(THINK_END_TEXT)
    specials |= {i for i in (think_start, think_end) if i is not None}
    size = max(len(tokenizer), sp.get_piece_size())
    token_bytes: list[bytes | None] = []
    for token_id in range(size):
        if (
            token_id in specials
            or token_id >= sp.get_piece_size()
            or sp.is_control(token_id)
            or sp.is_unknown(token_id)
        ):
            token_bytes.append(None)
        elif sp.is_byte(token_id):
            token_bytes.append(bytes([int(sp.id_to_piece(token_id)[3:5], 16)]))
        else:
            token_bytes.append(sp.id_to_piece(token_id).replace("\u2581", " ").encode("utf-8"))
    frozen = tuple(token_bytes)
    eos = tuple(i for i in [tokenizer.eos_token_id] if i is not None)
    return TokenizerBundle(
        name=name,
        token_bytes=frozen,
        eos_token_ids=eos,
        # sentencepiece itself: FastDeploy's Ernie4_5Tokenizer.tokenize refuses the keywords newer
        # transformers pass from encode() (split_special_tokens); the ids are the same.
        encode=lambda text: list(sp.encode(text)),
        decode_bytes=functools.partial(join_token_bytes, frozen),
        think_start_id=think_start,
        think_end_id=think_end,
    )


def _auto_fast_bundle(path: str) -> TokenizerBundle:
    """What FastDeploy loads for non-ERNIE models: ``AutoTokenizer(use_fast=True)``, saved as tokenizer.json."""
    import tempfile

    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    tokenizer = AutoTokenizer.from_pretrained(path, use_fast=True)
    if not isinstance(tokenizer, PreTrainedTokenizerFast):
        tokenizer = PreTrainedTokenizerFast(__slow_tokenizer=tokenizer)
    with tempfile.TemporaryDirectory() as scratch:
        tokenizer.save_pretrained(scratch)
        return load_tokenizer.__wrapped__(scratch)


def _with_generation_eos(bundle: TokenizerBundle, path: str) -> TokenizerBundle:
    """Add ``generation_config.json``'s ``eos_token_id`` (int or list): the ids the engine stops on."""
    config_file = os.path.join(path, "generation_config.json")
    if not os.path.isfile(config_file):
        return bundle
    with open(config_file, encoding="utf-8") as handle:
        eos = json.load(handle).get("eos_token_id")
    ids = [eos] if isinstance(eos, int) else [i for i in (eos or []) if isinstance(i, int)]
    merged = tuple(dict.fromkeys([*bundle.eos_token_ids, *ids]))
    if merged == bundle.eos_token_ids:
        return bundle
    import dataclasses

    return dataclasses.replace(bundle, eos_token_ids=merged)


def _sentencepiece_file(path: str) -> str | None:
    return next((name for name in SENTENCEPIECE_FILES if os.path.isfile(os.path.join(path, name))), None)


def _is_ernie(architectures: Any) -> bool:
    """FastDeploy's own rule (``ErnieArchitectures.contains_ernie_arch``) when FastDeploy is there."""
    names = [architectures] if isinstance(architectures, str) else list(architectures or [])
    try:
        from fastdeploy.config import ErnieArchitectures
    except ImportError:
        return any(str(name).lower().startswith("ernie") for name in names)
    return bool(ErnieArchitectures.contains_ernie_arch(names))
