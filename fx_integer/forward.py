"""The one forward pass of the integer engine, driven by the artifact's config.

Every architecture the engine runs (llama, gemma3, qwen3, cohere2, a mixture-of-experts FFN) is
this one function reading :class:`~fx_integer.artifact.Config`: which norm, where the norms sit,
QK-norm, the activation, the embedding scale, the RoPE layout and base per layer kind, sliding
windows, NoPE layers, the parallel block, experts and their router, the logit scale. There is no
per-model fork: a backend implements the :class:`Ops` protocol once and runs every model.

Matrices are addressed by logical groups (``blk.3.qkv``: the q, k and v projections; the
backend's :attr:`Ops.plan` maps a group to the fused matrices it holds, see
:func:`fusion_plan`): fusing rows of different matrices into one matmul cannot change a byte,
every output element is its own exact sum.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

import numpy as np
import numpy.typing as npt

from .artifact import Artifact, Config, QWeight

I64 = npt.NDArray[np.int64]
M = TypeVar("M")


class Ops(Protocol):
    """The operations the forward pass needs; arrays are backend arrays (numpy, CuPy)."""

    config: Config
    #: logical matrix group -> the fused matrices that make it, in output order
    plan: dict[str, list[str]]

    @property
    def xp(self) -> Any: ...

    def embed(self, tokens: I64) -> Any: ...
    def rmsnorm(self, x: Any, gain: str) -> Any: ...
    def layernorm(self, x: Any, gain: str) -> Any: ...
    def matmul(self, x: Any, mat: str) -> Any: ...
    def rope(self, x: Any, pos: I64, table: str = "") -> Any: ...
    def attention(self, q: Any, k: Any, v: Any, qpos: I64, window: int = 0) -> Any: ...
    def swiglu(self, g: Any, u: Any) -> Any: ...
    def geglu(self, g: Any, u: Any) -> Any: ...
    def scale(self, x: Any, factor_q24: int) -> Any: ...
    def route(self, logits: Any, k: int, gating: str, normalise: bool) -> tuple[I64, Any]: ...
    def combine(self, n: int, d: int, experts: I64, weights: Any,
                ys: Sequence[tuple[int, I64, Any]]) -> Any: ...
    def add(self, a: Any, b: Any) -> Any: ...
    def zeros(self, shape: tuple[int, ...]) -> Any: ...


class KVCache:
    """Per-sequence key/value cache: per layer [capacity, n_kv_heads, head_dim] arrays."""

    def __init__(self, ops: Ops) -> None:
        self.ops = ops
        self.length = 0
        self.k: list[Any] = []
        self.v: list[Any] = []
        self.tokens: list[int] = []

    def _ensure(self, n: int) -> None:
        cfg = self.ops.config
        cap = self.k[0].shape[0] if self.k else 0
        if n <= cap:
            return
        new_cap = max(n, 2 * cap, 64)
        shape = (new_cap, cfg.n_kv_heads, cfg.head_dim)
        for lst in (self.k, self.v):
            for i in range(cfg.n_layers):
                buf = self.ops.zeros(shape)
                if i < len(lst):
                    buf[:cap] = lst[i][:cap]
                    lst[i] = buf
                else:
                    lst.append(buf)

    def clone(self) -> KVCache:
        c = KVCache(self.ops)
        c.length = self.length
        c.k = [a.copy() for a in self.k]
        c.v = [a.copy() for a in self.v]
        c.tokens = list(self.tokens)
        return c


# ------------------------------------------------------------------------- matrix groups


def layer_groups(cfg: Config, layer: int) -> dict[str, tuple[str, ...]]:
    """The logical matrix groups of one layer: group name -> member matrices (output order)."""
    p = f"blk.{layer}"
    out = {
        f"{p}.qkv": (f"{p}.attn_q", f"{p}.attn_k", f"{p}.attn_v"),
        f"{p}.attn_output": (f"{p}.attn_output",),
    }
    if is_moe(cfg, layer):
        out[f"{p}.router"] = (f"{p}.ffn_gate_inp",)
        for e in range(cfg.n_experts):
            out[f"{p}.gate_up.{e}"] = (f"{p}.ffn_gate_exps.{e}", f"{p}.ffn_up_exps.{e}")
            out[f"{p}.ffn_down.{e}"] = (f"{p}.ffn_down_exps.{e}",)
    else:
        out[f"{p}.gate_up"] = (f"{p}.ffn_gate", f"{p}.ffn_up")
        out[f"{p}.ffn_down"] = (f"{p}.ffn_down",)
    return out


def is_moe(cfg: Config, layer: int) -> bool:
    """Whether the layer's FFN is the mixture of experts (else the dense gated FFN)."""
    return bool(cfg.n_experts) and layer >= cfg.n_dense_lead


def all_groups(art: Artifact) -> dict[str, tuple[str, ...]]:
    """Every logical group of the model, ``output`` last (the tied embedding or ``output``)."""
    out: dict[str, tuple[str, ...]] = {}
    for layer in range(art.config.n_layers):
        out.update(layer_groups(art.config, layer))
    out["output"] = ("output",) if art.has_weight("output") else ("tok_embd",)
    return out


