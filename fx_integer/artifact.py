"""The committed integer artifact: GGUF -> one versioned file whose sha256 is the modelHash.

Layout (all integers little-endian)::

    offset 0   8 bytes   magic b"NLFXINT\\0"
    offset 8   u32       format version (FORMAT_VERSION)
    offset 12  u32       reserved, 0
    offset 16  u64       header length H
    offset 24  H bytes   header: canonical JSON (sorted keys, no spaces, UTF-8)
               ...       zero padding to a multiple of 64
               ...       tensor data, each tensor at header["tensors"][i]["offset"]
                         (relative to the data start, 64-byte aligned), C order

The header holds ``config`` (integers and strings only), ``tokenizer`` (tokens, token types,
merges, special ids, chat template), ``source`` (GGUF name and sha256) and the tensor table.
Tensors (per layer ``L``)::

    tok_embd.codes   int8  [V, D]        Q8_0 codes, exact
    tok_embd.scale   int32 [V, D/32]     Q8_0 block scale d * 2**24 (exact)
    blk.L.{attn_q,attn_k,attn_v,attn_output,ffn_gate,ffn_up,ffn_down}.codes
                     uint8 [O, K/2]      Q4_1 codes 0..15, two per byte, element 2i in the
                                         low nibble, element 2i+1 in the high nibble
    ...scale, ...offset  int32 [O, K/32] Q4_1 d * 2**24 and m * 2**24 (exact)
    blk.L.attn_norm, blk.L.ffn_norm, output_norm   int32 [D]   gains in Q.24
    rope.cos, rope.sin  int32 [ctx, head_dim/2]   Q.30, committed

modelHash = sha256 over the whole file: every byte is committed content.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import struct
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from . import fixed_point

MAGIC: Final = b"NLFXINT\x00"
#: The newest format this engine writes; it reads every version in READ_VERSIONS. Format 1 is
#: SmolLM2's llama layout (nibble-packed Q4_1 matrices, Q8_0 embedding); format 2 adds the
#: architecture fields of :class:`Config` and a ``quant`` table naming each matrix's format.
FORMAT_VERSION: Final = 2
READ_VERSIONS: Final = (1, 2)
_ALIGN: Final = 64
_PREFIX = struct.Struct("<8sIIQ")

Q4_MATS: Final = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
_DTYPES: Final[dict[str, np.dtype[Any]]] = {
    "i8": np.dtype("<i1"),
    "u8": np.dtype("<u1"),
    "i32": np.dtype("<i4"),
    "i64": np.dtype("<i8"),
}


class ArtifactError(ValueError):
    """The file is not a valid artifact (bad magic, version, header or hash)."""


_V1_KEYS: Final = ("n_layers", "d_model", "d_ff", "n_heads", "n_kv_heads", "head_dim",
                   "vocab_size", "ctx_len", "rope_theta", "norm_eps_q32", "attn_scale_q30")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Config:
    n_layers: int
    d_model: int
    d_ff: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    vocab_size: int
    ctx_len: int
    rope_theta: str
    norm_eps_q32: int
    attn_scale_q30: int  # round(log2(e) / sqrt(head_dim) * 2**30)
    # -- the architecture (format version 2; the defaults are format 1's llama) -----------------
    arch: str = "llama"  # the GGUF general.architecture it came from (informational)
    norm: str = "rms"  # "rms" (RMSNorm) or "layer" (LayerNorm without bias: x - mean, then RMS)
    post_norms: int = 0  # 1: post_attention_norm / post_ffw_norm on each branch's output
    qk_norm: int = 0  # 1: RMSNorm over each head of q and k (gains of head_dim) before RoPE
    act: str = "silu"  # gated FFN activation: "silu" (SwiGLU) or "gelu_tanh" (GeGLU)
    embd_scale_q24: int = 0  # 0: none; else the embedding row is multiplied by this / 2**24
    rope_layout: str = "interleaved"  # pairs (2i, 2i+1), or "neox": pairs (i, i + head_dim/2)
    rope_theta_swa: str = ""  # RoPE base of sliding-window layers ("" = rope_theta)
    # one character per layer: "f" full attention with RoPE, "s" sliding window with RoPE
    # (base rope_theta_swa), "n" full attention without RoPE (NoPE); "" = every layer "f"
    layer_kinds: str = ""
    window: int = 0  # sliding window: a query at p sees keys at p - window < j <= p
    parallel_block: int = 0  # 1: attention and FFN both read the same normed input
    n_experts: int = 0  # 0: dense FFN; else a mixture of experts with a router (ffn_gate_inp)
    n_experts_used: int = 0  # experts per token (top-k)
    d_ff_expert: int = 0  # each expert's hidden width
    moe_gating: str = ""  # "softmax" over all experts, or "sigmoid" per expert; then top-k
    moe_norm_topk: int = 0  # 1: the top-k weights are renormalised to sum to one
    n_dense_lead: int = 0  # with experts: the first n_dense_lead layers have a dense FFN
    logit_scale_q24: int = 0  # 0: none; else logits multiplied by this / 2**24

    def to_json(self) -> dict[str, Any]:
        """Format 1 configs (llama, every architecture field at its default) keep their exact
        format 1 keys, so a format 1 artifact's bytes and modelHash never change."""
        d = dataclasses.asdict(self)
        if self.is_format1():
            return {k: d[k] for k in _V1_KEYS}
        return d

    def is_format1(self) -> bool:
        return all(getattr(self, f.name) == f.default for f in dataclasses.fields(self)
                   if f.name not in _V1_KEYS)

    def kind(self, layer: int) -> str:
        """The layer's kind: "f" full with RoPE, "s" sliding window, "n" full without RoPE."""
        return self.layer_kinds[layer] if self.layer_kinds else "f"

    @property
    def q_dim(self) -> int:
        return self.n_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.n_kv_heads * self.head_dim

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Config:
        out = {}
        for f in dataclasses.fields(cls):
            if f.name in d:
                out[f.name] = d[f.name]
            elif f.name in _V1_KEYS:
                raise KeyError(f.name)
        unknown = set(d) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise ArtifactError(f"config names fields this engine does not know: {sorted(unknown)}")
        cfg = cls(**out)
        cfg.validate()
        return cfg

    def validate(self) -> None:
        """Refuse a config the forward cannot run as written (a clear error, not a wrong run)."""
        problems = []
        if self.norm not in ("rms", "layer"):
            problems.append(f"norm {self.norm!r}")
        if self.act not in ("silu", "gelu_tanh"):
            problems.append(f"act {self.act!r}")
        if self.rope_layout not in ("interleaved", "neox"):
            problems.append(f"rope_layout {self.rope_layout!r}")
        if self.layer_kinds and (len(self.layer_kinds) != self.n_layers
                                 or set(self.layer_kinds) - set("fsn")):
            problems.append(f"layer_kinds {self.layer_kinds!r}")
        if "s" in self.layer_kinds and self.window <= 0:
            problems.append("sliding-window layers without a window")
        if self.n_experts and not (0 < self.n_experts_used <= self.n_experts
                                   and self.d_ff_expert > 0
                                   and self.moe_gating in ("softmax", "sigmoid")):
            problems.append("mixture of experts needs n_experts_used, d_ff_expert, "
                            "moe_gating 'softmax' or 'sigmoid'")
        if self.d_model >= 2048 or self.head_dim >= 2048:
            problems.append(f"d_model {self.d_model} / head_dim {self.head_dim}: RMSNorm's "
                            "exact sum of squares is proven for widths below 2048 only")
        if self.head_dim % 2:
            problems.append(f"odd head_dim {self.head_dim}")
        if problems:
            raise ArtifactError("unsupported config: " + "; ".join(problems))


