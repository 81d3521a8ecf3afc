"""Worker -> engine error reports: how a guided failure in a worker reaches the client.

FastDeploy's worker sends the engine one token id per request and step, nothing else: no channel
carries a per-request error message. So a guided request that fails in a worker (compile failure
or timeout, a rejected token) ends with a stop token FastDeploy's own path finishes it on, and the
worker leaves the reason here first; the engine's ``TokenProcessor`` (wrapped in `hooks.py`) takes
it when that request finishes and sets ``error_code``/``error_msg`` on the finishing
``RequestOutput``, which FastDeploy's API server turns into an error for the client.

Transport: one small file per failed request in a directory both processes derive from
``INFERENCE_MSG_QUEUE_ID`` (the engine sets it before it starts its workers, who inherit it), or
``FD_GUIDED_ERROR_DIR``. Files are written atomically (write, then rename) before the stop token is
even sampled, so the engine never sees a finished request before its report.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile

logger = logging.getLogger(__name__)

ERROR_DIR_ENV = "FD_GUIDED_ERROR_DIR"


class ErrorReports:
    """A directory of ``request_id -> (error_code, message)`` reports."""

    def __init__(self, directory: str):
        self.directory = directory

    @classmethod
    def for_this_deployment(cls) -> ErrorReports:
        directory = os.environ.get(ERROR_DIR_ENV)
        if not directory:
            queue = os.environ.get("INFERENCE_MSG_QUEUE_ID", "default")
            directory = os.path.join(tempfile.gettempdir(), f"fd_guided_errors_{os.getuid()}_{queue}")
        return cls(directory)

    def post(self, request_id: str, message: str, error_code: int = 500) -> None:
        """Leave a report for `request_id` (an I/O failure is logged, never raised into the step)."""
        try:
            os.makedirs(self.directory, exist_ok=True)
            path = self._path(request_id)
            fd, scratch = tempfile.mkstemp(dir=self.directory, suffix=".tmp")
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                json.dump({"request_id": request_id, "error_code": int(error_code), "message": str(message)}, handle)
            os.replace(scratch, path)
        except OSError as error:
            logger.warning("could not report guided failure of %s (%s): %s", request_id, message, error)

    def take(self, request_id: str) -> tuple[int, str] | None:
        """The report for `request_id`, removed; None if there is none."""
        path = self._path(request_id)
        try:
            with open(path, encoding="utf-8") as handle:
                report = json.load(handle)
            os.unlink(path)
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as error:
            logger.warning("unreadable guided failure report %s: %s", path, error)
            return None
        if report.get("request_id") != request_id:
            return None
        return int(report.get("error_code", 500)), str(report.get("message", "guided decoding failed"))

    def _path(self, request_id: str) -> str:
        digest = hashlib.sha1(str(request_id).encode("utf-8")).hexdigest()
        return os.path.join(self.directory, f"{digest}.json")