def _fusable(a: QWeight, b: QWeight) -> bool:
    return (a.group == b.group and a.qmax == b.qmax and a.shape[1] == b.shape[1]
            and (a.offset is None) == (b.offset is None) and a.format == b.format)


def fusion_plan(art: Artifact) -> tuple[dict[str, tuple[str, ...]], dict[str, list[str]]]:
    """(fused matrix -> members, logical group -> fused matrices): consecutive members of a
    group that share a format are fused into one matrix, named as the group when the whole
    group fuses (format 1 always: ``blk.L.qkv``), else ``group#i``."""
    layout: dict[str, tuple[str, ...]] = {}
    plan: dict[str, list[str]] = {}
    for group, members in all_groups(art).items():
        runs: list[list[str]] = []
        prev: QWeight | None = None
        for m in members:
            w = art.weight(m)
            if prev is not None and _fusable(prev, w):
                runs[-1].append(m)
            else:
                runs.append([m])
            prev = w
        names = [group] if len(runs) == 1 else [f"{group}#{i}" for i in range(len(runs))]
        for name, run in zip(names, runs, strict=True):
            layout[name] = tuple(run)
        plan[group] = names
    return layout, plan


def fused_weight(art: Artifact, members: Sequence[str]) -> QWeight:
    """Members concatenated along the output dimension (they share a format)."""
    ws = [art.weight(m) for m in members]
    if len(ws) == 1:
        return ws[0]
    off = None if ws[0].offset is None else np.concatenate([w.offset for w in ws
                                                             if w.offset is not None])
    return QWeight(np.concatenate([w.codes for w in ws]), np.concatenate([w.scale for w in ws]),
                   off, ws[0].group, ws[0].qmax, ws[0].format)


def build_matrices(art: Artifact, make: Callable[[QWeight], M]
                   ) -> tuple[dict[str, M], dict[str, list[str]]]:
    """Every fused matrix of the forward built by ``make`` into a backend's representation,
    and the plan (:func:`fusion_plan`)."""
    layout, plan = fusion_plan(art)
    return {name: make(fused_weight(art, members)) for name, members in layout.items()}, plan


def linear(ops: Ops, x: Any, group: str) -> Any:
    """x times the group's matrices, their outputs side by side."""
    parts = [ops.matmul(x, m) for m in ops.plan[group]]
    return parts[0] if len(parts) == 1 else ops.xp.concatenate(parts, axis=1)


# ----------------------------------------------------------------------------- forward


