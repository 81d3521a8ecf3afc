"""FastDeploy's guided-decoding names and call shapes, backed by fd_guided's manager.

A FastDeploy-style stack keeps its model runners and swaps in these objects by configuration
(`register` is the entry point of the ``fastdeploy.model_register_plugins`` group)::

    # engine process, admission (EngineService._insert_zmq_task_to_scheduler)
    checker = schema_checker(backend_name, disable_any_whitespace=...)
    request, err_msg = checker.schema_format(request)          # never raises; err -> HTTP 400

    # worker process, one per tensor-parallel rank (GPUModelRunner)
    guided_backend = get_guided_backend(fd_config)
    sampler.guided_decoding = GuidedDecoding(fd_config)         # what Sampler.__init__ builds
    guided_decoding.apply_reasoning_parser(guided_backend.get_reasoning_parser())
    # insert_tasks_v1, per PREFILL task (FastDeploy re-sends one per chunk; that is fine here)
    future = guided_backend.get_logits_processor(schemata_key, enable_thinking)
    guided_decoding.add_logits_processor(idx, future, prefill_tokens)
    # execute_model, every step, logits row i = slot i
    guided_decoding.pre_process(p_done_idxs)                   # fills start, overlapping the forward
    logits = model(...)
    logits = guided_decoding.apply_token_mask(logits, p_done_idxs)   # in place
    sampled_token_ids = sample(logits)                          # (broadcast from the TP leader)
    guided_decoding.post_process(sampled_token_ids)

Everything guided (compile cache, overlapped fills, reasoning gating, replay, rejection policy)
is the `GuidedDecodingManager`'s; this module only translates names, request fields and the
slot-indexed row layout. FastDeploy faults it fixes (see docs/integration.md for the tests):
the whitespace flag reaches the compiler; unsupported JSON-schema keywords are refused whether
the schema arrives as a dict or a str; regexes (and every other kind) are validated at admission
and `schema_format` returns every error instead of raising; a rejected token finishes the request
with an error and forces a stop token instead of dropping the constraint; replayed tokens rebuild
the matcher after preemption or on a decode instance; a request re-sent per prefill chunk is
compiled once; a compile failure travels in the future instead of becoming a ``None`` processor.
"""
from __future__ import annotations

import functools
import importlib
import json
import logging
import os
import threading
from collections import OrderedDict
from concurrent.futures import Future
from typing import Any, Mapping, Sequence

import numpy as np

from ..compile import CompileService
from ..config import GuidedConfig
from ..errors import GuidedDecodingError, InvalidGrammarError, SlotStateError
from ..interface import CompiledGrammar
from ..kernels import apply_token_bitmask_inplace
from ..manager import GuidedDecodingManager, GuidedFinish
from ..metrics import GuidedMetrics
from ..registry import available_backends, get_backend_class
from ..spec import GrammarSpec, parse_guided_request
from ..tokenizer import TokenizerBundle, load_tokenizer

logger = logging.getLogger(__name__)

HOST_PLUGIN_GROUP = "fastdeploy.model_register_plugins"
# Host backend names this plugin serves once registered (override with FD_GUIDED_BACKENDS).
DEFAULT_SERVED_NAMES = ("fd_guided", "xgrammar", "auto")
# FastDeploy backend names -> our registry names ("auto" is ours too when registered).
_BACKEND_ALIASES = {"fd_guided": "auto", "guidance": "llguidance"}
# Key the checker adds to a JSON schema / structural tag it writes back, so per-request options
# (whitespace, separators, strictness, json_object) survive FastDeploy's (type, text) key.
OPTIONS_KEY = "x-fd-guided"

_KIND_FIELDS = ("guided_json", "guided_regex", "guided_choice", "guided_grammar", "guided_json_object",
                "structural_tag", "response_format")
_OPTION_FIELDS = ("disable_any_whitespace", "any_whitespace", "max_whitespace_cnt", "separators", "guided_strict")
# The request fields FastDeploy's runner turns into a schemata key, in its priority order.
_KEY_FIELDS = (("guided_json", "json"), ("guided_regex", "regex"), ("guided_grammar", "grammar"),
               ("structural_tag", "structural_tag"))


# ----- configuration --------------------------------------------------------------------------

def guided_config_from_fd(fd_config: Any, **overrides) -> GuidedConfig:
    """The `GuidedConfig` a FastDeploy config asks for.

    Reads ``structured_outputs_config.guided_decoding_backend`` and the whitespace flag under
    both of FastDeploy's names (``disable_any_whitespace`` and the CLI's
    ``guided_decoding_disable_any_whitespace``, which FastDeploy never copied over), accepting
    the CLI's string values ("false" is False here, unlike ``bool("false")``). `overrides` win.
    """
    structured = getattr(fd_config, "structured_outputs_config", None)
    changes: dict[str, Any] = {"backend": backend_name_for(_read(structured, "guided_decoding_backend") or "auto")}
    disable = _first_set(
        overrides.pop("disable_any_whitespace", None),
        _read(structured, "guided_decoding_disable_any_whitespace"),
        _read(fd_config, "guided_decoding_disable_any_whitespace"),
        _read(structured, "disable_any_whitespace"),
    )
    if disable is not None:
        changes["any_whitespace"] = not as_bool(disable, "disable_any_whitespace")
    changes.update(overrides)
    return GuidedConfig().replace(**changes)


