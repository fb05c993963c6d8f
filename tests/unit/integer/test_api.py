"""The public API of ``fx_integer`` (``__init__``): every result compared exactly, as integers and
bytes; the wrappers are held to the engine they wrap (the generation path, ``IntegerEngine.run``)
and to another process with another BLAS thread setting."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import fx_integer as fi
from broker_schema.canonical import hash_from_hex
from fx_integer import artifact, fixed_point, sampling
from fx_integer.engine import IntegerEngine

ROOT = Path(__file__).resolve().parents[3]


def _digest(rows: np.ndarray[Any, Any]) -> str:
    """The receipt's ``logits_digest`` of logits rows (int64 little-endian, row after row)."""
    h = hashlib.sha256()
    for row in rows:
        h.update(np.asarray(row, dtype=np.int64).astype("<i8").tobytes())
    return h.hexdigest()


def test_every_public_name_resolves_and_is_documented() -> None:
    for name in fi.__all__:
        value = getattr(fi, name)
        if callable(value) and not isinstance(value, type):
            assert value.__doc__, f"{name} has no docstring"
    with pytest.raises(AttributeError):
        fi.not_a_name  # noqa: B018


def test_the_q16_scale_is_the_engines_format() -> None:
    assert fi.Q16_FRAC_BITS == fixed_point.ACT_FRAC == 16
    assert fi.Q16_SCALE == 1 << 16 == 65536
    assert sampling.to_q16(1, "one") == fi.Q16_SCALE  # how the engine parses 1.0


# ------------------------------------------------------------------------------ loading
def test_load_artifact_pins_the_hash(synth_path: Path) -> None:
    art = fi.load_artifact(synth_path)
    assert art.model_hash == hashlib.sha256(synth_path.read_bytes()).hexdigest()
    assert fi.load_artifact(synth_path, expected_hash=art.model_hash.upper()).model_hash \
        == art.model_hash
    with pytest.raises(fi.ArtifactError, match="modelHash mismatch"):
        fi.load_artifact(synth_path, expected_hash="0" * 64)


def test_load_by_hash_reads_the_executors_model_store(synth_path: Path, tmp_path: Path) -> None:
    """The layout is the executor's: put the artifact in with the executor's own import, read it
    back without the executor."""
    from executor.engines.integer import import_artifact

    store = tmp_path / "store"
    manifest = import_artifact(store, synth_path)
    h = hashlib.sha256(synth_path.read_bytes()).hexdigest()
    assert manifest.hash == hash_from_hex(h)
    for name in (h, manifest.hash, h.upper()):
        art = fi.load_by_hash(name, store)
        assert art.model_hash == h and art.path == store / "sha256" / h


def test_load_by_hash_refuses_what_is_not_the_named_file(synth_path: Path,
                                                         tmp_path: Path) -> None:
    store = tmp_path / "store"
    (store / "sha256").mkdir(parents=True)
    other = artifact.synthetic(seed=8)
    h = hashlib.sha256(synth_path.read_bytes()).hexdigest()
    (store / "sha256" / h).write_bytes(other)  # another artifact under this name
    with pytest.raises(fi.ArtifactError, match="modelHash mismatch"):
        fi.load_by_hash(h, store)
    with pytest.raises(FileNotFoundError):
        fi.load_by_hash("ab" * 32, store)
    for bad in ("../" + h[3:], h[:63], "", "sha256:xyz", "md5:" + h):
        with pytest.raises(fi.ArtifactError, match="not a model hash"):
            fi.load_by_hash(bad, store)


# ------------------------------------------------------------------------------ synthetic model
def test_tokenize_is_the_engines_tokenization(synth: artifact.Artifact,
                                              synth_path: Path) -> None:
    eng = IntegerEngine(synth_path)
    for text in ("the cat", "a <|im_start|> b", "xyz  zy\n"):
        req, _ = eng.prepare({"prompt": text})
        assert fi.tokenize(synth, text) == list(req.prompt_tokens)
        assert fi.detokenize(synth, fi.tokenize(synth, text)) == eng.tokenizer.decode(
            list(req.prompt_tokens))
    assert isinstance(fi.Tokenizer(synth.tokenizer), fi.Tokenizer)


def _generation_matches_teacher_forcing(art: artifact.Artifact, prompt: list[int],
                                        n: int) -> fi.Generation:
    """generate's logits digest and greedy tokens, recomputed from the teacher-forced logits
    of prompt + output in one forward pass: the same bytes."""
    out = fi.generate(art, prompt, max_tokens=n, stop_at_eos=False)
    assert len(out.output_tokens) == n
    full = prompt + out.output_tokens[:-1]
    logits = fi.teacher_forced_logits(art, full)
    assert logits.dtype == np.int64 and logits.shape == (len(full), art.config.vocab_size)
    rows = logits[len(prompt) - 1:]
    assert _digest(rows) == out.logits_digest
    assert [sampling.greedy(r) for r in rows] == out.output_tokens
    return out


def test_teacher_forced_logits_equal_the_generation_path(synth: artifact.Artifact) -> None:
    ids = fi.tokenize(synth, "the cat sat")
    _generation_matches_teacher_forcing(synth, ids, 6)
    # a prefix's rows are the whole sequence's first rows (causal: later tokens change nothing)
    whole = fi.teacher_forced_logits(synth, ids)
    assert np.array_equal(fi.teacher_forced_logits(synth, ids[:3]), whole[:3])


