"""Worker backend: FastDeploy's ``get_guided_backend`` / ``BackendBase`` / ``LogitsProcessorBase``.

One `FDGuidedBackend` per worker process (per tensor-parallel rank), built by the runner's
``__init__``: ``get_guided_backend(fd_config=...)``. It owns the tokenizer view, the fd_guided
backend and one `CompileService` (bounded cache, compiles in flight shared). For each PREFILL task
the runner asks ``get_logits_processor(schemata_key, enable_thinking=...)`` and hands the returned
`ProcessorFuture` to the sampler (`sampler.GuidedDecoding`). The future carries what the sampler
needs before the compile ends: the parsed spec, the compile future and, once `hooks.py` has bound
it, the `RequestContext` of the request that asked (FastDeploy's runner never passes the request).
"""

from __future__ import annotations

import json
import logging
import threading
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from ...compile import CompileService
from ...config import GuidedConfig
from ...errors import GuidedDecodingError, InvalidGrammarError
from ...metrics import GuidedMetrics
from ...registry import get_backend_class
from ...spec import GrammarSpec
from ...tokenizer import TokenizerBundle, load_tokenizer
from .admission import spec_from_schemata_key
from .config import guided_config_from_fd, max_num_seqs_of, read
from .processor import LogitsProcessor, ReasoningEndParser
from .registration import ensure_host_patched
from .tokenizer import load_fd_tokenizer

logger = logging.getLogger(__name__)


def get_guided_backend(fd_config: Any, **kwargs) -> FDGuidedBackend:
    """FastDeploy's ``get_guided_backend``. kwargs: see `FDGuidedBackend`."""
    ensure_host_patched()  # the runner module calling us is loaded by now, whatever the import order
    return FDGuidedBackend(fd_config, **kwargs)


@dataclass(frozen=True)
class RequestContext:
    """What the sampler needs from FastDeploy's ``Request`` (bound by `hooks.py` at insertion).

    `final_chunk`: this PREFILL task's forward ends the request's prefill (its next sample is a
    generated token); None when the task carries no ``prefill_end_index`` (FastDeploy's v0 path).
    `output_token_ids` are tokens already generated (before a preemption, or by a prefill instance).
    `max_tokens`: FastDeploy's ``max_tokens`` (its ``max_dec_len``, reasoning included; None when
    absent) and `fit_budget` the request's ``guided_fit_budget``: the guided output is steered to
    end complete within them (`fd_guided.budget`).
    """

    request_id: str | None
    prompt_token_ids: tuple[int, ...]
    output_token_ids: tuple[int, ...]
    enable_thinking: bool | None
    final_chunk: bool | None
    max_tokens: int | None = None
    fit_budget: bool = True

    @classmethod
    def of(cls, request: Any) -> RequestContext:
        prompt = _ints(read(request, "prompt_token_ids"))
        output = _ints(read(request, "output_token_ids"))
        end = read(request, "prefill_end_index")
        getter = getattr(request, "get", None)
        thinking = getter("enable_thinking", None) if callable(getter) else read(request, "enable_thinking")
        # Request.get reads its sampling_params too (max_tokens lives there).
        max_tokens = getter("max_tokens", None) if callable(getter) else read(request, "max_tokens")
        fit = getter("guided_fit_budget", None) if callable(getter) else read(request, "guided_fit_budget")
        return cls(
            request_id=None if read(request, "request_id") is None else str(read(request, "request_id")),
            prompt_token_ids=prompt,
            output_token_ids=output,
            enable_thinking=None if thinking is None else bool(thinking),
            # v1 PREFILL tasks carry the chunk's end; v0 leaves Request's default 0: unknown then.
            final_chunk=None if end is None or int(end) <= 0 else int(end) >= len(prompt) + len(output),
            max_tokens=int(max_tokens) if isinstance(max_tokens, int) and max_tokens > 1 else None,
            fit_budget=fit is not False,
        )


def _ints(values: Any) -> tuple[int, ...]:
    if values is None:
        return ()
    if hasattr(values, "tolist"):
        values = values.tolist()
    return tuple(int(v) for v in values)