def backend_name_for(host_name: str) -> str:
    """Our registry name for a FastDeploy backend name.

    ``fd_guided`` -> ``auto``, ``guidance`` -> ``llguidance``, ``auto`` -> our ``auto``
    backend (``xgrammar`` if none is registered), ``fd_guided:<name>`` -> ``<name>``.
    """
    name = str(host_name).strip().lower()
    if name in ("off", "none", ""):
        raise ValueError("guided decoding is off (guided_decoding_backend='off')")
    if name.startswith("fd_guided:"):
        return name.split(":", 1)[1]
    name = _BACKEND_ALIASES.get(name, name)
    if name == "auto" and "auto" not in available_backends():
        return "xgrammar"
    return name


def as_bool(value: Any, name: str) -> bool:
    """A flag given as bool, int or CLI string ("true"/"false"/"1"/"0"/"yes"/"no")."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in ("true", "1", "yes", "on", "false", "0", "no", "off"):
        return value.strip().lower() in ("true", "1", "yes", "on")
    raise ValueError(f"{name} must be a boolean, got {value!r}")


def _first_set(*values: Any) -> Any:
    return next((value for value in values if value is not None), None)


def _read(obj: Any, name: str) -> Any:
    if obj is None:
        return None
    if isinstance(obj, Mapping):
        return obj.get(name)
    return getattr(obj, name, None)


def _write(obj: Any, name: str, value: Any) -> None:
    if isinstance(obj, dict):
        obj[name] = value
    else:
        setattr(obj, name, value)


# ----- admission: the checker -----------------------------------------------------------------

def schema_checker(backend_name: str, **kwargs) -> "SchemaChecker":
    """FastDeploy's ``schema_checker``: the admission checker for `backend_name`.

    kwargs: ``disable_any_whitespace`` (what FastDeploy passes), ``fd_config`` (read like the
    worker reads it, so admission and worker agree), or ``config`` (a GuidedConfig).
    """
    config = kwargs.pop("config", None)
    fd_config = kwargs.pop("fd_config", None)
    if config is None and fd_config is not None:
        config = guided_config_from_fd(fd_config, **{k: kwargs.pop(k) for k in list(kwargs) if k == "disable_any_whitespace"})
    if config is None:
        config = GuidedConfig(backend=backend_name_for(backend_name))
        disable = kwargs.pop("disable_any_whitespace", None)
        if disable is not None:
            config = config.replace(any_whitespace=not as_bool(disable, "disable_any_whitespace"))
    if kwargs:
        raise TypeError(f"schema_checker got unexpected options {sorted(kwargs)}")
    get_backend_class(config.backend)  # an unknown backend fails here, at startup
    return SchemaChecker(config)


class SchemaChecker:
    """FastDeploy's ``BaseChecker``: validate and normalise a request's guided fields at admission.

    Works on any object with FastDeploy ``Request`` attributes (or a dict): ``guided_json``,
    ``guided_regex``, ``guided_choice``, ``guided_grammar``, ``guided_json_object``,
    ``structural_tag`` and, if present, ``response_format`` plus fd_guided's per-request options.
    """

    def __init__(self, config: GuidedConfig):
        self.config = config

    def schema_format(self, request: Any) -> tuple[Any, str | None]:
        """Return ``(request, None)`` with the fields normalised, or ``(request, error message)``.

        On success exactly one of the fields FastDeploy's runner reads is set (``guided_json``,
        ``guided_regex``, ``guided_grammar``, ``structural_tag``): choices become an EBNF grammar,
        json_object and JSON options travel inside the written JSON. Calling it twice is harmless.
        Never raises for a bad request: every failure, whatever its type, is the error message.
        """
        try:
            spec = parse_guided_request(_request_fields(request), self.config)
            if spec is not None:
                write_spec_to_request(request, spec)
        except InvalidGrammarError as error:
            return request, str(error)
        except Exception as error:  # a checker must never take the engine's admission loop down
            logger.warning("guided request rejected by an unexpected %s: %s", type(error).__name__, error)
            return request, f"invalid guided decoding request: {type(error).__name__}: {error}"
        return request, None


def _request_fields(request: Any) -> dict[str, Any]:
    fields = {}
    for name in _KIND_FIELDS + _OPTION_FIELDS:
        value = _read(request, name)
        if value is not None:
            fields[name] = value
    # A request this checker already normalised carries its options inside the JSON: read them
    # back so checking twice (e.g. again on a decode instance) gives the same spec.
    for name in ("guided_json", "structural_tag"):
        if name in fields and _has_options(fields[name]):
            fields.update(_document_fields(fields.pop(name), name))
    return fields


def _has_options(value: Any) -> bool:
    if isinstance(value, (str, bytes)):
        return OPTIONS_KEY in (value if isinstance(value, str) else value.decode("utf-8", "replace"))
    return isinstance(value, Mapping) and OPTIONS_KEY in value


def request_enable_thinking(request: Any) -> bool | None:
    """The request's chat-template ``enable_thinking`` (what FastDeploy's runner should pass)."""
    value = _read(request, "enable_thinking")
    if value is None:
        value = _read(_read(request, "chat_template_kwargs"), "enable_thinking")
    return value


def write_spec_to_request(request: Any, spec: GrammarSpec) -> None:
    """Store `spec` in the one request field FastDeploy's runner reads, clearing the others."""
    field, value = request_field_for(spec)
    for name in _KIND_FIELDS + _OPTION_FIELDS:
        if _read(request, name) is not None:
            _write(request, name, None)
    _write(request, field, value)