def test_generate_is_the_engines_run(synth: artifact.Artifact, synth_path: Path) -> None:
    eng = IntegerEngine(synth_path)
    params = {"prompt": "the cat", "max_tokens": 5, "temperature": "0.8", "top_k": 20,
              "top_p": 0.9, "seed": 11}
    want = eng.run(params)
    got = fi.generate(synth, "the cat", max_tokens=5, temperature="0.8", top_k=20, top_p=0.9,
                      seed=11)
    assert got == fi.generate(synth, "the cat", max_tokens=5, temperature="0.8", top_k=20,
                              top_p=0.9, seed=11)
    assert (got.prompt_tokens, got.output_tokens, got.text, got.finish_reason,
            got.logits_digest) == (want["prompt_tokens"], want["output_tokens"], want["text"],
                                   want["finish_reason"], want["receipt"]["logits_digest"])
    by_ids = fi.generate(synth, np.asarray(got.prompt_tokens), max_tokens=5,
                         temperature="0.8", top_k=20, top_p=0.9, seed=11)
    assert by_ids == got


def test_bad_arguments_are_param_errors(synth: artifact.Artifact) -> None:
    v = synth.config.vocab_size
    for ids in ([], [v], [-1], [True, 2], [1.0]):
        with pytest.raises(fi.ParamError):
            fi.teacher_forced_logits(synth, ids)  # type: ignore[arg-type]
    with pytest.raises(fi.ParamError):
        fi.teacher_forced_logits(synth, [1] * (synth.config.ctx_len + 1))
    for kw in ({"max_tokens": 0}, {"temperature": -1}, {"top_k": 1.5}):
        with pytest.raises(fi.ParamError):
            fi.generate(synth, "the cat", **kw)  # type: ignore[arg-type]
    with pytest.raises(fi.ParamError, match="chat"):
        fi.generate(synth, [1, 2], chat=True)
    with pytest.raises(fi.ParamError):
        fi.generate(synth, [True, 2])


def test_engines_are_reused_per_model_and_backend(synth: artifact.Artifact,
                                                  synth_path: Path) -> None:
    eng = fi.engine_for(synth)
    assert fi.engine_for(fi.load_artifact(synth_path)) is eng  # same hash, same bytes
    assert eng.signer is None and eng.backend == "oracle"


# ------------------------------------------------------------------------------ the real model
PROMPT = "The capital of France is"
SAMPLED: dict[str, Any] = {"temperature": "0.7", "top_k": 40, "top_p": "0.9", "seed": 7}
N_TOKENS = 3


def _figures(art: artifact.Artifact) -> dict[str, Any]:
    """Everything the API computes for PROMPT, as JSON (logits by their digest)."""
    ids = fi.tokenize(art, PROMPT)
    greedy = fi.generate(art, PROMPT, max_tokens=N_TOKENS)
    sampled = fi.generate(art, PROMPT, max_tokens=N_TOKENS, **SAMPLED)
    chat = fi.tokenize(art, "What is 2+2?", chat=True)
    return {"ids": ids, "chat": chat,
            "logits": _digest(fi.teacher_forced_logits(art, ids)),
            "greedy": [greedy.output_tokens, greedy.text, greedy.logits_digest],
            "sampled": [sampled.output_tokens, sampled.text, sampled.logits_digest]}


def test_the_real_model_through_the_api(real: artifact.Artifact) -> None:
    ids = fi.tokenize(real, PROMPT)
    assert ids == [504, 3575, 282, 4649, 314]
    out = _generation_matches_teacher_forcing(real, ids, N_TOKENS)
    assert fi.detokenize(real, out.output_tokens[:1]) == " Paris"
    eng = fi.engine_for(real)
    req, _ = eng.prepare({"prompt": "What is 2+2?", "chat": True})
    assert fi.tokenize(real, "What is 2+2?", chat=True) == list(req.prompt_tokens)


@pytest.mark.slow
def test_the_same_bytes_in_another_process_with_other_blas_threads(
        real: artifact.Artifact, real_path: Path) -> None:
    """Byte for byte: this process, then fresh processes with one BLAS thread and with three."""
    here = _figures(real)
    assert here == _figures(real)
    script = textwrap.dedent(f"""
        import json, sys
        sys.path.insert(0, {str(ROOT)!r})
        import fx_integer as fi
        from tests.unit.integer.test_api import _figures
        print(json.dumps(_figures(fi.load_artifact({str(real_path)!r},
                                                   expected_hash={real.model_hash!r}))))
    """)
    for threads in ("1", "3"):
        env = {**os.environ, "OPENBLAS_NUM_THREADS": threads, "OMP_NUM_THREADS": threads,
               "MKL_NUM_THREADS": threads}
        proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=600, check=False)
        assert proc.returncode == 0, proc.stderr[-3000:]
        there = json.loads(proc.stdout.strip().splitlines()[-1])
        assert there == json.loads(json.dumps(here)), f"OPENBLAS_NUM_THREADS={threads}"
