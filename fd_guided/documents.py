"""Moved to `fd_guided.admission.documents`; re-exported here."""

from __future__ import annotations

from .admission.documents import MAX_NESTING, as_dict, check_document, check_text, load_json

__all__ = ["MAX_NESTING", "as_dict", "check_document", "check_text", "load_json"]
