"""fd_guided inside FastDeploy: one switch, ``FD_PLUGINS=fd_guided``.

Installing fd-guided declares ``fd_guided = fd_guided.integrations.fastdeploy:register`` in
FastDeploy's ``fastdeploy.model_register_plugins`` group. FastDeploy loads only the entries
named in ``FD_PLUGINS`` (comma-separated), in the engine and in every worker it starts (they
inherit the environment); `register` then makes FastDeploy's guided decoding fd_guided's, for
every ``--guided-decoding-backend`` but ``off``: ``auto``/``fd_guided`` (per request),
``xgrammar``, ``guidance``/``llguidance``, ``fd_guided:<registered name>``. See
docs/integration.md.

Modules, one concern each:

=============  ==============================================================================
config         FastDeploy config fields -> `GuidedConfig`; backend names
admission      engine process: ``schema_checker`` -> `SchemaChecker` (errors -> 400)
backend        worker: ``get_guided_backend`` -> `FDGuidedBackend`, processor futures
tokenizer      the served model's tokenizer (HF fast, ERNIE sentencepiece) as a bundle
sampler        worker: ``Sampler.guided_decoding`` -> `GuidedDecoding` over the manager
speculative    worker: ``SpeculativeSampler``: verification rows masked, accepted tokens pushed
mtp            worker: ``MTPSampler``: each MTP substep's drafts sampled under the grammar
reports        worker -> engine error reports (a failed request ends with its message)
hooks          `register`: patching FastDeploy at the narrowest points, any import order
post_import    the post-import hook `hooks` arms for modules imported later
patching       installing marked methods on a FastDeploy class, once
registration   the patcher `hooks` installs, called by admission and backend without a cycle
=============  ==============================================================================
"""

from .admission import (
    OPTIONS_KEY,
    AdmissionError,
    SchemaChecker,
    request_field_for,
    schema_checker,
    schemata_key_of,
    spec_from_schemata_key,
    write_spec_to_request,
)
from .backend import FDGuidedBackend, ProcessorFuture, RequestContext, get_guided_backend
from .config import as_bool, backend_name_for, guided_config_from_fd, serves
from .hooks import HOST_PLUGIN_GROUP, ensure_host_patched, is_registered, register
from .processor import LogitsProcessor, ReasoningEndParser
from .reports import ErrorReports
from .sampler import GuidedDecoding
from .tokenizer import bundle_from_sentencepiece, load_fd_tokenizer

__all__ = [
    "AdmissionError",
    "ErrorReports",
    "FDGuidedBackend",
    "GuidedDecoding",
    "HOST_PLUGIN_GROUP",
    "LogitsProcessor",
    "OPTIONS_KEY",
    "ProcessorFuture",
    "ReasoningEndParser",
    "RequestContext",
    "SchemaChecker",
    "as_bool",
    "backend_name_for",
    "bundle_from_sentencepiece",
    "ensure_host_patched",
    "get_guided_backend",
    "guided_config_from_fd",
    "is_registered",
    "load_fd_tokenizer",
    "register",
    "request_field_for",
    "schema_checker",
    "schemata_key_of",
    "serves",
    "spec_from_schemata_key",
    "write_spec_to_request",
]
