"""Bounded inputs: refuse what cannot be served before spending memory or CPU on it.

`BodyLimit` (ASGI middleware): a body whose ``Content-Length`` exceeds the bound is answered 413
before one byte of it is read; a chunked body is read here and refused (413) the moment it crosses
the bound, so at most the bound (plus one network read) is ever held for a request.

`PromptBound`: a prompt that cannot fit the context is refused before it is tokenised in full. No
token is longer than the tokenizer's longest (128 bytes for DeepSeek's), so a prompt of more UTF-8
bytes than ``context * longest`` is refused without tokenising anything; below that the prompt is
tokenised a piece at a time (`_PIECE_CHARS`, cut at whitespace) and refused as soon as the pieces
hold more tokens than the context (plus one per cut: a cut can split what would have been one
token). A prompt that is not refused that way is tokenised once more, whole: those ids are what the
engine request is given (`ReferenceEngine.submit(prompt_ids=...)`), so a prompt that fits is
tokenised whole exactly once, in the engine process's admission thread, whatever its ``n``. Not in
the API process: it holds no tokenizer (the engine's token bytes decode its streams), and a long
prompt's encode there would take its event loop's core or GIL, the latency issue #26 is about.
Before, a 21 MB chat body was parsed and tokenised in full (7 million tokens, ~60 s, the server's
RSS from 0.85 to 3.5 GB) only to be refused for exceeding 4,096 tokens.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from fd_guided.harness.server.errors import RequestError, error_response

_PIECE_CHARS = 8192


class BodyLimit:
    """ASGI middleware: HTTP bodies larger than `max_bytes` get 413 (see the module docstring)."""

    def __init__(self, app, max_bytes: int, on_refuse: Callable[[], None] | None = None):
        self.app, self.max_bytes, self.on_refuse = app, max_bytes, on_refuse

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope.get("headers") or ()).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            return await self._refuse(scope, receive, send)
        if declared is not None:
            return await self.app(scope, receive, send)  # the server's HTTP parser holds it to that length
        # Chunked: read it here, up to the bound, then hand it to the app as one message.
        body, more = [], True
        received = 0
        while more:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client went away
            received += len(message.get("body", b""))
            if received > self.max_bytes:
                return await self._refuse(scope, receive, send)
            body.append(message.get("body", b""))
            more = message.get("more_body", False)
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(body), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _refuse(self, scope, receive, send) -> None:
        if self.on_refuse is not None:
            self.on_refuse()
        response = error_response(413, f"the request body exceeds {self.max_bytes:,} bytes", code="request_too_large")
        response.headers["connection"] = "close"  # the unread rest of the body is not drained
        await response(scope, receive, send)


class PromptBound:
    """Counts a prompt's tokens against the context without tokenising more of it than needed.

    Args:
        encode: the tokenizer's ``text -> ids``.
        longest_token_bytes: the most UTF-8 bytes any one token stands for.
        context: the model's context in tokens (prompt plus output).
    """

    def __init__(self, encode: Callable[[str], Sequence[int]], longest_token_bytes: int, context: int):
        self.encode, self.longest, self.context = encode, max(1, longest_token_bytes), context

    def tokenize(self, prompt: str, max_tokens: int) -> list[int]:
        """The prompt's token ids; raises RequestError (400, ``context_length_exceeded``) when the
        prompt plus `max_tokens` cannot fit, having tokenised no more of it than the bound needed."""
        budget = self.context - max_tokens
        # Each character is at least one UTF-8 byte: the length is a bound before any encoding.
        if (
            len(prompt) > self.context * self.longest
            or len(prompt.encode("utf-8", "surrogatepass")) > self.context * self.longest
        ):
            self._refuse(f"more than {self.context} tokens", max_tokens)
        if len(prompt) > _PIECE_CHARS:
            seen, cuts = 0, 0
            for piece in _pieces(prompt):
                seen += len(self.encode(piece))
                if seen - cuts > budget:
                    self._refuse(f"at least {seen - cuts} tokens", max_tokens)
                cuts += 1
        ids = list(self.encode(prompt))
        if len(ids) > budget:
            self._refuse(f"{len(ids)} tokens", max_tokens)
        return ids

    def _refuse(self, size: str, max_tokens: int) -> None:
        raise RequestError(
            f"the prompt ({size}) plus max_tokens ({max_tokens}) exceeds the model's context of {self.context} tokens",
            param="max_tokens",
            code="context_length_exceeded",
        )


def _pieces(text: str):
    """`text` in pieces of about `_PIECE_CHARS`, each cut just before a whitespace where there is one."""
    start = 0
    while start < len(text):
        end = min(len(text), start + _PIECE_CHARS)
        if end < len(text):
            space = max(
                text.rfind(" ", start + _PIECE_CHARS // 2, end), text.rfind("\n", start + _PIECE_CHARS // 2, end)
            )
            end = space if space > start else end
        yield text[start:end]
        start = end


def longest_token_bytes(token_bytes: Sequence[bytes | None]) -> int:
    return max((len(piece) for piece in token_bytes if piece), default=1)
