"""Host patching: how FastDeploy's own code comes to call fd_guided, in every process.

FastDeploy loads ``fastdeploy.model_register_plugins`` entries named in ``FD_PLUGINS`` when
``fastdeploy.model_executor.models`` is imported (by ``ModelConfig``): in the engine during
``EngineArgs.create_engine_config``, in each worker during ``initialize_fd_config``. `register` then
patches the narrowest points, each idempotent (a marker on every wrapper) and each applied when its
module is loaded, whichever comes first: now if it is loaded, else right after its import (a
post-import hook on ``sys.meta_path``), and again whenever FastDeploy calls one of our factories.
That last one matters: FastDeploy's runner module imports the model registry, which loads the
plugins, halfway through its own import, before its class exists; the name it bound earlier is
rebound at once, and ``GPUModelRunner.__init__`` calls ``get_guided_backend`` (ours now) before
anything else guided happens, which wraps the finished class.

==========================================  ===============================================================
FastDeploy name                             change
==========================================  ===============================================================
``guided_decoding.get_guided_backend``,     served names (all but ``off``) go to fd_guided; modules that
``guided_decoding.schema_checker``          bound the originals by name at import are rebound
``sampler.GuidedDecoding``                  fd_guided's (`sampler.GuidedDecoding`)
``sampler.SpeculativeSampler``              its no-op guided hooks become fd_guided's; verification
                                            rows are masked before ``speculate_verify`` (`speculative.py`)
``sampler.MTPSampler``                      each MTP substep's draft rows are masked with the grammar
                                            after the drafts so far (`mtp.py`)
``FDConfig.postprocess`` / ``.check``       our backend names survive (FastDeploy rewrites ``auto`` to
                                            ``xgrammar`` and refuses the rest); XPU's ``off`` rule
                                            kept; speculative decoding no longer turns it off
``StructuredOutputsConfig.__init__``        the CLI's ``guided_decoding_disable_any_whitespace`` (a string)
                                            reaches ``disable_any_whitespace``
``<Runner>._init_logits_processor``         the returned future is bound to its ``Request``
``EngineService._send_error_response``      an admission refusal is ``error_code=400``
``TokenProcessor._recycle_resources``       a worker's guided failure becomes the result's error
``EngineClient.format_and_add_data``        API server: the engine's checker refuses a bad guided request
                                            before it is tokenised or sent (``ParameterError``)
``api_server.JSONResponse``                 API server: that refusal is answered 400, not 500
                                            (`api_server.py`; ``__main__`` when run with ``-m``)
``<Serving>.*_full_generator``,             API server: an engine's or worker's refusal result of a
``DealerConnectionManager.get_connection``  non-streaming guided request becomes that 400 too
                                            (`engine_results.py`)
==========================================  ===============================================================
"""

from __future__ import annotations

import functools
import logging
import sys
import threading
from collections.abc import Callable, Mapping
from typing import Any

from .admission import AdmissionError, schema_checker
from .api_server import (
    API_SERVER_MODULE,
    ENGINE_CLIENT_MODULE,
    api_server_module,
    install_api_server,
    install_engine_client,
)
from .backend import ProcessorFuture, get_guided_backend
from .config import as_bool, backend_name_for, read, serves
from .engine_results import (
    CONNECTIONS_MODULE,
    SERVING_CHAT_MODULE,
    SERVING_COMPLETION_MODULE,
    install_connections,
    install_serving_chat,
    install_serving_completion,
)
from .mtp import install as install_mtp
from .post_import import PostImportHook
from .registration import install_patcher
from .reports import ErrorReports
from .sampler import GuidedDecoding
from .speculative import install as install_speculative

logger = logging.getLogger(__name__)

HOST_PLUGIN_GROUP = "fastdeploy.model_register_plugins"
MARK = "__fd_guided_hook__"
RUNNER_MODULES = tuple(
    f"fastdeploy.worker.{name}_model_runner" for name in ("gpu", "dcu", "iluvatar", "metax", "gcu", "hpu")
)

_lock = threading.RLock()
_registered = False
_originals: dict[str, Callable] = {}