def request_field_for(spec: GrammarSpec) -> tuple[str, str]:
    """The (request field, text) that carries `spec` through FastDeploy unchanged."""
    from ..backends.xgrammar import choice_ebnf

    if spec.kind == "json_schema":
        return "guided_json", _with_options(spec.schema, spec)
    if spec.kind == "json_object":
        return "guided_json", _with_options({"type": "object"}, spec, kind="json_object")
    if spec.kind == "structural_tag":
        return "structural_tag", _with_options(spec.structural_tag, spec)
    if spec.kind == "regex":
        return "guided_regex", spec.source
    if spec.kind == "choice":
        return "guided_grammar", choice_ebnf(spec.choices)
    return "guided_grammar", spec.source


def _with_options(document: dict, spec: GrammarSpec, kind: str | None = None) -> str:
    fmt = spec.json_format
    options = {"any_whitespace": fmt.any_whitespace, "max_whitespace_cnt": fmt.max_whitespace_cnt,
               "separators": list(fmt.separators) if fmt.separators else None, "strict": fmt.strict}
    if kind:
        options["kind"] = kind
    return json.dumps({**document, OPTIONS_KEY: options}, ensure_ascii=False, separators=(",", ":"))


def schemata_key_of(request: Any) -> tuple[str, str] | None:
    """FastDeploy's ``_init_logits_processor`` key: the first set of json, regex, grammar, structural_tag."""
    for field, key_type in _KEY_FIELDS:
        value = _read(request, field)
        if value is not None:
            return key_type, value
    return None


def spec_from_schemata_key(schemata_key: Any, config: GuidedConfig) -> GrammarSpec:
    """Rebuild the admission spec from a runner's ``(key_type, schemata)`` key.

    Keys written by `SchemaChecker` round-trip exactly; a bare ``("json", '{"type": "object"}')``
    (what FastDeploy's own checker writes for json_object) means any JSON object.
    """
    if not isinstance(schemata_key, (tuple, list)) or len(schemata_key) != 2:
        raise InvalidGrammarError(f"must be a (key_type, schemata) pair, got {schemata_key!r}", part="schemata_key")
    key_type, schemata = schemata_key
    if key_type == "json":
        fields = _document_fields(schemata, "guided_json")
    elif key_type == "structural_tag":
        fields = _document_fields(schemata, "structural_tag")
    elif key_type == "regex":
        fields = {"guided_regex": schemata}
    elif key_type == "grammar":
        fields = {"guided_grammar": schemata}
    else:
        raise InvalidGrammarError(f"unknown key type {key_type!r}; expected json, regex, grammar or structural_tag",
                                  part="schemata_key")
    spec = parse_guided_request(fields, config, check_backend=False)
    if spec is None:
        raise InvalidGrammarError("the key holds no constraint", part="schemata_key")
    return spec


def _document_fields(schemata: Any, field: str) -> dict[str, Any]:
    if isinstance(schemata, (str, bytes)):
        try:
            schemata = json.loads(schemata)
        except json.JSONDecodeError as error:
            raise InvalidGrammarError(f"malformed JSON: {error}", part=field) from None
    if not isinstance(schemata, dict):
        return {field: schemata}  # the spec parser names the type error
    document = dict(schemata)
    options = document.pop(OPTIONS_KEY, None)
    is_object = (options or {}).get("kind") == "json_object" or (options is None and document == {"type": "object"})
    fields: dict[str, Any] = {"guided_json_object": True} if field == "guided_json" and is_object else {field: document}
    if isinstance(options, dict):
        fields["any_whitespace"] = options.get("any_whitespace")
        fields["max_whitespace_cnt"] = options.get("max_whitespace_cnt")
        fields["guided_strict"] = options.get("strict")
        if options.get("separators") is not None:
            fields["separators"] = options["separators"]
    return fields


