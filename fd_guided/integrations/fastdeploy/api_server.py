"""The API-server process: a guided refusal answered with HTTP 400 before the engine sees the request.

Why FastDeploy (8c3513a4) answers 500 on its own: its OpenAI routes (``entrypoints/openai/
api_server.py``, ``create_chat_completion`` / ``create_completion``) answer *every* ``ErrorResponse``
a serving handler returns with ``JSONResponse(..., status_code=500)``; and an engine refusal
(``EngineService._send_error_response``, ``error_code=400`` with `hooks.py`) travels back over ZMQ
as a finished result that the non-streaming generators turn into ``ValueError(error_msg)``, caught
as an ``internal_error`` ``ErrorResponse`` (the traceback in its message); a streaming request has
already answered 200 and gets an error chunk. Neither path reads ``error_code``.

The API server loads ``FD_PLUGINS`` plugins too: ``load_engine`` and each worker's lifespan call
``EngineArgs.create_engine_config``, whose ``ModelConfig`` imports the model registry, which runs
``fastdeploy.model_register_plugins`` (`hooks.register`). So, in that process, `hooks.py` installs:

- ``EngineClient.format_and_add_data`` (`install_engine_client`): the request dict the serving
  handler built (``to_dict_for_infer``; the fields ``Request.from_dict`` will carry to the engine) is
  admitted by the checker the engine builds (`admission.schema_checker` for the configured backend,
  the same verdict, bounds and cache), *before* tokenisation and before anything is sent. A refusal
  raises FastDeploy's own ``ParameterError(param, message)``, which both serving handlers answer with
  an ``ErrorResponse`` naming ``param`` (the request field) and the message (field path, feature).
  An admitted JSON document given as objects is sent on as its compact text (`documents_as_text`).
- the ``JSONResponse`` name the routes look up at call time (`install_api_server`): a subclass that
  answers 400 instead of 500 for an error body whose ``param`` is a guided field (FastDeploy raises
  no ``ParameterError`` with those names; only this check does), its ``type`` made OpenAI's
  ``invalid_request_error`` (``serving_completion`` writes ``invalid_request``).

A refusal only the engine or a worker makes (a compile that fails in the worker, deferred schema
checks) comes back as a result; `engine_results.py` answers those 400 too, for non-streaming
requests. What is left to an upstream change is in docs/fastdeploy-upstream.md.

With ``python -m fastdeploy.entrypoints.openai.api_server`` the routes' module is ``__main__``:
`api_server_module` finds it by its spec's name.
"""

from __future__ import annotations

import functools
import logging
import sys
from collections.abc import Mapping
from types import ModuleType
from typing import Any

from ...admission import json_text
from .admission import SchemaChecker, schema_checker
from .config import read, serves

logger = logging.getLogger(__name__)

API_SERVER_MODULE = "fastdeploy.entrypoints.openai.api_server"
ENGINE_CLIENT_MODULE = "fastdeploy.entrypoints.engine_client"
# The guided fields FastDeploy's ``Request.from_dict`` carries to the engine (what its checker sees).
ENGINE_FIELDS = (
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
    "structural_tag",
    "guided_json_object",
)
# ``to_dict_for_infer`` copies these response_format types into guided_json / guided_json_object / structural_tag.
RESPONSE_FORMAT_TYPES = ("json_schema", "json_object", "structural_tag")
DERIVED_FIELDS = frozenset(("guided_json", "guided_json_object", "structural_tag"))
GUIDED_PARAMS = frozenset((*ENGINE_FIELDS, "response_format"))
CLIENT_ERROR_TYPES = ("invalid_request_error", "invalid_request")  # chat's and completion's spelling
CHECKER_ATTRIBUTE = "_fd_guided_checker"


def api_server_module() -> ModuleType | None:
    """FastDeploy's API-server module if this process runs it, imported or as ``__main__``."""
    module = sys.modules.get(API_SERVER_MODULE)
    if module is not None:
        return module
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    return main if getattr(spec, "name", None) == API_SERVER_MODULE else None


# ----- admission before the engine -----------------------------------------------------------------


def install_engine_client(module: Any, mark: str) -> None:
    """Wrap ``EngineClient.format_and_add_data`` with the early guided check. Idempotent."""
    cls = getattr(module, "EngineClient", None)
    if not isinstance(cls, type):
        return
    original = vars(cls).get("format_and_add_data")
    if original is None or getattr(original, mark, False):
        return
    parameter_error = _parameter_error_class()

    @functools.wraps(original)
    async def format_and_add_data(self, prompts: dict, *args, **kwargs):
        checker = _checker_of(self)
        refusal = guided_refusal(checker, prompts)
        if refusal is not None:
            raise parameter_error(*refusal)  # serving_chat / serving_completion: an ErrorResponse naming it
        if checker is not None:
            documents_as_text(prompts)
        return await original(self, prompts, *args, **kwargs)

    setattr(format_and_add_data, mark, True)
    setattr(cls, "format_and_add_data", format_and_add_data)  # noqa: B010 - FastDeploy's class, untyped here


