"""Config translation: FastDeploy's names and values -> fd_guided's.

FastDeploy carries guided decoding in ``fd_config.structured_outputs_config``:
``guided_decoding_backend`` (the engine's ``--guided-decoding-backend``, the worker's
``--guided_decoding_backend``), ``disable_any_whitespace`` (a bool; the engine CLI's
``--guided-decoding-disable-any-whitespace`` is a *string* under another name, which
`hooks.py` copies over) and ``reasoning_parser``. The batch size is
``scheduler_config.max_num_seqs`` and the logits width ``model_config.vocab_size``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from ...config import GuidedConfig
from ...registry import available_backends

# FastDeploy's backend names (and ours) -> fd_guided registry names. With the plugin loaded every
# name is served here; "fd_guided:<name>" picks any registered backend, third parties' included.
BACKEND_ALIASES = {
    "auto": "auto",
    "fd_guided": "auto",
    "xgrammar": "xgrammar",
    "guidance": "llguidance",
    "llguidance": "llguidance",
}
OFF_NAMES = ("off", "none", "")


def backend_name_for(host_name: Any) -> str:
    """Our registry name for a FastDeploy backend name (case-insensitive).

    ``auto``/``fd_guided`` -> ``auto`` (per request: xgrammar when it enforces the constraint
    faithfully, llguidance otherwise), ``xgrammar`` -> ``xgrammar``, ``guidance``/``llguidance``
    -> ``llguidance``, ``fd_guided:<name>`` -> ``<name>``. Raises ValueError for ``off`` and for
    names nobody serves.
    """
    name = str(host_name).strip().lower()
    if name in OFF_NAMES:
        raise ValueError("guided decoding is off (guided_decoding_backend='off')")
    if name.startswith("fd_guided:"):
        return name.split(":", 1)[1]
    if name not in BACKEND_ALIASES:
        raise ValueError(
            f"unknown guided decoding backend {host_name!r}; use one of "
            f"{', '.join(sorted(BACKEND_ALIASES))}, off, or fd_guided:<{'|'.join(available_backends())}>"
        )
    return BACKEND_ALIASES[name]


def serves(host_name: Any) -> bool:
    """True for every backend name fd_guided answers for (all but ``off``/None/unknown)."""
    if not isinstance(host_name, str):
        return False
    try:
        backend_name_for(host_name)
    except ValueError:
        return False
    return True


def guided_config_from_fd(fd_config: Any, **overrides) -> GuidedConfig:
    """The `GuidedConfig` a FastDeploy config asks for; `overrides` win.

    Reads ``structured_outputs_config.guided_decoding_backend`` and ``.disable_any_whitespace``
    (the field FastDeploy really carries, in the engine and in every worker). A CLI string is
    parsed ("false" is False here, unlike ``bool("false")``).
    """
    structured = getattr(fd_config, "structured_outputs_config", None)
    changes: dict[str, Any] = {"backend": backend_name_for(read(structured, "guided_decoding_backend") or "auto")}
    disable = overrides.pop("disable_any_whitespace", None)
    if disable is None:
        disable = read(structured, "disable_any_whitespace")
    if disable is not None:
        changes["any_whitespace"] = not as_bool(disable, "disable_any_whitespace")
    # FastDeploy samples every row each step and its scheduler cannot hold a request until its
    # grammar is ready (docs/fastdeploy-upstream.md proposes that hook), so a request's first
    # sample may wait for its compile, up to the compile budget. Under ``auto`` llguidance
    # compiles in milliseconds, so this wait is rarely more than that.
    changes["first_token_wait_s"] = float(
        os.environ.get("FD_GUIDED_FIRST_TOKEN_WAIT_S", GuidedConfig().compile_timeout_s)
    )
    changes.update(overrides)
    return GuidedConfig().replace(**changes)


def as_bool(value: Any, name: str) -> bool:
    """A flag given as bool, 0/1 or CLI string ("true"/"false"/"1"/"0"/"yes"/"no"/"on"/"off")."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in ("true", "1", "yes", "on", "false", "0", "no", "off"):
        return value.strip().lower() in ("true", "1", "yes", "on")
    raise ValueError(f"{name} must be a boolean, got {value!r}")


def max_num_seqs_of(fd_config: Any) -> int:
    size = read(getattr(fd_config, "scheduler_config", None), "max_num_seqs")
    if not size:
        raise ValueError("fd_config.scheduler_config.max_num_seqs is required")
    return int(size)


def tensor_parallel_rank_of(fd_config: Any) -> int:
    return int(read(getattr(fd_config, "parallel_config", None), "tensor_parallel_rank") or 0)


def read(obj: Any, name: str) -> Any:
    """``obj.name`` or ``obj[name]``; None when absent (FastDeploy objects and plain dicts alike)."""
    if obj is None:
        return None
    if isinstance(obj, Mapping):
        return obj.get(name)
    return getattr(obj, name, None)


def write(obj: Any, name: str, value: Any) -> None:
    if isinstance(obj, dict):
        obj[name] = value
    else:
        setattr(obj, name, value)