def register() -> bool:
    """Entry point of FastDeploy's plugin group. True the first time in a process, then False."""
    global _registered
    with _lock:
        if _registered:
            return False
        _registered = True
    ensure_host_patched()
    return True


def is_registered() -> bool:
    return _registered


def ensure_host_patched() -> None:
    """Apply every patch whose module is loaded and arm the rest for their import. Idempotent."""
    if not _registered:
        return  # only a registered plugin changes its host
    with _lock:
        for name, patch in _patches().items():
            module = sys.modules.get(name)
            if module is not None:
                patch(module)
        api_server = api_server_module()  # run as ``python -m``, its module is ``__main__``
        if api_server is not None:
            install_api_server(api_server, MARK)
        _rebind_by_name()
        if not any(isinstance(finder, PostImportHook) for finder in sys.meta_path):
            sys.meta_path.insert(0, PostImportHook(_patches(), _lock))


install_patcher(ensure_host_patched)


# ----- the patches ------------------------------------------------------------------------------


def _patches() -> dict[str, Callable[[Any], None]]:
    patches: dict[str, Callable[[Any], None]] = {
        "fastdeploy.model_executor.guided_decoding": _patch_guided_package,
        "fastdeploy.model_executor.layers.sample.sampler": _patch_sampler,
        "fastdeploy.config": _patch_config,
        "fastdeploy.engine.common_engine": _patch_engine,
        "fastdeploy.output.token_processor": _patch_token_processor,
        ENGINE_CLIENT_MODULE: functools.partial(install_engine_client, mark=MARK),
        API_SERVER_MODULE: functools.partial(install_api_server, mark=MARK),
        CONNECTIONS_MODULE: functools.partial(install_connections, mark=MARK),
        SERVING_CHAT_MODULE: functools.partial(install_serving_chat, mark=MARK),
        SERVING_COMPLETION_MODULE: functools.partial(install_serving_completion, mark=MARK),
    }
    patches.update({name: _patch_runner_module for name in RUNNER_MODULES})
    return patches


def _patch_guided_package(module) -> None:
    for name, ours, serves_call in (
        ("get_guided_backend", get_guided_backend, _serves_config),
        ("schema_checker", schema_checker, _serves_name),
    ):
        original = getattr(module, name)
        if getattr(original, MARK, False):
            continue
        _originals[name] = original
        setattr(module, name, _marked(functools.wraps(original)(_dispatch(original, ours, serves_call))))
    _rebind_by_name()


def _dispatch(original, ours, serves_call):
    def hook(*args, **kwargs):
        return ours(*args, **kwargs) if serves_call(*args, **kwargs) else original(*args, **kwargs)

    return hook


def _serves_config(fd_config=None, *args, **kwargs) -> bool:
    return serves(read(getattr(fd_config, "structured_outputs_config", None), "guided_decoding_backend"))


def _serves_name(backend_name=None, *args, **kwargs) -> bool:
    return serves(backend_name)


def _rebind_by_name() -> None:
    """Modules that did ``from ...guided_decoding import get_guided_backend`` hold the original."""
    package = sys.modules.get("fastdeploy.model_executor.guided_decoding")
    if package is None:
        return
    for name, original in _originals.items():
        for module_name, module in list(sys.modules.items()):
            # vars(), not getattr(): fastdeploy's own __getattr__ prints on every unknown name.
            if module_name.startswith("fastdeploy") and module is not package and vars(module).get(name) is original:
                setattr(module, name, getattr(package, name))


def _patch_sampler(module) -> None:
    speculative_sampler = getattr(module, "SpeculativeSampler", None)
    if isinstance(speculative_sampler, type):
        install_speculative(speculative_sampler, MARK)  # its guided hooks are no-ops in FastDeploy
    mtp_sampler = getattr(module, "MTPSampler", None)
    if isinstance(mtp_sampler, type):
        install_mtp(mtp_sampler, MARK)  # MTP drafts sampled under each request's grammar
    if getattr(module.GuidedDecoding, MARK, False) or module.GuidedDecoding is GuidedDecoding:
        return
    setattr(GuidedDecoding, MARK, True)
    module.GuidedDecoding = GuidedDecoding  # Sampler.__init__ looks the name up at call time