def forward(ops: Ops, batch: Sequence[tuple[KVCache, Sequence[int]]], *,
            all_logits: bool = False, logits_from: int = 0) -> list[Any]:
    """Append each sequence's new tokens to its cache; return logits ([rows, V] Q.16).

    Rows of all sequences go through the matmuls together (batching cannot change a row's
    bytes: every op is row-local except attention, which reads only its own sequence, and the
    experts, which run each row's own choice). ``all_logits`` returns a row per new token from
    the ``logits_from``-th new token of each sequence on (the output head runs on those rows
    only), otherwise only the last row per sequence.
    """
    cfg = ops.config
    xp = ops.xp
    h, kv, hd = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    qd, kvd = cfg.q_dim, cfg.kv_dim
    toks: list[int] = []
    pos: list[int] = []
    spans: list[tuple[int, int, int]] = []  # (row start, row end, cache length before)
    if all_logits and any(not 0 <= logits_from < len(new) for _, new in batch):
        raise ValueError("logits_from must be below every sequence's number of new tokens")
    for cache, new in batch:
        if len(new) == 0:
            raise ValueError("each sequence in a forward batch needs at least one new token")
        if cache.length + len(new) > cfg.ctx_len:
            raise ValueError(f"context length {cfg.ctx_len} exceeded")
        start = len(toks)
        toks.extend(int(t) for t in new)
        pos.extend(range(cache.length, cache.length + len(new)))
        spans.append((start, len(toks), cache.length))
        cache._ensure(cache.length + len(new))
    tok_arr = np.asarray(toks, dtype=np.int64)
    if tok_arr.min() < 0 or tok_arr.max() >= cfg.vocab_size:
        raise ValueError("token id out of range")
    pos_arr = np.asarray(pos, dtype=np.int64)
    n = len(toks)

    x = ops.embed(tok_arr)  # [n, d]
    if cfg.embd_scale_q24:
        x = ops.scale(x, cfg.embd_scale_q24)
    for layer in range(cfg.n_layers):
        p = f"blk.{layer}"
        kind = cfg.kind(layer)
        hn = _norm(ops, cfg, x, f"{p}.attn_norm")  # [n, d]
        qkv = linear(ops, hn, f"{p}.qkv")  # [n, qd + 2 kvd]
        q = qkv[:, :qd].reshape(n, h, hd)
        k = qkv[:, qd:qd + kvd].reshape(n, kv, hd)
        v = qkv[:, qd + kvd:].reshape(n, kv, hd)
        if cfg.qk_norm:
            q = ops.rmsnorm(q.reshape(n * h, hd), f"{p}.attn_q_norm").reshape(n, h, hd)
            k = ops.rmsnorm(k.reshape(n * kv, hd), f"{p}.attn_k_norm").reshape(n, kv, hd)
        if kind == "s" and cfg.rope_theta_swa:
            q = ops.rope(q, pos_arr, table="swa")
            k = ops.rope(k, pos_arr, table="swa")
        elif kind != "n":
            q = ops.rope(q, pos_arr)
            k = ops.rope(k, pos_arr)
        outs = []
        for (cache, _), (r0, r1, before) in zip(batch, spans, strict=True):
            after = before + (r1 - r0)
            cache.k[layer][before:after] = k[r0:r1]
            cache.v[layer][before:after] = v[r0:r1]
            kc, vc = cache.k[layer][:after], cache.v[layer][:after]
            if kind == "s":
                outs.append(ops.attention(q[r0:r1], kc, vc, pos_arr[r0:r1],
                                          window=cfg.window))
            else:
                outs.append(ops.attention(q[r0:r1], kc, vc, pos_arr[r0:r1]))
        att = outs[0] if len(outs) == 1 else xp.concatenate(outs, axis=0)  # [n, qd]
        att = linear(ops, att, f"{p}.attn_output")
        if cfg.post_norms:
            att = ops.rmsnorm(att, f"{p}.post_attention_norm")
        if cfg.parallel_block:
            ffn = _ffn(ops, cfg, hn, layer)
            x = ops.add(x, ops.add(att, ffn))
            continue
        x = ops.add(x, att)
        ffn = _ffn(ops, cfg, _norm(ops, cfg, x, f"{p}.ffn_norm"), layer)
        if cfg.post_norms:
            ffn = ops.rmsnorm(ffn, f"{p}.post_ffw_norm")
        x = ops.add(x, ffn)
    for (cache, new), (_, _, before) in zip(batch, spans, strict=True):
        cache.length = before + len(new)
        cache.tokens.extend(int(t) for t in new)
    if all_logits and logits_from > 0:
        idx = np.concatenate([np.arange(r0 + logits_from, r1, dtype=np.int64)
                              for (r0, r1, _) in spans])
        rows = x[xp.asarray(idx)]
        spans = [(r0 - i * logits_from, r1 - (i + 1) * logits_from, before)
                 for i, (r0, r1, before) in enumerate(spans)]
    elif all_logits:
        rows = x
    else:
        idx = np.asarray([r1 - 1 for (_, r1, _) in spans], dtype=np.int64)
        rows = x[xp.asarray(idx)]
    logits = linear(ops, _norm(ops, cfg, rows, "output_norm"), "output")
    if cfg.logit_scale_q24:
        logits = ops.scale(logits, cfg.logit_scale_q24)
    finish = getattr(ops, "finish", None)
    if finish is not None:
        finish()  # backends that defer their bound checks raise here
    if all_logits:
        return [logits[r0:r1] for (r0, r1, _) in spans]
    return [logits[i:i + 1] for i in range(len(spans))]


def _norm(ops: Ops, cfg: Config, x: Any, gain: str) -> Any:
    if cfg.norm == "layer":
        return ops.layernorm(x, gain)
    return ops.rmsnorm(x, gain)


def _act(ops: Ops, cfg: Config, g: Any, u: Any) -> Any:
    if cfg.act == "gelu_tanh":
        return ops.geglu(g, u)
    return ops.swiglu(g, u)


def _ffn(ops: Ops, cfg: Config, hn: Any, layer: int) -> Any:
    p = f"blk.{layer}"
    if not is_moe(cfg, layer):
        gu = linear(ops, hn, f"{p}.gate_up")  # [n, 2 d_ff]
        return linear(ops, _act(ops, cfg, gu[:, :cfg.d_ff], gu[:, cfg.d_ff:]), f"{p}.ffn_down")
    return _moe(ops, cfg, hn, layer)


def _moe(ops: Ops, cfg: Config, hn: Any, layer: int) -> Any:
    """Each row's top-k experts (router softmax), their outputs weighted in Q.30.

    A row runs only its own experts; rows that chose an expert go through its matrices
    together, which cannot change a byte (every matmul output element is its own exact sum).
    """
    p = f"blk.{layer}"
    xp = ops.xp
    f = cfg.d_ff_expert
    logits = linear(ops, hn, f"{p}.router")  # [n, E] Q.16
    experts, weights = ops.route(logits, cfg.n_experts_used, cfg.moe_gating,
                                 bool(cfg.moe_norm_topk))  # [n, k] int64, [n, k] Q.30
    ys = []
    for e in range(cfg.n_experts):
        rows = np.nonzero((np.asarray(experts) == e).any(axis=1))[0]
        if rows.size == 0:
            continue
        sel = xp.asarray(rows)
        gu = linear(ops, hn[sel], f"{p}.gate_up.{e}")
        y = linear(ops, _act(ops, cfg, gu[:, :f], gu[:, f:]), f"{p}.ffn_down.{e}")
        ys.append((e, rows, y))
    return ops.combine(hn.shape[0], cfg.d_model, experts, weights, ys)
