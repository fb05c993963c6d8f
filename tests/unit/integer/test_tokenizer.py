from __future__ import annotations

import pytest

from fx_integer import artifact
from fx_integer.tokenizer import Tokenizer, pre_tokenize


@pytest.fixture(scope="module")
def tok(real: artifact.Artifact) -> Tokenizer:
    return Tokenizer(real.tokenizer)


def test_chatml_encoding(tok: Tokenizer) -> None:
    text = tok.chat_prompt("What is the capital of France?", system=None)
    ids = [1, 4093, 198, 1780, 314, 260, 3575, 282, 4649, 47, 2, 198, 1, 520, 9531, 198]
    assert tok.encode(text, allow_special=True) == ids  # the template text, trusted
    assert tok.chat_tokens("What is the capital of France?", system=None) == ids


def test_pre_tokenizer_rules() -> None:
    assert pre_tokenize("abc 123") == ["abc", " ", "1", "2", "3"]
    assert pre_tokenize("I'm  here\n\nnow") == ["I", "'m", " ", " here", "\n", "\n", "now"]
    assert pre_tokenize("a!!? b") == ["a", "!!?", " b"]


@pytest.mark.parametrize("text", ["Hello world", "  spaces  \t\n", "naïve café 日本語 😀",
                                  "x = f(3.14) # ok", "<|im_start|>user\nhi<|im_end|>"])
def test_roundtrip(tok: Tokenizer, text: str) -> None:
    assert tok.decode(tok.encode(text)) == text
