"""`ChoiceText`: what of a growing output is safe to stream (stop strings, partial UTF-8, tool
triggers), and `fd-guided serve --help`."""
import pytest

from fd_guided.harness.cli import main
from fd_guided.harness.server.output import ChoiceText
from fd_guided.tokenizer import load_tokenizer

pytestmark = pytest.mark.cpu


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("deepseek")


def byte_ids(tokenizer, data: bytes) -> list[int]:
    """One token per byte (the byte-level vocabulary has a token for each)."""
    ids = {}
    for token_id, text in enumerate(tokenizer.token_bytes):
        if text is not None and len(text) == 1:
            ids.setdefault(text[0], token_id)
    return [ids[b] for b in data]


def feed(text: ChoiceText, tokenizer, data: bytes) -> list[str]:
    return [text.add([token]) for token in byte_ids(tokenizer, data)]


def test_stop_string_is_held_while_partial_and_cuts_the_text(tokenizer):
    text = ChoiceText(tokenizer, ["END"])
    deltas = feed(text, tokenizer, b"abEN")
    assert "".join(deltas) == "ab"  # "EN" may begin the stop string
    assert text.add(byte_ids(tokenizer, b"Dzz")) == "" and text.stopped and text.text == "ab"
    text = ChoiceText(tokenizer, ["END"])
    feed(text, tokenizer, b"abENx")
    assert text.rest() == "" and text.sent == 5 and text.text == "abENx"


def test_partial_utf8_is_held_until_complete(tokenizer):
    text = ChoiceText(tokenizer)
    deltas = feed(text, tokenizer, "é!".encode())
    assert deltas == ["", "é", "!"]


def test_a_truncated_utf8_tail_ends_as_a_replacement_character(tokenizer):
    text = ChoiceText(tokenizer)
    assert feed(text, tokenizer, "é€".encode()[:-1]) == ["", "é", "", ""]
    assert text.rest() == "\ufffd" and text.text == "é\ufffd"
    final = ChoiceText(tokenizer)
    ids = byte_ids(tokenizer, "é€".encode()[:-1])
    assert final.add(ids[:-1]) == "é" and final.add(ids[-1:], final=True) == "\ufffd"


def test_incremental_text_equals_a_whole_decode_for_any_split(tokenizer):
    import random
    rng = random.Random(7)
    sample = "héllo wörld ✓ 日本語 😀 {\"a\": \"€\"} END tail <tool_call>\n{\"x\": 1}"
    ids = tokenizer.encode(sample) + byte_ids(tokenizer, "日".encode())[:2]  # ends inside a character
    whole = tokenizer.decode(ids)
    for trial in range(40):
        text, deltas, at = ChoiceText(tokenizer, ["END"] if trial % 2 else []), [], 0
        while at < len(ids):
            size = rng.randint(1, 4)
            deltas.append(text.add(ids[at:at + size], final=at + size >= len(ids)))
            at += size
        deltas.append(text.rest())
        expected = whole[:whole.find("END")] if trial % 2 else whole
        assert text.text == expected and "".join(deltas) == expected


def test_tool_trigger_and_hold_all(tokenizer):
    text = ChoiceText(tokenizer, hold_from="<tool_call>")
    sent = "".join(feed(text, tokenizer, b"hi <tool_call>\n{"))
    assert sent == "hi " and text.text.endswith("{")
    quiet = ChoiceText(tokenizer, hold_all=True)
    assert "".join(feed(quiet, tokenizer, b"abc")) == "" and quiet.text == "abc"


def test_serve_help(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["serve", "--help"])
    assert exited.value.code == 0
    out = capsys.readouterr().out
    for flag in ("--port", "--preset", "--backend", "--chat-template", "--switch-interval-ms", "--loop-priority"):
        assert flag in out