class FDGuidedBackend:
    """FastDeploy's ``BackendBase``: compiles asynchronously and hands out processor futures.

    kwargs: ``tokenizer`` (a TokenizerBundle or a name/path; default: the served model's, loaded
    as FastDeploy loads it), ``metrics``, ``shared_cache`` (e.g. `RedisGrammarCache`),
    ``stop_token_ids`` (the engine's EOS ids; default the tokenizer's and generation_config's),
    ``config`` (a GuidedConfig; default read from `fd_config`).
    """

    def __init__(
        self,
        fd_config: Any,
        *,
        tokenizer: TokenizerBundle | str | None = None,
        metrics: GuidedMetrics | None = None,
        shared_cache=None,
        stop_token_ids: Sequence[int] | None = None,
        config: GuidedConfig | None = None,
    ):
        self.fd_config = fd_config
        self.config = config or guided_config_from_fd(fd_config)
        self.tokenizer = (
            tokenizer
            if isinstance(tokenizer, TokenizerBundle)
            else (load_tokenizer(tokenizer) if tokenizer else load_fd_tokenizer(fd_config))
        )
        self.hf_tokenizer = self.tokenizer.hf_tokenizer  # FastDeploy's attribute name
        size = read(getattr(fd_config, "model_config", None), "vocab_size")
        self.vocab_size = int(size) if size else (self.tokenizer.padded_vocab_size or self.tokenizer.vocab_size)
        self.max_num_seqs = max_num_seqs_of(fd_config)
        self.metrics = metrics or GuidedMetrics()
        kwargs: dict[str, Any] = {"vocab_size": self.vocab_size, "config": self.config}
        if stop_token_ids is not None:
            kwargs["stop_token_ids"] = list(stop_token_ids)
        self.guided_backend = get_backend_class(self.config.backend)(self.tokenizer, **kwargs)
        self.compile_service = CompileService(self.guided_backend, metrics=self.metrics, shared_cache=shared_cache)
        parser = read(getattr(fd_config, "structured_outputs_config", None), "reasoning_parser")
        # Reasoning gating needs a think-end token; FastDeploy configures it server-wide by parser.
        self.think_end_id = self.tokenizer.think_end_id if parser and str(parser) != "None" else None
        if parser and str(parser) != "None" and self.think_end_id is None:
            logger.warning(
                "reasoning_parser %r is set but the tokenizer has no %r token: no reasoning gating", parser, "</think>"
            )
        self._specs = _SpecCache()

    @property
    def stop_token_ids(self) -> list[int]:
        return list(self.guided_backend.stop_token_ids)

    def get_reasoning_parser(self) -> ReasoningEndParser | None:
        """A parser with ``is_reasoning_end(ids)`` when a reasoning parser is configured, else None."""
        return ReasoningEndParser(self.think_end_id) if self.think_end_id is not None else None

    def get_logits_processor(
        self, schemata_key: tuple[str, str], enable_thinking: bool | None = False
    ) -> ProcessorFuture:
        """Start compiling (never blocks); the future resolves to a `LogitsProcessor`.

        A bad key or a compile failure is raised by ``future.result()`` (InvalidGrammarError),
        never returned as a None processor. The worker re-checks the key, so a request that
        skipped admission (FastDeploy's offline path) is still refused cleanly.
        """
        try:
            spec = self._specs.get_or_parse(schemata_key, self._parse)
        except GuidedDecodingError as error:
            return ProcessorFuture.failed(self, error, enable_thinking)
        except Exception as error:  # never raise into the runner's insert loop
            return ProcessorFuture.failed(
                self, InvalidGrammarError(f"{type(error).__name__}: {error}", part="schemata_key"), enable_thinking
            )
        return ProcessorFuture(self, spec, self.compile_service.submit(spec), enable_thinking)

    def _init_logits_processor(self, schemata_key: tuple[str, str], enable_thinking: bool | None = False):
        """Blocking variant (FastDeploy's name): compile, wait, return the processor."""
        return self.get_logits_processor(schemata_key, enable_thinking).result(timeout=self.config.compile_timeout_s)

    def _parse(self, schemata_key) -> GrammarSpec:
        # Admission's bounded parse only: the runner's insertion thread never runs the backend's
        # check (the schema normaliser); the compile service runs it in a worker with the choice of
        # engines, and its refusal fails the future (`CompileService.submit`).
        return spec_from_schemata_key(schemata_key, self.config)

    def allocate_token_bitmask(self, rows: int | None = None):
        return self.guided_backend.allocate_bitmask(rows or self.max_num_seqs)

    def close(self) -> None:
        self.compile_service.close()
        self.guided_backend.close()


class _SpecCache:
    """schemata key -> parsed spec, so a request re-sent per prefill chunk is parsed once."""

    def __init__(self, limit: int = 1024):
        self._entries: OrderedDict[Any, GrammarSpec] = OrderedDict()
        self._limit = limit
        self._lock = threading.Lock()

    def get_or_parse(self, schemata_key, parse) -> GrammarSpec:
        cache_key = (
            json.dumps(schemata_key, sort_keys=True, default=str)
            if not isinstance(schemata_key, tuple)
            else tuple(json.dumps(part, sort_keys=True) if isinstance(part, dict) else part for part in schemata_key)
        )
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


class ProcessorFuture(Future):
    """The future `get_logits_processor` returns: a `LogitsProcessor` once the compile is done.

    Also carries ``backend``, ``spec`` (None if the key did not parse), ``compile_future``,
    ``enable_thinking`` (what the runner passed) and ``request`` (a `RequestContext` or None).
    """

    def __init__(
        self,
        backend: FDGuidedBackend,
        spec: GrammarSpec | None,
        compile_future: Future | None,
        enable_thinking: bool | None,
    ):
        super().__init__()
        self.backend = backend
        self.spec = spec
        self.compile_future = compile_future
        self.enable_thinking = enable_thinking
        self.request: RequestContext | None = None
        if compile_future is not None:
            compile_future.add_done_callback(self._on_compiled)

    @classmethod
    def failed(cls, backend: FDGuidedBackend, error: BaseException, enable_thinking) -> ProcessorFuture:
        future = cls(backend, None, None, enable_thinking)
        future.set_exception(error)
        return future

    def bind_request(self, request: Any) -> ProcessorFuture:
        """Attach the FastDeploy ``Request`` this future was made for (see `RequestContext`)."""
        self.request = RequestContext.of(request)
        return self

    def _on_compiled(self, compile_future: Future) -> None:
        if compile_future.cancelled():  # the compile service was closed
            self.cancel()
        elif compile_future.exception() is not None:
            self.set_exception(compile_future.exception())
        else:
            self.set_result(LogitsProcessor(self.backend, compile_future.result(), self.enable_thinking))


class HandoffCompileService:
    """The manager's compile service, fed the future `get_logits_processor` already started.

    So one request costs one compile lookup (and one count in the cache metrics), not two.
    """

    def __init__(self, service):
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