# ----- worker: backend, futures, processors ---------------------------------------------------

def get_guided_backend(fd_config: Any, **kwargs) -> "FDGuidedBackend":
    """FastDeploy's ``get_guided_backend``: one backend per worker process (per TP rank).

    kwargs: ``tokenizer`` (a TokenizerBundle, a built-in name such as ``"deepseek"`` or a
    tokenizer path; default ``fd_config.model_config.model``), ``metrics``, ``shared_cache``
    (e.g. a `RedisGrammarCache`), ``stop_token_ids`` (the engine's EOS ids), ``config``.
    """
    return FDGuidedBackend(fd_config, **kwargs)


class FDGuidedBackend:
    """FastDeploy's ``BackendBase``: compiles asynchronously and hands out processor futures.

    Owns the tokenizer view, the fd_guided backend and one `CompileService` (bounded L1 cache,
    optional shared L2 cache, identical compiles in flight shared). `GuidedDecoding` managers
    bound to it share that service, so a spec is compiled once per process.
    """

    def __init__(self, fd_config: Any, *, tokenizer: TokenizerBundle | str | None = None,
                 metrics: GuidedMetrics | None = None, shared_cache=None,
                 stop_token_ids: Sequence[int] | None = None, config: GuidedConfig | None = None):
        self.fd_config = fd_config
        self.config = config or guided_config_from_fd(fd_config)
        self.tokenizer = _resolve_tokenizer(fd_config, tokenizer)
        self.hf_tokenizer = self.tokenizer.hf_tokenizer  # FastDeploy's attribute name
        self.vocab_size = _vocab_size(fd_config, self.tokenizer)
        self.max_num_seqs = max_num_seqs_of(fd_config)
        self.metrics = metrics or GuidedMetrics()
        self.guided_backend = _create_backend(self.config, self.tokenizer, self.vocab_size, stop_token_ids)
        self.compile_service = CompileService(self.guided_backend, metrics=self.metrics, shared_cache=shared_cache)
        self.think_end_id = _think_end_id(fd_config, self.tokenizer)
        self._specs = _SpecCache()

    @property
    def stop_token_ids(self) -> list[int]:
        return list(self.guided_backend.stop_token_ids)

    def get_reasoning_parser(self) -> "ReasoningEndParser | None":
        """A parser with ``is_reasoning_end(ids)`` when a reasoning parser is configured, else None."""
        return ReasoningEndParser(self.think_end_id) if self.think_end_id is not None else None

    def get_logits_processor(self, schemata_key: tuple[str, str], enable_thinking: bool = False) -> "ProcessorFuture":
        """Start compiling (never blocks on it); the future resolves to a `LogitsProcessor`.

        A bad key or a compile failure is raised by ``future.result()`` (InvalidGrammarError),
        never returned as a None processor. `enable_thinking`: the request thinks first (pass
        the request's chat-template flag; FastDeploy's runner hard-codes False, which here means
        "constrained from the first token").
        """
        try:
            spec = self._specs.get_or_parse(schemata_key, self._parse_checked)
        except GuidedDecodingError as error:
            return ProcessorFuture.failed(self, error, enable_thinking)
        except Exception as error:  # never raise into the runner's insert loop
            wrapped = InvalidGrammarError(f"{type(error).__name__}: {error}", part="schemata_key")
            return ProcessorFuture.failed(self, wrapped, enable_thinking)
        return ProcessorFuture(self, spec, self.compile_service.submit(spec), enable_thinking)

    def _init_logits_processor(self, schemata_key: tuple[str, str], enable_thinking: bool = False) -> "LogitsProcessor":
        """Blocking variant (FastDeploy's name): compile, wait, return the processor."""
        return self.get_logits_processor(schemata_key, enable_thinking).result(timeout=self.config.compile_timeout_s)

    def _parse_checked(self, schemata_key) -> GrammarSpec:
        # The worker re-checks: requests that skipped admission (FastDeploy's offline path) too.
        spec = spec_from_schemata_key(schemata_key, self.config)
        type(self.guided_backend).check(spec)
        return spec

    def allocate_token_bitmask(self, rows: int | None = None):
        return self.guided_backend.allocate_bitmask(rows or self.max_num_seqs)

    def close(self) -> None:
        self.compile_service.close()
        self.guided_backend.close()


def _resolve_tokenizer(fd_config: Any, tokenizer: TokenizerBundle | str | None) -> TokenizerBundle:
    if isinstance(tokenizer, TokenizerBundle):
        return tokenizer
    name = tokenizer or _read(fd_config, "tokenizer") or _read(getattr(fd_config, "model_config", None), "model")
    if isinstance(name, TokenizerBundle):
        return name
    if not name:
        raise ValueError("no tokenizer: pass tokenizer= or set fd_config.model_config.model")
    return load_tokenizer(str(name))


