"""`ChoiceText`: what of a growing output is safe to stream (stop strings, partial UTF-8, tool
triggers), and `fd-guided serve --help`."""
import pytest

from fd_guided.cli import main
from fd_guided.server.output import ChoiceText
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
    for flag in ("--port", "--preset", "--backend", "--chat-template", "--switch-interval-ms"):
        assert flag in out
