"""The batch manager: the few hooks a serving stack's model runner calls, slot by slot.

Per request (a *slot* is the host's batch index for it)::

    spec = manager.validate(fields)                 # admission; InvalidGrammarError -> HTTP 400
    manager.prefetch(spec)                          # optional, when it queues: the compile starts
    manager.add_request(slot, spec, ...)            # at prefill: the compile starts (or is joined)
    manager.is_ready(slot)                          # the scheduler samples its first token only then
    manager.mark_prefill_done([slot])               # in the step whose forward ends the prompt

Per decode step, with ``rows[i]`` the slot whose logits are row i (None for a row of no slot)::

    manager.begin_step(rows)                        # before the forward: fills start in the background
    logits = model(...)
    manager.apply(logits)                           # joins compiles/fills, masks IN PLACE
    tokens = sample(logits)
    finished = manager.accept(tokens)               # advance matchers; finished slots with reasons
    manager.release(slot)                           # when the host retires the request

Per speculative (verification) step, request i bringing draft tokens ``drafts[i]`` (a chain, or
a `DraftTree`), its logits rows consecutive: ``len(drafts[i]) + 1`` of them, row j masked with its
grammar after drafts 0..j-1, all filled from its one matcher by advancing and rolling back::

    manager.begin_speculative_step(slots, drafts)   # before the forward (fills in the background)
    logits = model(...)                             # [sum(len(d) + 1), vocab]
    manager.apply(logits)                           # the same kernel, in place
    limits = manager.draft_limits()                 # drafts each request may accept (see below)
    accepted = verify(logits, drafts)               # host: accepted drafts + one sampled token each
    finished = manager.accept_speculative(accepted) # pushes them at once (Grammar.accept_tokens)

A draft the grammar rejects ends its chain: its own row (the state before it) is a real mask in
which that draft has probability 0, so an exact verifier (greedy, or rejection sampling) rejects
it; every later row of the chain allows only stop tokens (never an all -inf row), and
`draft_limits()` says where the chain ended for hosts whose verifier is not exact. Accepting
past it is a rejected token (the rejection policy). The matcher is never left advanced past the
accepted tokens. Drafters ask for masks for their own steps (`begin_drafting`) or check a proposal
(`valid_draft_prefix`), see `fd_guided.manager.drafting`. Between steps `jump_forward(slot)`
returns the tokens the grammar forces next (`fd_guided.manager.jump_forward`).

Guarantees: a slot is masked only after its prefill is done, its grammar is ready and its
reasoning (if any) has ended (`fd_guided.reasoning`: multi-token markers, budgets that force the
marker); the step never waits for a compile (a row sampled before its grammar is ready waits at
most `GuidedConfig.first_token_wait_s`, then fails alone). A failed or over-budget compile, a
rejected token or a row the grammar leaves without any allowed token finishes only that slot
(reason ``error``, message in `GuidedFinish.error`) and the batch goes on. Rows of finished
slots allow only the engine's stop tokens, so a host that keeps sampling them (``min_tokens``, a
late retire) samples a stop token, never an unconstrained one and never from an all-masked row.
The ``min_tokens`` rule: stop tokens stay allowed wherever the grammar allows nothing else (a
complete grammar); a host bans them only in rows where `allows_only_stop(row)` is False, so the
constraint wins and such a request ends shorter than ``min_tokens``. Every slot owns its matcher;
compiled grammars are shared read-only. Hooks called out of order raise `SlotStateError`.
"""

from ..errors import InvalidGrammarError
from .core import GuidedDecodingManager
from .drafting import DraftingSession
from .jump_forward import JumpForward
from .plan import DraftTree
from .slot import GuidedFinish, StepTimings

__all__ = [
    "GuidedDecodingManager",
    "GuidedFinish",
    "StepTimings",
    "DraftTree",
    "DraftingSession",
    "JumpForward",
    "InvalidGrammarError",
]