def _think_end_id(fd_config: Any, tokenizer: TokenizerBundle) -> int | None:
    """The think-end token when a reasoning parser is configured (FastDeploy: server-wide)."""
    parser = _read(getattr(fd_config, "structured_outputs_config", None), "reasoning_parser")
    if not parser:
        return None
    if tokenizer.think_end_id is None:
        logger.warning("reasoning_parser %r is set but the tokenizer has no think-end token: no reasoning gating", parser)
    return tokenizer.think_end_id


def _vocab_size(fd_config: Any, tokenizer: TokenizerBundle) -> int:
    size = _read(getattr(fd_config, "model_config", None), "vocab_size")
    return int(size) if size else (tokenizer.padded_vocab_size or tokenizer.vocab_size)


def max_num_seqs_of(fd_config: Any) -> int:
    size = _read(getattr(fd_config, "scheduler_config", None), "max_num_seqs")
    if not size:
        raise ValueError("fd_config.scheduler_config.max_num_seqs is required")
    return int(size)


def _create_backend(config: GuidedConfig, tokenizer: TokenizerBundle, vocab_size: int, stop_token_ids):
    backend_class = get_backend_class(config.backend)
    kwargs: dict[str, Any] = {"vocab_size": vocab_size, "config": config}
    if stop_token_ids is not None:
        kwargs["stop_token_ids"] = list(stop_token_ids)  # FastDeploy never passed the engine's EOS ids
    return backend_class(tokenizer, **kwargs)


class _SpecCache:
    """schemata key -> parsed spec, so a request re-sent per prefill chunk is parsed once."""

    def __init__(self, limit: int = 1024):
        self._entries: OrderedDict[Any, GrammarSpec] = OrderedDict()
        self._limit = limit
        self._lock = threading.Lock()

    def get_or_parse(self, schemata_key, parse) -> GrammarSpec:
        cache_key = _hashable(schemata_key)
        with self._lock:
            spec = self._entries.get(cache_key)
            if spec is not None:
                self._entries.move_to_end(cache_key)
                return spec
        spec = parse(schemata_key)
        with self._lock:
            self._entries[cache_key] = spec
            while len(self._entries) > self._limit:
                self._entries.popitem(last=False)
        return spec


