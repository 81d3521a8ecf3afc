"""Jump-forward: emit the bytes the grammar forces (keys, punctuation, consts) without sampling.

After `accept`, a slot's grammar may admit only one continuation for a while: ``", "age": `` after
a string value of a fixed-order object, the rest of a ``const``. Sampling those tokens one forward
pass each is wasted work. `jump_forward` asks the engine for the forced bytes (xgrammar's
``find_jump_forward_string``, llguidance's ``compute_ff_bytes``), turns them into tokens and
advances the matcher past them; the host appends the tokens to the output and feeds them through
the model in ONE chunk with its next step (prefill-like), so the KV cache stays consistent.

The retokenization boundary, where it goes wrong if done naively:
  - left: the bytes before the jump were sampled as tokens the model chose, but the tokenizer
    would merge them with the forced bytes (sampled ``"``, forced ``, "age"`` -> ``",`` ``"age``).
    The last accepted token is re-encoded together with the forced bytes; when the encoding
    starts with a different token, that token is *retracted* (rolled back in the grammar; the host
    drops it and truncates its KV cache before it) and the re-encoded tokens replace it. The text
    is unchanged; only its tokenization is.
  - right: the last token of the encoding could have been a longer token crossing into the
    unforced bytes (forced ``"``, then the model would write ``",``), so it is not emitted: the
    model samples from there, under the mask, and may pick the longer token.
Nothing is emitted unless it adds at least one token beyond the retracted one, the tokens decode to
exactly the expected bytes, and the grammar accepts them all (else the matcher is put back).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import SlotStateError


@dataclass(frozen=True)
class JumpForward:
    """What the host does with a jump: drop the last `retract` output tokens (and every KV cache
    position from the first of them on), append `tokens`, and feed those through the model before
    sampling again. The manager's matcher is already past them."""

    retract: int
    tokens: tuple[int, ...]


def jump_forward(manager, slot: int, max_new_tokens: int | None) -> JumpForward | None:
    """`GuidedDecodingManager.jump_forward`; None when nothing can be emitted for `slot` now."""
    if manager.step.phase == "begun" or manager.step.drafting is not None:
        raise SlotStateError("jump_forward is called between steps (after accept), not inside one")
    state = manager.slots.get(slot)
    if (
        state is None
        or not state.jump_forward
        or not state.prefill_done
        or state.finish is not None
        or state.grammar is None
        or state.in_reasoning
        or state.grammar.is_terminated()
    ):
        return None
    if max_new_tokens is not None and max_new_tokens <= 0:
        return None
    forced = _complete_utf8(state.grammar.forced_bytes())
    if not forced:
        return None
    tokenizer = manager.backend.tokenizer
    retract, tokens = _encode_boundary(tokenizer, state.history[-1] if state.history else None, forced)
    tokens = tokens[:-1]  # the right boundary: see the module docstring
    if max_new_tokens is not None:
        tokens = tokens[: max_new_tokens + retract]
    if len(tokens) <= retract:
        return None
    grammar = state.grammar
    undone = state.history[-retract:] if retract else []
    if retract:
        grammar.rollback(retract)
    accepted = grammar.accept_tokens(tokens)
    if accepted < len(tokens) or grammar.is_terminated():
        grammar.rollback(accepted)
        if undone and grammar.accept_tokens(undone) != len(undone):  # cannot happen: they were accepted before
            raise SlotStateError(f"slot {slot}: the matcher could not be restored after a refused jump-forward")
        return None
    if retract:
        del state.history[-retract:]
        manager.metrics.inc("jump_forward_retracted_tokens_total", retract)
    state.history.extend(tokens)
    manager.slots.reached_mark(slot, state)  # far from its budget no more? (fd_guided.budget.far)
    manager.metrics.inc("jump_forward_tokens_total", len(tokens) - retract)
    return JumpForward(retract, tuple(tokens))


def _encode_boundary(tokenizer, last: int | None, forced: bytes) -> tuple[int, list[int]]:
    """(tokens to retract, tokens to emit) for `forced` after the accepted token `last`."""
    plain = _encode_exact(tokenizer, forced)
    last_bytes = tokenizer.token_bytes[last] if last is not None and 0 <= last < tokenizer.vocab_size else None
    if last_bytes:
        joined = _encode_exact(tokenizer, last_bytes + forced)
        if joined:
            if joined[0] == last:
                return 0, joined[1:]
            return 1, joined
    return 0, plain or []


def _encode_exact(tokenizer, data: bytes) -> list[int] | None:
    """The tokenizer's encoding of `data`, or None unless it decodes back to exactly `data`."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None  # e.g. the last token ends inside a multi-byte character
    tokens = [int(t) for t in tokenizer.encode(text)]
    if not tokens or tokenizer.decode_bytes(tokens) != data or any(tokenizer.token_bytes[t] is None for t in tokens):
        return None
    return tokens


def _complete_utf8(data: bytes) -> bytes:
    """`data` without a trailing incomplete UTF-8 character (llguidance may force part of one)."""
    for cut in range(min(4, len(data)) + 1):
        head = data[: len(data) - cut]
        try:
            head.decode("utf-8")
            return head
        except UnicodeDecodeError:
            continue
    return b""