@dataclasses.dataclass(frozen=True)
class QWeight:
    """One quantized matrix as exact integers: ``w[o, k] = (scale[o, k // group] * codes[o, k]
    + offset[o, k // group]) / 2**24`` (``offset`` None: 0). ``codes`` are the stored int8
    codes (a view of the file for format 2; unpacked nibbles for format 1)."""

    codes: npt.NDArray[np.int8]  # [O, K]
    scale: npt.NDArray[Any]  # [O, K // group] Q.24
    offset: npt.NDArray[Any] | None
    group: int
    qmax: int
    format: str

    @property
    def shape(self) -> tuple[int, int]:
        o, k = self.codes.shape
        return int(o), int(k)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Artifact:
    path: Path | None
    model_hash: str
    config: Config
    tokenizer: dict[str, Any]
    source: dict[str, Any]
    tensors: dict[str, npt.NDArray[Any]]
    #: format 2: matrix base name -> {"format", "group", "qmax"}; format 1: empty (all Q4_1
    #: matrices and a Q8_0 embedding, by construction)
    quant: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    format_version: int = 1

    def has_weight(self, name: str) -> bool:
        return f"{name}.codes" in self.tensors

    def weight(self, name: str) -> QWeight:
        """The matrix ``name`` (``blk.3.attn_q``, ``tok_embd``, ``blk.0.ffn_up_exps.5``)."""
        codes = self.tensors[f"{name}.codes"]
        scale = self.tensors[f"{name}.scale"]
        offset = self.tensors.get(f"{name}.offset")
        if self.format_version == 1:
            if name == "tok_embd":
                return QWeight(codes.astype(np.int8, copy=False), scale, None, 32, 128, "Q8_0")
            return QWeight(unpack_nibbles(codes).view(np.int8), scale, offset, 32, 15, "Q4_1")
        q = self.quant[name]
        return QWeight(codes, scale, offset, int(q["group"]), int(q["qmax"]), str(q["format"]))