def _hashable(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return tuple(_hashable(item) for item in value)
    if isinstance(value, dict):
        return json.dumps(value, sort_keys=True)
    return value


class ProcessorFuture(Future):
    """The future `get_logits_processor` returns: a `LogitsProcessor` once the compile is done.

    It also carries what `GuidedDecoding` needs at insertion time, before the compile ends:
    the parsed ``spec``, the ``compile_future`` and the request's ``enable_thinking``.
    """

    def __init__(self, backend: FDGuidedBackend, spec: GrammarSpec | None, compile_future: Future | None,
                 enable_thinking: bool | None):
        super().__init__()
        self.backend = backend
        self.spec = spec
        self.compile_future = compile_future
        self.enable_thinking = enable_thinking
        if compile_future is not None:
            compile_future.add_done_callback(self._on_compiled)

    @classmethod
    def failed(cls, backend: FDGuidedBackend, error: BaseException, enable_thinking) -> "ProcessorFuture":
        future = cls(backend, None, None, enable_thinking)
        future.set_exception(error)
        return future

    def _on_compiled(self, compile_future: Future) -> None:
        if compile_future.cancelled():  # the compile service was closed
            self.cancel()
            return
        error = compile_future.exception()
        if error is not None:
            self.set_exception(error)
        else:
            self.set_result(LogitsProcessor(self.backend, compile_future.result(), self.enable_thinking))


class LogitsProcessor:
    """FastDeploy's per-request processor (``LogitsProcessorBase``) over one fd_guided matcher.

    ``is_terminated`` is a bool ATTRIBUTE, as FastDeploy's sampler reads it. `accept_token`
    returns False for a token the grammar rejects and leaves the matcher as it was (FastDeploy
    reset it, silently dropping the constraint). The matcher is created on first use.
    """

    def __init__(self, backend: FDGuidedBackend, compiled: CompiledGrammar, enable_thinking: bool | None = False):
        self.backend = backend
        self.compiled = compiled
        self.spec = compiled.spec
        self.enable_reasoning = bool(enable_thinking)
        self.reasoning_ended = False
        self.is_terminated = False
        self._grammar = None

    @property
    def grammar(self):
        if self._grammar is None:
            self._grammar = self.backend.guided_backend.new_grammar(self.compiled)
        return self._grammar

    def allocate_token_bitmask(self):
        return self.backend.allocate_token_bitmask()

    def fill_token_bitmask(self, token_bitmask, idx: int) -> None:
        self.grammar.fill_bitmask(token_bitmask, idx)

    def apply_token_mask(self, logits, token_bitmask, indices: Sequence[int] | None = None):
        apply_token_bitmask_inplace(logits, token_bitmask, indices=indices)
        return logits

    def accept_token(self, token: int) -> bool:
        if self.is_terminated:
            return False
        if not self.grammar.accept_token(int(token)):
            self.backend.metrics.inc("rejected_tokens_total")
            return False
        self.is_terminated = self.grammar.is_terminated()
        return True

    def rollback(self, num_tokens: int) -> None:
        self.grammar.rollback(num_tokens)
        self.is_terminated = self.grammar.is_terminated()

    def reset(self) -> None:
        self.grammar.reset()
        self.is_terminated = False
        self.reasoning_ended = False

    def copy(self) -> "LogitsProcessor":
        """A fresh processor (start state) for the same compiled grammar and reasoning flag."""
        return LogitsProcessor(self.backend, self.compiled, self.enable_reasoning)


class ReasoningEndParser:
    """The part of FastDeploy's reasoning parser guided decoding uses: the think-end token."""

    def __init__(self, think_end_token_id: int):
        self.think_end_token_id = think_end_token_id

    def is_reasoning_end(self, input_ids: Sequence[int]) -> bool:
        return self.think_end_token_id in input_ids


# ----- sampler side ---------------------------------------------------------------------------

class GuidedDecoding:
    """FastDeploy's sampler-side ``GuidedDecoding``: slot-indexed hooks over one manager.

    Logits row i is slot i (FastDeploy's layout). The manager is built on the first processor
    future, sharing that backend's compile service (or at once when `backend` is given).
    Per slot it keeps only the translation state: which spec a slot holds, replays waiting for
    the slot's final prefill chunk, and finished slots, whose rows allow only stop tokens until
    the host retires them, so a rejected token can never lead to unconstrained text.
    """

    def __init__(self, fd_config: Any, backend: FDGuidedBackend | None = None):
        self.fd_config = fd_config
        self.max_num_seqs = max_num_seqs_of(fd_config)
        self.backend: FDGuidedBackend | None = None
        self.manager: GuidedDecodingManager | None = None
        self._handoff: _HandoffCompileService | None = None
        self._think_end_id: int | None = None
        self._reasoning_parser_set = False
        self._specs: dict[int, GrammarSpec] = {}
        self._waiting_replay: dict[int, tuple[ProcessorFuture, list[int], list[int]]] = {}
        self._prefilling: set[int] = set()
        self._finishes: dict[int, GuidedFinish] = {}
        self._stop_bitmask = None
        self._planned_rows: int | None = None
        self._last_rows = 0
        if backend is not None:
            self._bind(backend)

    # ----- insertion --------------------------------------------------------------------------

    def apply_reasoning_parser(self, reasoning_parser: Any) -> None:
        """Use the parser's ``think_end_token_id`` to gate requests that think (None: no reasoning)."""
        self._think_end_id = getattr(reasoning_parser, "think_end_token_id", None) if reasoning_parser else None
        self._reasoning_parser_set = True
        if self.manager is not None:
            self.manager.think_end_id = self._think_end_id

    set_reasoning_parser = apply_reasoning_parser

    def add_logits_processor(self, idx: int, future: ProcessorFuture | None = None, prefill_tokens: Sequence[int] = (),
                             *, prefill_done: bool | None = None, prompt_token_ids: Sequence[int] = ()) -> None:
        """Guide slot `idx` with the request behind `future` (None: the slot is unguided).

        `prefill_tokens` are tokens the request already generated (from a prefill instance, or
        before a preemption): they are replayed into the matcher, reasoning state included.
        `prefill_done` defaults to FastDeploy's rule (done iff tokens were given); a resumed
        request whose prompt is re-prefilled in chunks passes False and appears in
        ``prefill_done_idxs`` at its final chunk. Calling this again for the same spec while the
        slot is still prefilling (FastDeploy re-sends the request per chunk) changes nothing.
        """
        if future is None:
            self.reset_processor(idx)
            return
        self._bind(future.backend)
        self._check_slot(idx)
        tokens = [int(t) for t in prefill_tokens]
        if not tokens and idx in self._prefilling and self._specs.get(idx) == future.spec:
            return
        self.reset_processor(idx)
        if future.spec is None:  # the key did not parse: fail the request, never run it unconstrained
            self._finish(GuidedFinish(idx, "error", f"invalid guided request: {future.exception()}"))
            return
        self._specs[idx] = future.spec
        done = bool(tokens) if prefill_done is None else prefill_done
        if tokens and not done:
            self._waiting_replay[idx] = (future, tokens, list(prompt_token_ids))
            return
        self._add(idx, future, tokens, list(prompt_token_ids), done)

    def _add(self, idx: int, future: ProcessorFuture, tokens: list[int], prompt: list[int], done: bool) -> None:
        self._handoff.hand_over(future.spec, future.compile_future)
        self.manager.add_request(idx, future.spec, prompt_token_ids=prompt, output_token_ids=tokens,
                                 enable_thinking=future.enable_thinking, prefill_done=done)
        if not done:
            self._prefilling.add(idx)

    def reset_processor(self, idx: int) -> None:
        """Forget slot `idx` (finished, aborted, preempted or reused)."""
        if self.manager is not None:
            self.manager.release(idx)
        self._specs.pop(idx, None)
        self._waiting_replay.pop(idx, None)
        self._prefilling.discard(idx)
        self._finishes.pop(idx, None)

    # ----- the step ---------------------------------------------------------------------------

    def pre_process(self, prefill_done_idxs: Sequence[int] = ()) -> None:
        """Before the forward: mark slots whose prefill ends this step and start the bitmask fills."""
        if self.manager is None:
            return
        self._mark_prefill_done(prefill_done_idxs)
        self._plan(max(self._last_rows, self._highest_slot() + 1))

    update_vocab_mask = pre_process

    def apply_token_mask(self, logits, prefill_done_idxs: Sequence[int] = ()):
        """Join fills (and any compile still running) and mask `logits` in place; returns `logits`."""
        if self.manager is None:
            return logits
        rows = int(logits.shape[0])
        if self._planned_rows is None:  # a runner that skipped pre_process
            self._mark_prefill_done(prefill_done_idxs)
        if self._planned_rows != rows:
            self._plan(rows)
        self._last_rows = rows
        self.manager.apply(logits)
        stop_rows = [idx for idx in self._finishes if idx < rows]
        if stop_rows:
            apply_token_bitmask_inplace(logits, self._stop_only_bitmask(), indices=stop_rows, impl=self.manager.kernel_impl)
        return logits

    def post_process(self, sampled_token_ids) -> list[GuidedFinish]:
        """Advance every guided slot by its row's sampled token; returns slots finished now.

        A negative token means the slot stopped (FastDeploy's convention): it is released.
        A rejected token finishes its slot with an error (counted in ``rejected_tokens_total``).
        """
        if self.manager is None or self._planned_rows is None:
            return []
        tokens = _token_list(sampled_token_ids)
        if len(tokens) != self._planned_rows:
            raise SlotStateError(f"post_process got {len(tokens)} tokens for {self._planned_rows} logits rows")
        for idx, token in enumerate(tokens):
            if token < 0 and (idx in self._specs or idx in self._finishes):
                self.reset_processor(idx)
        finishes = self.manager.accept(tokens)
        for finish in finishes:
            self._finish(finish)
        self._planned_rows = None
        return finishes

    update_output_tokens = post_process

    def join_async_fillmask(self) -> None:
        """Kept for FastDeploy's name; fills are joined inside `apply_token_mask`."""

    # ----- queries ----------------------------------------------------------------------------

    def finish_of(self, idx: int) -> GuidedFinish | None:
        """How guided decoding finished slot `idx` (``stop`` or ``error`` with the reason), or None."""
        return self._finishes.get(idx)

    @property
    def metrics(self) -> GuidedMetrics | None:
        return self.backend.metrics if self.backend else None

    def close(self) -> None:
        if self.manager is not None:
            self.manager.close()

    # ----- internals --------------------------------------------------------------------------

    def _bind(self, backend: FDGuidedBackend) -> None:
        if self.backend is backend:
            return
        if self.backend is not None:
            raise SlotStateError("this GuidedDecoding is bound to another guided backend")
        self.backend = backend
        self._handoff = _HandoffCompileService(backend.compile_service)
        think_end = self._think_end_id if self._reasoning_parser_set else backend.think_end_id
        self.manager = GuidedDecodingManager(backend.guided_backend, self.max_num_seqs, metrics=backend.metrics,
                                             think_end_id=think_end, compile_service=self._handoff)

    def _mark_prefill_done(self, prefill_done_idxs: Sequence[int]) -> None:
        for idx in prefill_done_idxs:
            waiting = self._waiting_replay.pop(idx, None)
            if waiting is not None:
                future, tokens, prompt = waiting
                self._add(idx, future, tokens, prompt, True)
            self._prefilling.discard(idx)
        self.manager.mark_prefill_done(list(prefill_done_idxs))

    def _plan(self, rows: int) -> None:
        self.manager.begin_step(range(rows))
        self._planned_rows = rows

    def _highest_slot(self) -> int:
        return max([*self._specs, *self._finishes], default=-1)

    def _finish(self, finish: GuidedFinish) -> None:
        self._finishes[finish.slot] = finish
        self._prefilling.discard(finish.slot)

    def _stop_only_bitmask(self):
        if self._stop_bitmask is None:
            self._stop_bitmask = stop_only_bitmask(self.backend, self.max_num_seqs)
        return self._stop_bitmask

    def _check_slot(self, idx: int) -> None:
        if not isinstance(idx, int) or not 0 <= idx < self.max_num_seqs:
            raise SlotStateError(f"slot must be an int in [0, {self.max_num_seqs}), got {idx!r}")


class _HandoffCompileService:
    """The manager's compile service, fed the future `get_logits_processor` already started.

    So one request costs one compile lookup (and one count in the cache metrics), not two.
    """

    def __init__(self, service: CompileService):
        self.service = service
        self.metrics = service.metrics
        self._handed: tuple[GrammarSpec, Future] | None = None

    def hand_over(self, spec: GrammarSpec, future: Future) -> None:
        self._handed = (spec, future)

    def submit(self, spec: GrammarSpec) -> Future:
        handed, self._handed = self._handed, None
        if handed is not None and handed[0] == spec:
            return handed[1]
        return self.service.submit(spec)

    def close(self) -> None:
        """The backend owns the service."""


def stop_only_bitmask(backend: FDGuidedBackend, rows: int):
    """A bitmask whose every row allows only the backend's stop tokens."""
    bitmask = backend.allocate_token_bitmask(rows)
    view = bitmask.numpy() if hasattr(bitmask, "numpy") else np.asarray(bitmask)
    view[:] = 0
    for token in backend.stop_token_ids:
        word, bit = divmod(int(token), 32)
        view[:, word] |= np.array(1 << bit, dtype=np.uint32).view(np.int32)
    return bitmask


def _token_list(sampled_token_ids) -> list[int]:
    if hasattr(sampled_token_ids, "numpy"):
        sampled_token_ids = sampled_token_ids.numpy()
    return [int(t) for t in np.asarray(sampled_token_ids).reshape(-1)]


# ----- host registration ----------------------------------------------------------------------

_registration_lock = threading.Lock()
_registered = False
_HOOK_MARK = "__fd_guided_hook__"


def register() -> bool:
    """Entry point of the host plugin group: serve FastDeploy's guided decoding from fd_guided.

    FastDeploy calls every ``fastdeploy.model_register_plugins`` entry in every process (engine
    and each worker). If FastDeploy is importable, its ``get_guided_backend``, ``schema_checker``
    and the sampler's ``GuidedDecoding`` are wrapped so that the backend names in
    `served_backend_names` go to fd_guided and any other name to FastDeploy's own code.
    Idempotent: returns True the first time in a process, False afterwards, and never wraps twice.
    """
    global _registered
    with _registration_lock:
        if _registered:
            return False
        _install_host_hooks()
        _registered = True
        return True


def is_registered() -> bool:
    return _registered


def served_backend_names() -> tuple[str, ...]:
    names = os.environ.get("FD_GUIDED_BACKENDS")
    if not names:
        return DEFAULT_SERVED_NAMES
    return tuple(name.strip().lower() for name in names.split(",") if name.strip())


def _serves(backend_name: Any) -> bool:
    return isinstance(backend_name, str) and (
        backend_name.lower() in served_backend_names() or backend_name.lower().startswith("fd_guided:"))


def _config_backend_name(fd_config: Any) -> Any:
    return _read(getattr(fd_config, "structured_outputs_config", None), "guided_decoding_backend")


def _serves_config(fd_config: Any = None, *args, **kwargs) -> bool:
    return fd_config is not None and _serves(_config_backend_name(fd_config))


def _serves_name(backend_name: Any = None, *args, **kwargs) -> bool:
    return _serves(backend_name)


def _install_host_hooks() -> None:
    try:
        guided_module = importlib.import_module("fastdeploy.model_executor.guided_decoding")
    except ImportError:
        logger.debug("FastDeploy is not importable: fd_guided registered without host hooks")
        return
    _wrap(guided_module, "get_guided_backend", _serves_config, get_guided_backend)
    _wrap(guided_module, "schema_checker", _serves_name, schema_checker)
    try:
        sampler_module = importlib.import_module("fastdeploy.model_executor.layers.sample.sampler")
    except ImportError:
        logger.warning("FastDeploy's sampler module is not importable: its GuidedDecoding is not replaced")
        return
    _wrap(sampler_module, "GuidedDecoding", _serves_config, GuidedDecoding)


def _wrap(module: Any, name: str, serves, ours) -> None:
    original = getattr(module, name)
    if getattr(original, _HOOK_MARK, False):
        return  # a previous registration (e.g. before a module reload) already installed it

    @functools.wraps(original)
    def hook(*args, **kwargs):
        return ours(*args, **kwargs) if serves(*args, **kwargs) else original(*args, **kwargs)

    setattr(hook, _HOOK_MARK, True)
    setattr(module, name, hook)


__all__ = [
    "FDGuidedBackend",
    "GuidedDecoding",
    "HOST_PLUGIN_GROUP",
    "LogitsProcessor",
    "OPTIONS_KEY",
    "ProcessorFuture",
    "ReasoningEndParser",
    "SchemaChecker",
    "get_guided_backend",
    "guided_config_from_fd",
    "is_registered",
    "register",
    "request_enable_thinking",
    "schema_checker",
    "schemata_key_of",
    "spec_from_schemata_key",
    "write_spec_to_request",
]
