"""GGUF -> integer artifact, for every architecture the one forward runs.

The architecture is read from the GGUF's metadata (``general.architecture`` and its
``<arch>.*`` keys) into :class:`~fx_integer.artifact.Config`, the way llama.cpp reads it (the
sources are cited in docs/integer-engine.md); every choice the forward makes is then in the
artifact, never in a code path keyed on the model. Architectures: ``llama``, ``gemma3``,
``qwen3``, ``qwen3moe``, ``cohere2``, ``cohere2moe``; anything else is refused with the name of
what is missing.

Weights: every quantized matrix is decoded by :mod:`fx_integer.quants` into exact int8 codes
with Q.24 block scales (and offsets); norm gains (F32) become Q.24 by exact rounding of the
float32 bits; F32/F16 matrices (a mixture-of-experts router is kept F32 by llama.cpp's
quantiser) are quantized to Q8_0 here, once, by gguf's own quantiser, and the artifact commits
the result. A llama GGUF in Q4_1 with a Q8_0 embedding (SmolLM2) is written as format 1, byte for
byte what earlier versions wrote, so its modelHash is unchanged.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from . import artifact as A

#: Architectures the converter reads, and the model families they come from.
ARCHITECTURES: Final = ("llama", "gemma3", "qwen3", "qwen3moe", "cohere2", "cohere2moe")
#: Context length an import keeps when the GGUF allows more (the RoPE tables are committed in
#: the artifact, 2 x ctx x head_dim/2 int32 per RoPE base): ``fx models import-int --ctx``.
DEFAULT_MAX_CTX: Final = 8192
_MATS: Final = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
_EXPS: Final = ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")
_NORMS: Final = ("attn_norm", "ffn_norm", "attn_q_norm", "attn_k_norm", "post_attention_norm",
                 "post_ffw_norm")
_FLOAT_KINDS: Final = ("F32", "F16", "BF16")
GEMMA_NOTICE: Final = ("Gemma is provided under and subject to the Gemma Terms of Use found at "
                       "ai.google.dev/gemma/terms")


class UnsupportedGGUF(A.ArtifactError):
    """The GGUF names an architecture, a metadata value or a tensor the engine cannot run."""


class _Meta:
    """The GGUF's key/value metadata with clear errors for what is missing."""

    def __init__(self, reader: Any) -> None:
        self.fields = reader.fields
        self.arch = str(self.get("general.architecture"))

    def has(self, key: str) -> bool:
        return key in self.fields

    def get(self, key: str, default: Any = ...) -> Any:
        if key not in self.fields:
            if default is ...:
                raise UnsupportedGGUF(f"GGUF metadata has no {key!r}")
            return default
        return self.fields[key].contents()

    def a(self, key: str, default: Any = ...) -> Any:
        """``<arch>.key``."""
        return self.get(f"{self.arch}.{key}", default)