def canonical_json(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def _pad(n: int) -> int:
    return (-n) % _ALIGN


def serialize(
    *,
    config: Config,
    tokenizer: Mapping[str, Any],
    source: Mapping[str, Any],
    tensors: Mapping[str, npt.NDArray[Any]],
    quant: Mapping[str, Mapping[str, Any]] | None = None,
) -> bytes:
    """Artifact bytes; deterministic for equal inputs (tensor order is sorted by name).

    A llama config with no ``quant`` table is written as format 1 (byte-identical to what
    earlier versions wrote); anything else as format 2."""
    version = 1 if config.is_format1() and not quant else FORMAT_VERSION
    table = []
    off = 0
    names = sorted(tensors)
    for name in names:
        a = tensors[name]
        code = next((k for k, v in _DTYPES.items() if v == a.dtype.newbyteorder("<")), None)
        if code is None:
            raise ArtifactError(f"unsupported dtype {a.dtype} for {name}")
        table.append({"name": name, "dtype": code, "shape": list(a.shape), "offset": off,
                      "nbytes": int(a.nbytes)})
        off += a.nbytes + _pad(a.nbytes)
    head: dict[str, Any] = {
        "format": "nlfx-int",
        "format_version": version,
        "config": config.to_json(),
        "tokenizer": dict(tokenizer),
        "source": dict(source),
        "tensors": table,
    }
    if version >= 2:
        head["quant"] = {k: dict(v) for k, v in (quant or {}).items()}
    header = canonical_json(head)
    parts = [_PREFIX.pack(MAGIC, version, 0, len(header)), header]
    parts.append(b"\x00" * _pad(_PREFIX.size + len(header)))
    for name in names:
        a = np.ascontiguousarray(tensors[name]).astype(tensors[name].dtype.newbyteorder("<"))
        parts.append(a.tobytes())
        parts.append(b"\x00" * _pad(a.nbytes))
    return b"".join(parts)


def parse(data: bytes, *, path: Path | None = None) -> Artifact:
    """Parse artifact bytes (checks magic, format version, header and tensor bounds)."""
    if len(data) < _PREFIX.size:
        raise ArtifactError("file too short for an artifact")
    magic, version, _reserved, hlen = _PREFIX.unpack_from(data, 0)
    if magic != MAGIC:
        raise ArtifactError(f"bad magic {magic!r}: not an integer-engine artifact")
    if version not in READ_VERSIONS:
        raise ArtifactError(
            f"artifact format version {version}, this engine reads {READ_VERSIONS}")
    header_end = _PREFIX.size + hlen
    try:
        header = json.loads(data[_PREFIX.size:header_end].decode())
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ArtifactError(f"corrupt artifact header: {e}") from e
    if not isinstance(header, dict) or header.get("format_version") != version:
        raise ArtifactError("header format_version does not match the file prefix")
    base = header_end + _pad(header_end)
    tensors: dict[str, npt.NDArray[Any]] = {}
    # A header of the right version but the wrong shape (a missing key, a string where a number
    # belongs, a negative offset) is a bad artifact too: never a KeyError or TypeError.
    try:
        for t in header["tensors"]:
            dt = _DTYPES[t["dtype"]]
            shape = [int(n) for n in t["shape"]]
            count = math.prod(shape)
            start = base + int(t["offset"])
            if (min(shape, default=0) < 0 or start < base or count * dt.itemsize != t["nbytes"]
                    or start + t["nbytes"] > len(data)):
                raise ArtifactError(f"tensor {t['name']} out of bounds")
            arr = np.frombuffer(data, dtype=dt, count=count, offset=start).reshape(shape)
            tensors[str(t["name"])] = arr
        config = Config.from_json(header["config"])
        for f in dataclasses.fields(Config):
            if not isinstance(getattr(config, f.name), int | str):
                raise ArtifactError(f"config.{f.name} is not an integer or string")
        tokenizer, source = header["tokenizer"], header["source"]
        quant = _check_quant(header.get("quant", {}), tensors) if version >= 2 else {}
        if version == 1 and not config.is_format1():
            raise ArtifactError("a format 1 artifact with format 2 config fields")
    except (KeyError, TypeError, ValueError) as e:
        if isinstance(e, ArtifactError):
            raise
        raise ArtifactError(f"corrupt artifact header: {type(e).__name__}: {e}") from e
    return Artifact(
        path=path,
        model_hash=hashlib.sha256(data).hexdigest(),
        config=config,
        tokenizer=tokenizer,
        source=source,
        tensors=tensors,
        quant=quant,
        format_version=version,
    )


def _check_quant(quant: Any, tensors: Mapping[str, npt.NDArray[Any]]
                 ) -> dict[str, dict[str, Any]]:
    """The format 2 quant table, each entry checked against its tensors' shapes."""
    if not isinstance(quant, dict):
        raise ArtifactError("quant table is not an object")
    out: dict[str, dict[str, Any]] = {}
    for name, q in quant.items():
        group, qmax = int(q["group"]), int(q["qmax"])
        codes, scale = tensors[f"{name}.codes"], tensors[f"{name}.scale"]
        if (group <= 0 or qmax <= 0 or qmax > 128 or codes.dtype != np.int8 or codes.ndim != 2
                or codes.shape[1] % group
                or scale.shape != (codes.shape[0], codes.shape[1] // group)):
            raise ArtifactError(f"matrix {name}: codes/scales do not match its quant entry")
        off = tensors.get(f"{name}.offset")
        if off is not None and off.shape != scale.shape:
            raise ArtifactError(f"matrix {name}: offsets do not match its scales")
        out[str(name)] = {"format": str(q["format"]), "group": group, "qmax": qmax}
    return out


def load(path: str | os.PathLike[str], *, expected_hash: str | None = None) -> Artifact:
    """Read and check an artifact file; ``expected_hash`` (hex sha256) pins it."""
    p = Path(path)
    data = p.read_bytes()
    art = parse(data, path=p)
    if expected_hash is not None and art.model_hash != expected_hash.lower():
        raise ArtifactError(
            f"modelHash mismatch: file {p} hashes to {art.model_hash}, expected {expected_hash}"
        )
    return art


def write(path: str | os.PathLike[str], data: bytes) -> str:
    """Atomically write artifact bytes; returns the modelHash."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(p.name + f".tmp{os.getpid()}")
    tmp.write_bytes(data)
    os.replace(tmp, p)
    return hashlib.sha256(data).hexdigest()


# --------------------------------------------------------------------------- conversion


def f32_to_fixed(a: npt.NDArray[np.float32], frac: int) -> npt.NDArray[np.int64]:
    """Round float32 values to Q.frac with the engine's rounding rule, by integer decoding."""
    bits = np.ascontiguousarray(a, dtype="<f4").view("<u4").astype(np.int64)
    sign = (bits >> 31) & 1
    e = (bits >> 23) & 0xFF
    mant = bits & 0x7FFFFF
    if np.any(e == 0xFF):
        raise ArtifactError("inf/nan in float tensor")
    sig = np.where(e == 0, mant, mant + (1 << 23))
    sig = np.where(sign == 1, -sig, sig)  # signed, so rounding is half up for both signs
    shift = np.where(e == 0, 1, e) - 150 + frac  # value = sig * 2**(e-150)
    up = np.where(shift >= 0, sig << np.clip(shift, 0, 62), 0)
    rs = np.clip(-shift, 0, 62)
    down = fixed_point.rshift_round_var(sig, rs)
    down = np.where(-shift > 62, 0, down)
    return np.where(shift >= 0, up, down).astype(np.int64)


def _to_i32(a: npt.NDArray[np.int64], what: str) -> npt.NDArray[np.int32]:
    if a.size and (a.max() >= 2**31 or a.min() < -(2**31)):
        raise ArtifactError(f"{what} does not fit int32")
    return a.astype("<i4")


def pack_nibbles(codes: npt.NDArray[np.uint8]) -> npt.NDArray[np.uint8]:
    """[O, K] codes 0..15 -> [O, K/2], element 2i low nibble, 2i+1 high nibble."""
    c = codes.astype(np.uint8)
    return (c[:, 0::2] | (c[:, 1::2] << np.uint8(4))).astype(np.uint8)


def unpack_nibbles(packed: npt.NDArray[np.uint8]) -> npt.NDArray[np.uint8]:
    o, h = packed.shape
    out = np.empty((o, 2 * h), dtype=np.uint8)
    out[:, 0::2] = packed & np.uint8(0x0F)
    out[:, 1::2] = packed >> np.uint8(4)
    return out


def _q4_1(raw: npt.NDArray[np.uint8], rows: int, cols: int) -> dict[str, npt.NDArray[Any]]:
    nb = cols // 32
    blk = np.ascontiguousarray(raw).reshape(rows, nb, 20)
    d = blk[:, :, 0:2].copy().view("<u2")[:, :, 0]
    m = blk[:, :, 2:4].copy().view("<u2")[:, :, 0]
    qs = blk[:, :, 4:20]
    codes = np.empty((rows, nb, 32), dtype=np.uint8)
    codes[:, :, :16] = qs & 0x0F  # ggml: element j in the low nibble of byte j
    codes[:, :, 16:] = qs >> 4  # element j + 16 in the high nibble
    return {
        "codes": pack_nibbles(codes.reshape(rows, cols)),
        "scale": _to_i32(fixed_point.f16_bits_to_q24(d), "Q4_1 scale"),
        "offset": _to_i32(fixed_point.f16_bits_to_q24(m), "Q4_1 offset"),
    }


def _q8_0(raw: npt.NDArray[np.uint8], rows: int, cols: int) -> dict[str, npt.NDArray[Any]]:
    nb = cols // 32
    blk = np.ascontiguousarray(raw).reshape(rows, nb, 34)
    d = blk[:, :, 0:2].copy().view("<u2")[:, :, 0]
    codes = blk[:, :, 2:34].copy().view(np.int8).reshape(rows, cols)
    return {"codes": codes, "scale": _to_i32(fixed_point.f16_bits_to_q24(d), "Q8_0 scale")}


def rope_tables(head_dim: int, ctx_len: int, theta: float) -> tuple[npt.NDArray[np.int32], ...]:
    """cos/sin of pos * theta**(-2i/head_dim), i < head_dim/2, rounded to Q.30.

    Computed once with Python floats (math.cos/sin, correctly rounded on glibc for practical
    purposes); the rounded integers are committed in the artifact, so inference never uses them
    as floats and re-execution never depends on a libm.
    """
    half = head_dim // 2
    inv = [theta ** (-(2.0 * i) / head_dim) for i in range(half)]
    cos = np.empty((ctx_len, half), dtype=np.int64)
    sin = np.empty((ctx_len, half), dtype=np.int64)
    scale = float(1 << 30)
    for p in range(ctx_len):
        for i in range(half):
            ang = p * inv[i]
            cos[p, i] = math.floor(math.cos(ang) * scale + 0.5)
            sin[p, i] = math.floor(math.sin(ang) * scale + 0.5)
    return cos.astype("<i4"), sin.astype("<i4")


def attn_scale_q30(head_dim: int) -> int:
    return math.floor(math.log2(math.e) / math.sqrt(head_dim) * (1 << 30) + 0.5)


def _sha256_file(p: Path) -> str:
    h = hashlib.sha256()
    with p.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _progress(msg: str) -> None:
    import sys

    print(msg, file=sys.stderr, flush=True)


def from_gguf(gguf_path: str | os.PathLike[str], *, progress: bool = False) -> bytes:
    """Convert a llama-architecture GGUF (Q4_1 matrices, Q8_0 embedding) to artifact bytes."""
    from gguf import GGUFReader  # import here: only the converter needs it

    gp = Path(gguf_path)
    r = GGUFReader(str(gp))

    def field(key: str) -> Any:
        return r.fields[key].contents()

    if field("general.architecture") != "llama":
        raise ArtifactError("only llama-architecture GGUF files are supported")
    d_model = int(field("llama.embedding_length"))
    n_heads = int(field("llama.attention.head_count"))
    head_dim = int(field("llama.rope.dimension_count"))
    if head_dim * n_heads != d_model:
        raise ArtifactError("rope over a partial head is not supported")
    theta = float(field("llama.rope.freq_base"))
    eps = float(field("llama.attention.layer_norm_rms_epsilon"))
    ctx_len = int(field("llama.context_length"))
    tokens = list(field("tokenizer.ggml.tokens"))
    config = Config(
        n_layers=int(field("llama.block_count")),
        d_model=d_model,
        d_ff=int(field("llama.feed_forward_length")),
        n_heads=n_heads,
        n_kv_heads=int(field("llama.attention.head_count_kv")),
        head_dim=head_dim,
        vocab_size=len(tokens),
        ctx_len=ctx_len,
        rope_theta=repr(theta),
        norm_eps_q32=math.floor(eps * 2**32 + 0.5),
        attn_scale_q30=attn_scale_q30(head_dim),
    )
    tok = {
        "model": str(field("tokenizer.ggml.model")),
        "pre": str(field("tokenizer.ggml.pre")),
        "tokens": tokens,
        "token_types": [int(t) for t in field("tokenizer.ggml.token_type")],
        "merges": list(field("tokenizer.ggml.merges")),
        "bos_id": int(field("tokenizer.ggml.bos_token_id")),
        "eos_id": int(field("tokenizer.ggml.eos_token_id")),
        "pad_id": int(field("tokenizer.ggml.padding_token_id")),
        "chat_template": str(field("tokenizer.chat_template")),
    }
    out: dict[str, npt.NDArray[Any]] = {}
    by_name = {t.name: t for t in r.tensors}
    for name, t in by_name.items():
        kind = t.tensor_type.name
        cols, rows = (int(x) for x in t.shape[:2]) if len(t.shape) > 1 else (int(t.shape[0]), 1)
        raw = np.asarray(t.data)
        if name == "token_embd.weight":
            if kind != "Q8_0":
                raise ArtifactError(f"{name}: expected Q8_0, got {kind}")
            for k, v in _q8_0(raw, rows, cols).items():
                out[f"tok_embd.{k}"] = v
        elif name.endswith("_norm.weight"):
            if kind != "F32":
                raise ArtifactError(f"{name}: expected F32, got {kind}")
            g = _fixed_gain(np.asarray(raw, dtype=np.float32).reshape(-1))
            out[name.removesuffix(".weight")] = g
        elif name.startswith("blk.") and name.split(".")[2] in Q4_MATS:
            if kind != "Q4_1":
                raise ArtifactError(f"{name}: expected Q4_1, got {kind}")
            base = name.removesuffix(".weight")
            for k, v in _q4_1(raw, rows, cols).items():
                out[f"{base}.{k}"] = v
        else:
            raise ArtifactError(f"unexpected tensor {name} ({kind})")
    if progress:
        _progress("import-int: building RoPE tables")
    out["rope.cos"], out["rope.sin"] = rope_tables(head_dim, ctx_len, theta)
    source = {"gguf_name": gp.name, "gguf_sha256": _sha256_file(gp),
              "general.name": str(field("general.name"))}
    return serialize(config=config, tokenizer=tok, source=source, tensors=out)


def _fixed_gain(g: npt.NDArray[np.float32]) -> npt.NDArray[np.int32]:
    return _to_i32(f32_to_fixed(g, fixed_point.GAIN_FRAC), "norm gain")


# --------------------------------------------------------------------------- synthetic


def synthetic_tokenizer(vocab_size: int) -> dict[str, Any]:
    """Byte-level BPE over the 256 byte symbols plus a few merges (tests only)."""
    from .tokenizer import bytes_to_unicode

    b2u = bytes_to_unicode()
    tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    types = [3, 3, 3]
    for b in range(256):
        tokens.append(b2u[b])
        types.append(1)
    merges = []
    pairs = [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("i", "n"), ("a", "n"), ("e", "r"), ("o", "n")]
    for left, right in pairs:
        if len(tokens) >= vocab_size:
            break
        merges.append(f"{left} {right}")
        tokens.append(left + right)
        types.append(1)
    while len(tokens) < vocab_size:
        tokens.append(f"<unused{len(tokens)}>")
        types.append(4)
    return {"model": "gpt2", "pre": "smollm", "tokens": tokens, "token_types": types,
            "merges": merges, "bos_id": 1, "eos_id": 2, "pad_id": 2, "chat_template": ""}


def synthetic(
    *,
    seed: int = 0,
    n_layers: int = 2,
    d_model: int = 128,
    d_ff: int = 256,
    n_heads: int = 4,
    n_kv_heads: int = 2,
    vocab_size: int = 300,
    ctx_len: int = 256,
) -> bytes:
    """A small random-weight artifact in the same format (for parity tests)."""
    rng = np.random.Generator(np.random.PCG64(seed))
    head_dim = d_model // n_heads
    config = Config(n_layers=n_layers, d_model=d_model, d_ff=d_ff, n_heads=n_heads,
                    n_kv_heads=n_kv_heads, head_dim=head_dim, vocab_size=vocab_size,
                    ctx_len=ctx_len, rope_theta="10000.0", norm_eps_q32=42950,
                    attn_scale_q30=attn_scale_q30(head_dim))
    t: dict[str, npt.NDArray[Any]] = {}

    def q4(name: str, rows: int, cols: int, spread: float) -> None:
        codes = rng.integers(0, 16, size=(rows, cols), dtype=np.uint8)
        d = rng.uniform(0.2, 1.0, size=(rows, cols // 32)) * spread / 15
        m = -d * rng.uniform(6.0, 9.0, size=d.shape)
        t[f"{name}.codes"] = pack_nibbles(codes)
        t[f"{name}.scale"] = np.round(d * 2**24).astype("<i4")
        t[f"{name}.offset"] = np.round(m * 2**24).astype("<i4")

    kvd = n_kv_heads * head_dim
    for i in range(n_layers):
        p = f"blk.{i}"
        s_in = 2.0 / math.sqrt(d_model)
        q4(f"{p}.attn_q", d_model, d_model, 4 * s_in)
        q4(f"{p}.attn_k", kvd, d_model, 4 * s_in)
        q4(f"{p}.attn_v", kvd, d_model, 4 * s_in)
        q4(f"{p}.attn_output", d_model, d_model, 2 * s_in)
        q4(f"{p}.ffn_gate", d_ff, d_model, 4 * s_in)
        q4(f"{p}.ffn_up", d_ff, d_model, 4 * s_in)
        q4(f"{p}.ffn_down", d_model, d_ff, 4.0 / math.sqrt(d_ff))
        for nm in ("attn_norm", "ffn_norm"):
            t[f"{p}.{nm}"] = np.round(rng.uniform(0.5, 1.5, d_model) * 2**24).astype("<i4")
    t["output_norm"] = np.round(rng.uniform(0.5, 1.5, d_model) * 2**24).astype("<i4")
    t["tok_embd.codes"] = rng.integers(-127, 128, size=(vocab_size, d_model), dtype=np.int8)
    t["tok_embd.scale"] = np.round(
        rng.uniform(0.5, 1.0, (vocab_size, d_model // 32)) * 0.02 * 2**24).astype("<i4")
    t["rope.cos"], t["rope.sin"] = rope_tables(head_dim, ctx_len, 10000.0)
    return serialize(config=config, tokenizer=synthetic_tokenizer(vocab_size),
                     source={"synthetic_seed": seed}, tensors=t)


def iter_q4_names(config: Config) -> Iterator[str]:
    for i in range(config.n_layers):
        for m in Q4_MATS:
            yield f"blk.{i}.{m}"