def _patch_config(module) -> None:
    for method in ("postprocess", "check"):
        _wrap_method(module.FDConfig, method, _keeping_our_backend_name)
    _wrap_method(module.StructuredOutputsConfig, "__init__", _reading_the_whitespace_flag)


def _keeping_our_backend_name(original):
    def method(self, *args, **kwargs):
        structured = getattr(self, "structured_outputs_config", None)
        name = read(structured, "guided_decoding_backend")
        if not serves(name):
            return original(self, *args, **kwargs)
        from ...registry import get_backend_class

        get_backend_class(backend_name_for(name))  # an unknown fd_guided:<name> fails at start-up
        # FastDeploy's code rewrites "auto" to "xgrammar" and refuses other names; let it run its
        # other rules on a name it knows. XPU still turns guided decoding "off". Speculative
        # decoding does not: fd_guided masks the verification rows (`speculative.py`), so its
        # guided rules (postprocess: "off"; check: "do not support guided_decoding") see "off".
        lifted = _speculative_lifted(self)
        assert structured is not None  # the name it serves was read from it
        structured.guided_decoding_backend = "off" if lifted else "xgrammar"
        try:
            return original(self, *args, **kwargs)
        finally:
            if lifted or structured.guided_decoding_backend != "off":
                structured.guided_decoding_backend = name

    return method


def _speculative_lifted(fd_config) -> bool:
    """Speculative decoding with guided decoding on a platform fd_guided serves (not XPU)."""
    method = read(getattr(fd_config, "speculative_config", None), "method")
    if method is None:
        return False
    from fastdeploy.platforms import current_platform

    return not current_platform.is_xpu()


def _reading_the_whitespace_flag(original):
    def method(self, args, *rest, **kwargs):
        original(self, args, *rest, **kwargs)
        # The engine's CLI field has another name (and type=str): FastDeploy never copied it.
        value = args.get("guided_decoding_disable_any_whitespace") if isinstance(args, Mapping) else None
        if value is not None and value != "None":
            self.disable_any_whitespace = as_bool(value, "guided_decoding_disable_any_whitespace")

    return method


def _patch_runner_module(module) -> None:
    _rebind_by_name()
    for value in list(vars(module).values()):
        if isinstance(value, type) and value.__module__ == module.__name__ and "_init_logits_processor" in vars(value):
            _wrap_method(value, "_init_logits_processor", _binding_the_request)


def _binding_the_request(original):
    def method(self, request, *args, **kwargs):
        result = original(self, request, *args, **kwargs)
        future = result[0] if isinstance(result, tuple) and result else result
        if isinstance(future, ProcessorFuture):
            future.bind_request(request)  # the runner passes enable_thinking=False and no request
        return result

    return method


def _patch_engine(module) -> None:
    _rebind_by_name()
    _wrap_method(module.EngineService, "_send_error_response", _admission_errors_are_400)
    token_processor = getattr(module, "TokenProcessor", None)
    if isinstance(token_processor, type) and hasattr(token_processor, "_recycle_resources"):
        _wrap_method(token_processor, "_recycle_resources", _attaching_worker_errors)


def _admission_errors_are_400(original):
    def method(self, request_id, error_msg, error_code: int = 500, *args, **kwargs):
        if isinstance(error_msg, AdmissionError):
            error_code, error_msg = error_msg.http_status, str(error_msg)
        return original(self, request_id, error_msg, error_code, *args, **kwargs)

    return method


def _patch_token_processor(module) -> None:
    _wrap_method(module.TokenProcessor, "_recycle_resources", _attaching_worker_errors)


def _attaching_worker_errors(original):
    def method(self, task_id, index, task, result=None, *args, **kwargs):
        if result is not None:
            report = ErrorReports.for_this_deployment().take(str(task_id))
            if report is not None:
                result.error_code, result.error_msg = report
        return original(self, task_id, index, task, result, *args, **kwargs)

    return method


def _wrap_method(cls, name: str, make: Callable[[Callable], Callable]) -> None:
    original = vars(cls).get(name)
    if original is None or getattr(original, MARK, False):
        return
    setattr(cls, name, _marked(functools.wraps(original)(make(original))))


def _marked(function):
    setattr(function, MARK, True)
    return function
