"""Prompts a client would send, for the benchmarks that run on a trained model.

A random-weight preset reads any token sequence alike, so its benchmarks use synthetic prompts of
set lengths (" token" repeated). A trained model is measured on text of the kind it serves:
`ttft_prompts` gives an extraction request over a short, a medium and a long document (a support
thread: 209, 353 and 696 SmolLM2 tokens under its chat template), `schema_prompt` a request
for an example document of a named schema. All are wrapped in the model's chat template
(`models.chat_prompt`).
"""

from __future__ import annotations

from fd_guided.harness.bench.models import chat_prompt, is_trained

_MESSAGES = (
    "From: Maria Keller <maria.keller@example.org>\nSubject: Order 48213 arrived damaged\n\n"
    "Hello, my order 48213 (two ceramic mugs and a teapot, paid 64.90 EUR on 3 March) arrived today "
    "and the teapot lid is broken in three pieces. The box looked fine from the outside, so I think it "
    "was packed loosely. I would prefer a replacement lid rather than a refund, if that is possible. "
    "I am at home on weekdays after 4 pm; the address is Lindenstrasse 12, 10969 Berlin. Photos are "
    "attached. Thank you, Maria",
    "From: Support <help@example.com>\nSubject: Re: Order 48213 arrived damaged\n\n"
    "Dear Ms Keller, we are sorry to hear that. Lids are not sold on their own, but we can send a "
    "complete teapot from the same series (Nordic Blue, 1.2 litre) at no cost. It would leave our "
    "warehouse in Leipzig on Thursday and arrive within two working days with DHL, tracking number "
    "to follow. You do not need to return the broken one. Could you confirm that the delivery "
    "address is still correct, and tell us whether the two mugs were undamaged? Kind regards, Jonas "
    "from customer care",
    "From: Maria Keller <maria.keller@example.org>\nSubject: Re: Re: Order 48213 arrived damaged\n\n"
    "Hi Jonas, thanks for the quick answer. Yes, the address is correct, but please note the doorbell "
    "says Keller/Brandt. The mugs are fine. One more thing: the invoice lists 69.90 EUR instead of "
    "64.90 EUR, I think the shipping was charged twice (5.00 EUR). My card statement shows two "
    "separate charges on 3 March. Could you check and refund the difference to the same card? Also, "
    "can I change my newsletter email to m.keller@example.net? Best, Maria",
    "From: Support <help@example.com>\nSubject: Re: Re: Re: Order 48213 arrived damaged\n\n"
    "Hello Maria, you are right: the shipping fee was booked twice because the payment was retried "
    "after a timeout. We have refunded 5.00 EUR to your Visa card ending in 4417; it should appear "
    "within five to seven days. The replacement teapot shipped this morning, tracking number "
    "00340434161094027318, expected on Friday between 10 am and 2 pm. The newsletter address is "
    "updated. As an apology we added a voucher for 10 percent off your next order, code SORRY10, "
    "valid until 30 June. If anything else goes wrong, just reply to this email. Best regards, Jonas",
)

_ASK = (
    "Read the support thread below and fill in the ticket as JSON: the customer, the order, what "
    "went wrong, what was agreed, and every amount of money mentioned.\n\n"
)


def ttft_prompts(preset: str, tokenizer, synthetic_lengths=(32, 512, 1024, 2048)) -> dict[str, str]:
    """Label -> prompt for the TTFT benchmark. Random presets: " token" repeated to each of
    `synthetic_lengths` (the labels are the lengths). Trained: the extraction request over the
    first message, the first two, and all four (labels ``support_1``, ``support_2``, ``support_4``),
    each in the chat template with a system turn."""
    if not is_trained(preset):
        word_ids = tokenizer.encode(" token")
        return {str(length): tokenizer.decode(word_ids * length) for length in synthetic_lengths}
    system = "You are a support assistant. Answer with JSON only."
    return {f"support_{n}": chat_prompt(tokenizer, _ASK + "\n\n".join(_MESSAGES[:n]), system=system) for n in (1, 2, 4)}


def schema_prompt(preset: str, tokenizer, name: str) -> str:
    """A request for an example document of the schema called `name` (e.g. ``format_email``):
    a plain line on a random preset (as before), a chat turn on a trained one."""
    if not is_trained(preset):
        return f"Write {name} as JSON:"
    readable = name.replace("_", " ")
    return chat_prompt(
        tokenizer, f"Write a short example {readable} record as a JSON object.", system="Answer with JSON only."
    )