def _architecture(m: _Meta, ctx_cap: int) -> A.Config:
    arch = m.arch
    if arch not in ARCHITECTURES:
        raise UnsupportedGGUF(
            f"architecture {arch!r} is not supported; the engine reads {', '.join(ARCHITECTURES)}")
    for key in ("rope.scaling.type", "rope.scaling.factor"):
        scaling = m.a(key, None)
        if scaling not in (None, "none", 1.0, 0.0):
            raise UnsupportedGGUF(f"{arch}.{key} = {scaling!r}: RoPE scaling is not supported")
    for key in ("attn_logit_softcapping", "final_logit_softcapping"):
        if m.a(key, None) not in (None, 0.0):
            raise UnsupportedGGUF(f"{arch}.{key} is set: logit soft-capping is not supported")
    d_model = int(m.a("embedding_length"))
    n_layers = int(m.a("block_count"))
    n_heads = int(m.a("attention.head_count"))
    n_kv = m.a("attention.head_count_kv", n_heads)
    if not isinstance(n_kv, int | np.integer):
        raise UnsupportedGGUF(f"{arch}.attention.head_count_kv varies per layer: not supported")
    head_dim = int(m.a("attention.key_length", d_model // n_heads))
    if int(m.a("attention.value_length", head_dim)) != head_dim:
        raise UnsupportedGGUF("value heads of another width than key heads are not supported")
    rope_dim = int(m.a("rope.dimension_count", head_dim))
    if rope_dim != head_dim:
        raise UnsupportedGGUF(f"RoPE over {rope_dim} of {head_dim} head dimensions "
                              "(partial rotary) is not supported")
    theta = float(m.a("rope.freq_base", 10000.0))
    ctx_len = min(int(m.a("context_length")), ctx_cap)
    rms_key, ln_key = "attention.layer_norm_rms_epsilon", "attention.layer_norm_epsilon"
    if arch == "cohere2" or (arch == "cohere2moe" and not m.has(f"{arch}.{rms_key}")):
        eps, norm = float(m.a(ln_key)), "layer"
    else:
        eps, norm = float(m.a(rms_key)), "rms"
    kw: dict[str, Any] = {"arch": arch, "norm": norm}
    scale_q30 = A.attn_scale_q30(head_dim)
    if arch == "gemma3":
        # llama.cpp (src/models/gemma3.cpp): 5 sliding-window layers in every 6, the SWA
        # layers' RoPE base 10,000 unless the GGUF names one, QK-norm before RoPE, post-norms,
        # GELU (tanh) GeGLU, NEOX RoPE, the embedding scaled by sqrt(n_embd), scores by
        # 1/sqrt(head_dim) (the 27B's 1/sqrt(n_embd/n_head) is refused, not silently used)
        if n_layers == 62:
            raise UnsupportedGGUF("gemma3 27B's attention scale is not supported")
        kinds = _swa_kinds(m, n_layers, 6, dense_first=False, full="f")
        kw.update(post_norms=1, qk_norm=1, act="gelu_tanh",
                  embd_scale_q24=_q24(math.sqrt(d_model)), rope_layout="neox",
                  rope_theta_swa=repr(float(m.a("rope.freq_base_swa", 10000.0))) if kinds else "",
                  layer_kinds=kinds, window=int(m.a("attention.sliding_window", 0)) if kinds else 0)
    elif arch in ("qwen3", "qwen3moe"):
        kw.update(qk_norm=1, rope_layout="neox")
        if arch == "qwen3moe":  # softmax over the experts, top-k renormalised (hard-coded)
            n_used = int(m.a("expert_used_count"))
            kw.update(n_experts=int(m.a("expert_count")), n_experts_used=n_used,
                      d_ff_expert=int(m.a("expert_feed_forward_length",
                                          int(m.a("feed_forward_length")) // max(1, n_used))),
                      moe_gating="softmax", moe_norm_topk=1)
    elif arch in ("cohere2", "cohere2moe"):
        # llama.cpp (src/models/cohere2.cpp, cohere2moe.cpp): one norm feeding attention and
        # FFN in parallel, adjacent-pair RoPE at rope.freq_base on the sliding-window layers
        # only (cohere2: 3 in every 4, the last full; cohere2moe: the first of every 4 full,
        # or the GGUF's per-layer pattern), logits scaled by logit_scale
        lead = int(m.a("leading_dense_block_count", 0)) if arch == "cohere2moe" else 0
        kinds = _swa_kinds(m, n_layers, 4, dense_first=arch == "cohere2moe", full="n")
        if lead:  # the leading dense layers keep RoPE where they are full
            kinds = "".join("f" if il < lead and k == "n" else k for il, k in enumerate(kinds))
        kw.update(parallel_block=1, rope_layout="interleaved", layer_kinds=kinds,
                  window=int(m.a("attention.sliding_window")),
                  logit_scale_q24=_q24(float(m.a("logit_scale"))))
        if arch == "cohere2moe":
            if int(m.a("expert_shared_count", 0)):
                raise UnsupportedGGUF("cohere2moe shared experts are not supported")
            w_scale = float(m.a("expert_weights_scale", 0.0))
            if w_scale not in (0.0, 1.0):
                raise UnsupportedGGUF(f"expert_weights_scale {w_scale} is not supported")
            gating = {0: "sigmoid", 1: "softmax", 2: "sigmoid"}.get(
                int(m.a("expert_gating_func", 0)))
            if gating is None:
                raise UnsupportedGGUF(f"expert_gating_func {m.a('expert_gating_func')} is not "
                                      "supported (softmax 1, sigmoid 2)")
            kw.update(n_experts=int(m.a("expert_count")),
                      n_experts_used=int(m.a("expert_used_count")),
                      d_ff_expert=int(m.a("expert_feed_forward_length")),
                      moe_gating=gating, moe_norm_topk=int(bool(m.a("expert_weights_norm", False))),
                      n_dense_lead=lead)
    d_ff = int(m.a("feed_forward_length", 0))
    cfg = A.Config(n_layers=n_layers, d_model=d_model, d_ff=d_ff, n_heads=n_heads,
                   n_kv_heads=int(n_kv), head_dim=head_dim, vocab_size=0, ctx_len=ctx_len,
                   rope_theta=repr(theta), norm_eps_q32=math.floor(eps * 2**32 + 0.5),
                   attn_scale_q30=scale_q30, **kw)
    return cfg


def _swa_kinds(m: _Meta, n_layers: int, period: int, *, dense_first: bool, full: str) -> str:
    """Per-layer kinds as llama.cpp's set_swa_pattern: the GGUF's bool array (true = sliding)
    when present, else its scalar period or ``period``; full layers are ``full``. No
    ``attention.sliding_window`` (or 0): every layer full."""
    if int(m.a("attention.sliding_window", 0) or 0) <= 0:
        return ""
    pat = m.a("attention.sliding_window_pattern", period)
    if isinstance(pat, list | tuple):
        if len(pat) != n_layers:
            raise UnsupportedGGUF(f"sliding_window_pattern has {len(pat)} entries for "
                                  f"{n_layers} layers")
        return "".join("s" if bool(b) else full for b in pat)
    n = int(pat)
    if dense_first:
        return "".join("s" if n == 0 or il % n != 0 else full for il in range(n_layers))
    return "".join("s" if n == 0 or il % n < n - 1 else full for il in range(n_layers))


def _q24(v: float) -> int:
    return math.floor(v * (1 << 24) + 0.5)


def _tokenizer(m: _Meta) -> dict[str, Any]:
    """What the engine's tokenizers read (fx_integer.tokenizer), copied from the GGUF."""
    model = str(m.get("tokenizer.ggml.model"))
    tokens = [str(t) for t in m.get("tokenizer.ggml.tokens")]
    tok: dict[str, Any] = {
        "model": model,
        "pre": str(m.get("tokenizer.ggml.pre", "default")),
        "tokens": tokens,
        "token_types": [int(t) for t in m.get("tokenizer.ggml.token_type")],
        "merges": [str(x) for x in m.get("tokenizer.ggml.merges", [])],
        "bos_id": int(m.get("tokenizer.ggml.bos_token_id")),
        "eos_id": int(m.get("tokenizer.ggml.eos_token_id")),
        "pad_id": int(m.get("tokenizer.ggml.padding_token_id",
                            m.get("tokenizer.ggml.eos_token_id"))),
        "chat_template": str(m.get("tokenizer.chat_template", "")),
    }
    if model == "llama":  # SentencePiece-style BPE by scores
        scores = np.asarray(m.get("tokenizer.ggml.scores"), dtype=np.float32)
        tok["scores_f32_bits"] = [int(b) for b in scores.view("<u4")]
        tok["unk_id"] = int(m.get("tokenizer.ggml.unknown_token_id", 0))
        tok["add_bos"] = bool(m.get("tokenizer.ggml.add_bos_token", True))
        tok["add_space_prefix"] = bool(m.get("tokenizer.ggml.add_space_prefix", True))
    elif model != "gpt2":
        raise UnsupportedGGUF(f"tokenizer model {model!r} is not supported (gpt2, llama)")
    return tok


def _raw(t: Any) -> npt.NDArray[np.uint8]:
    return np.ascontiguousarray(np.asarray(t.data)).view(np.uint8)


def _float_rows(t: Any) -> npt.NDArray[np.float32]:
    kind = t.tensor_type.name
    a = np.asarray(t.data)
    if kind == "BF16":
        a = (a.astype(np.uint32) << 16).view(np.float32)
    return np.asarray(a, dtype=np.float32)


def _matrix(name: str, t: Any, out: dict[str, npt.NDArray[Any]],
            quant: dict[str, dict[str, Any]], *, expert: int | None = None) -> None:
    """Decode one quantized matrix (one expert of a 3-D tensor) into ``out``/``quant``."""
    from . import quants

    kind = t.tensor_type.name
    shape = [int(x) for x in t.shape]
    cols, rows = shape[0], shape[1]
    if kind in _FLOAT_KINDS:
        f = _float_rows(t).reshape(-1, rows, cols)
        f = f[expert] if expert is not None else f[0]
        kind, raw = "Q8_0", _requantize_q8_0(f)
    else:
        raw = _raw(t)
        if expert is not None:
            raw = raw.reshape(shape[2], -1)[expert]
    if kind not in quants.SUPPORTED:
        raise UnsupportedGGUF(f"{t.name}: quantization {kind} is not supported "
                              f"(supported: {', '.join(quants.SUPPORTED)})")
    try:
        dec = quants.decode(kind, raw, rows, cols)
    except quants.QuantError as e:
        raise UnsupportedGGUF(f"{t.name}: {e}") from e
    out[f"{name}.codes"] = np.ascontiguousarray(dec.codes, dtype=np.int8)
    out[f"{name}.scale"] = _narrow(dec.scale)
    if dec.offset is not None:
        out[f"{name}.offset"] = _narrow(dec.offset)
    quant[name] = {"format": kind, "group": int(dec.group), "qmax": int(dec.qmax)}


def _requantize_q8_0(f: npt.NDArray[np.float32]) -> npt.NDArray[np.uint8]:
    from gguf import GGMLQuantizationType
    from gguf.quants import quantize

    if f.shape[-1] % 32:
        raise UnsupportedGGUF("a float matrix whose rows are not a multiple of 32")
    return np.ascontiguousarray(quantize(np.ascontiguousarray(f, dtype=np.float32),
                                         GGMLQuantizationType.Q8_0)).view(np.uint8)


def _narrow(a: npt.NDArray[np.int64]) -> npt.NDArray[Any]:
    """int32 when every value fits (the usual case), else int64: exact either way."""
    a = np.asarray(a, dtype=np.int64)
    if a.size == 0 or (a.max() < 2**31 and a.min() >= -(2**31)):
        return a.astype("<i4")
    return a.astype("<i8")


_LAYER = re.compile(r"^blk\.(\d+)\.([a-z_]+)\.weight$")


def convert(gguf_path: str | os.PathLike[str], *, progress: bool = False,
            max_ctx: int = DEFAULT_MAX_CTX, notice: str | None = None,
            report: Callable[[str], None] | None = None) -> bytes:
    """The artifact bytes of a GGUF (format 1 for SmolLM2's llama Q4_1, else format 2).

    ``notice``: text the model's terms require to travel with it (``source.notice``); a GGUF
    whose ``general.license`` is ``gemma`` gets the Gemma Terms of Use notice when none is
    given."""
    from gguf import GGUFReader

    gp = Path(gguf_path)
    say = report or (A._progress if progress else (lambda _msg: None))
    reader = GGUFReader(str(gp))
    m = _Meta(reader)
    cfg = _architecture(m, max_ctx)
    by_name = {t.name: t for t in reader.tensors}
    if m.arch == "llama" and _is_format1(by_name):
        return A.from_gguf(gp, progress=progress)
    tok = _tokenizer(m)
    out: dict[str, npt.NDArray[Any]] = {}
    quant: dict[str, dict[str, Any]] = {}
    seen_layers: set[int] = set()
    for i, (name, t) in enumerate(sorted(by_name.items())):
        if progress and i % 50 == 0:
            say(f"import-int: tensor {i + 1}/{len(by_name)} {name}")
        kind = t.tensor_type.name
        if name in ("token_embd.weight", "output.weight"):
            _matrix(name.split(".")[0].replace("token_embd", "tok_embd"), t, out, quant)
            continue
        if name == "output_norm.weight":
            out["output_norm"] = _gain(t)
            continue
        mt = _LAYER.match(name)
        if mt is None:
            raise UnsupportedGGUF(f"unexpected tensor {name} ({kind})")
        layer, part = int(mt.group(1)), mt.group(2)
        seen_layers.add(layer)
        base = f"blk.{layer}.{part}"
        if part in _NORMS:
            out[base] = _gain(t)
        elif part in _MATS or part == "ffn_gate_inp":
            _matrix(base, t, out, quant)
        elif part in _EXPS:
            for e in range(int(t.shape[2])):
                _matrix(f"{base}.{e}", t, out, quant, expert=e)
        elif part == "ffn_gate_up_exps":  # gate rows then up rows, split at d_ff_expert
            for e in range(int(t.shape[2])):
                _matrix(f"blk.{layer}.gate_up_tmp", t, out, quant, expert=e)
                _split_rows(out, quant, f"blk.{layer}.gate_up_tmp",
                            (f"blk.{layer}.ffn_gate_exps.{e}", f"blk.{layer}.ffn_up_exps.{e}"))
        else:
            raise UnsupportedGGUF(f"tensor {name} ({kind}): {part} is not part of any "
                                  f"architecture the engine runs")
    cfg = _finish_config(cfg, out, tok, seen_layers)
    say("import-int: building RoPE tables")
    out["rope.cos"], out["rope.sin"] = A.rope_tables(cfg.head_dim, cfg.ctx_len,
                                                     float(cfg.rope_theta))
    if cfg.rope_theta_swa and cfg.rope_theta_swa != cfg.rope_theta:
        out["rope_swa.cos"], out["rope_swa.sin"] = A.rope_tables(
            cfg.head_dim, cfg.ctx_len, float(cfg.rope_theta_swa))
    elif cfg.rope_theta_swa:
        cfg = _replace(cfg, rope_theta_swa="")
    source = {"gguf_name": gp.name, "gguf_sha256": A._sha256_file(gp),
              "general.name": str(m.get("general.name", gp.stem)),
              "general.architecture": m.arch}
    lic = m.get("general.license", None)
    if lic is not None:
        source["general.license"] = str(lic)
    if notice is None and str(lic).lower() == "gemma":
        notice = GEMMA_NOTICE
    if notice:
        source["notice"] = notice
    return A.serialize(config=cfg, tokenizer=tok, source=source, tensors=out, quant=quant)


def _split_rows(out: dict[str, npt.NDArray[Any]], quant: dict[str, dict[str, Any]], name: str,
                into: tuple[str, str]) -> None:
    """Split a decoded matrix's rows in two halves (a merged gate/up expert)."""
    q = quant.pop(name)
    parts = {k: out.pop(f"{name}.{k}") for k in ("codes", "scale", "offset")
             if f"{name}.{k}" in out}
    half = parts["codes"].shape[0] // 2
    for i, target in enumerate(into):
        for k, v in parts.items():
            out[f"{target}.{k}"] = np.ascontiguousarray(v[i * half:(i + 1) * half])
        quant[target] = dict(q)


def _replace(cfg: A.Config, **kw: Any) -> A.Config:
    import dataclasses

    return dataclasses.replace(cfg, **kw)


def _finish_config(cfg: A.Config, out: Mapping[str, npt.NDArray[Any]], tok: Mapping[str, Any],
                   layers: set[int]) -> A.Config:
    """Checks that the tensors are what the config says, and the vocabulary size."""
    if layers != set(range(cfg.n_layers)):
        raise UnsupportedGGUF(f"tensors for layers {sorted(layers)[:5]}..., the metadata says "
                              f"{cfg.n_layers} blocks")
    vocab = int(out["tok_embd.codes"].shape[0])
    if vocab != len(tok["tokens"]):
        raise UnsupportedGGUF(f"embedding has {vocab} rows, the vocabulary {len(tok['tokens'])}")
    need = ["output_norm", "tok_embd.codes"]
    for il in range(cfg.n_layers):
        p = f"blk.{il}"
        need += [f"{p}.{x}.codes" for x in ("attn_q", "attn_k", "attn_v", "attn_output")]
        need += [f"{p}.attn_norm"]
        if not cfg.parallel_block:
            need += [f"{p}.ffn_norm"]
        if cfg.qk_norm:
            need += [f"{p}.attn_q_norm", f"{p}.attn_k_norm"]
        if cfg.post_norms:
            need += [f"{p}.post_attention_norm", f"{p}.post_ffw_norm"]
        if cfg.n_experts and il >= cfg.n_dense_lead:
            need += [f"{p}.ffn_gate_inp.codes"]
            need += [f"{p}.{x}.{e}.codes" for x in _EXPS for e in range(cfg.n_experts)]
        else:
            need += [f"{p}.{x}.codes" for x in ("ffn_gate", "ffn_up", "ffn_down")]
    missing = [n for n in need if n not in out]
    if missing:
        raise UnsupportedGGUF(f"{cfg.arch}: missing tensors {missing[:6]}"
                              + (f" and {len(missing) - 6} more" if len(missing) > 6 else ""))
    d_ff = cfg.d_ff
    if "blk.0.ffn_gate.codes" in out:
        d_ff = int(out["blk.0.ffn_gate.codes"].shape[0])
    return _replace(cfg, vocab_size=vocab, d_ff=d_ff)


def _gain(t: Any) -> npt.NDArray[Any]:
    if t.tensor_type.name != "F32":
        raise UnsupportedGGUF(f"{t.name}: norm gains must be F32, got {t.tensor_type.name}")
    g = A.f32_to_fixed(np.asarray(t.data, dtype=np.float32).reshape(-1), 24)
    if g.size and int(np.abs(g).max()) >= 1 << 40:
        raise UnsupportedGGUF(f"{t.name}: a norm gain of 65,536 or more is not supported")
    return _narrow(g)


def _is_format1(by_name: Mapping[str, Any]) -> bool:
    for name, t in by_name.items():
        kind = t.tensor_type.name
        if name == "token_embd.weight" and kind != "Q8_0":
            return False
        if name.startswith("blk.") and name.split(".")[2] in _MATS and kind != "Q4_1":
            return False
        if name == "output.weight":
            return False
    return True