def _parameter_error_class() -> type[Exception]:
    from fastdeploy.utils import ParameterError

    return ParameterError


def _checker_of(engine_client: Any) -> SchemaChecker | None:
    """The checker the engine builds for this deployment (common_engine.py), once per client."""
    if CHECKER_ATTRIBUTE in vars(engine_client):
        return vars(engine_client)[CHECKER_ATTRIBUTE]
    structured = read(getattr(engine_client, "fd_config", None), "structured_outputs_config")
    backend = read(structured, "guided_decoding_backend")
    checker = None
    if serves(backend):  # FastDeploy's own checker (or none, "off") stays the engine's business
        checker = schema_checker(backend, disable_any_whitespace=read(structured, "disable_any_whitespace"))
    setattr(engine_client, CHECKER_ATTRIBUTE, checker)
    return checker


def guided_refusal(checker: SchemaChecker | None, task: Mapping[str, Any]) -> tuple[str, str] | None:
    """``(param, message)`` when `checker` refuses the guided fields `task` sends the engine, else None.

    The check runs on a copy (the engine admits, and normalises, the request as sent) and on the
    event loop: admission is bounded by its limits (`fd_guided.limits`), as FastDeploy's own
    tokenisation there is by the context length.
    """
    if checker is None:
        return None
    view = {name: task[name] for name in ENGINE_FIELDS if task.get(name) is not None}
    if not view:
        return None
    _, message = checker.schema_format(view)
    if message is None:
        return None
    return client_field(task) or next(iter(view)), str(message)


def documents_as_text(task: dict) -> None:
    """`task`'s JSON documents given as objects (``guided_json`` / ``structural_tag`` dicts: a
    client's ``response_format`` json_schema as ``to_dict_for_infer`` copies it) replaced, in
    place, by their compact JSON text: the same document (admission reads text and objects to one
    key and one verdict), which the engine's checker, on its one request-insertion thread, finds
    again by a sampled hash and a comparison (seen-before p99 0.13 ms as text) instead of writing
    the dict again to find its key (1.35 ms as objects; docs/benchmarks.md). Written here, in the
    API-server process, once the check above admitted it."""
    for name in ("guided_json", "structural_tag"):
        value = task.get(name)
        if isinstance(value, dict):
            text = json_text.write(value)
            if text is not None:  # None: not plain JSON (admission has refused it already)
                task[name] = text


def client_field(request: Any) -> str | None:
    """The guided field the client wrote in `request` (FastDeploy's pydantic request or its dict).

    ``response_format`` when FastDeploy derived the guided field from it (``to_dict_for_infer``
    copies a json_schema into ``guided_json``), else the first guided field set; None if none is.
    """
    present = [name for name in ENGINE_FIELDS if read(request, name) is not None]
    kind = read(read(request, "response_format"), "type")
    if kind in RESPONSE_FORMAT_TYPES and set(present) <= DERIVED_FIELDS:
        return "response_format"
    return present[0] if present else None


# ----- the status the routes answer with -----------------------------------------------------------


def install_api_server(module: Any, mark: str) -> None:
    """Rebind the routes' ``JSONResponse`` to one that answers a guided refusal with 400. Idempotent."""
    current = getattr(module, "JSONResponse", None)
    if not isinstance(current, type) or getattr(current, mark, False):
        return
    module.JSONResponse = client_errors_are_400(current, mark)  # the routes read it at call time


def client_errors_are_400(json_response: type, mark: str) -> type:
    """A `json_response` subclass: status 500 with a guided refusal's error body becomes 400."""

    class GuidedJSONResponse(json_response):
        def __init__(self, content: Any = None, status_code: int = 200, *args: Any, **kwargs: Any) -> None:
            if status_code == 500 and is_guided_refusal(content):
                status_code, content = 400, as_openai_error(content)
            super().__init__(content, status_code, *args, **kwargs)

    setattr(GuidedJSONResponse, mark, True)
    return GuidedJSONResponse


def is_guided_refusal(content: Any) -> bool:
    """An ``ErrorResponse`` body for a client error naming a guided field (only our check makes one)."""
    error = content.get("error") if isinstance(content, Mapping) else None
    return (
        isinstance(error, Mapping) and error.get("param") in GUIDED_PARAMS and error.get("type") in CLIENT_ERROR_TYPES
    )


def as_openai_error(content: Mapping[str, Any]) -> dict[str, Any]:
    """The body with OpenAI's error type (completions spell it ``invalid_request``)."""
    return {**content, "error": {**content["error"], "type": "invalid_request_error"}}
