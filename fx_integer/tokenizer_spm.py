"""SentencePiece-style BPE by scores (GGUF ``tokenizer.ggml.model = "llama"``), as llama.cpp.

This is llama.cpp's ``llm_tokenizer_spm`` (src/llama-vocab.cpp) re-implemented from its
semantics, so ids agree with ``llama_tokenize`` on the same GGUF vocabulary (Gemma 3 and the
other SPM vocabularies):

1. **Special-token partition** (``tokenizer_st_partition``): the control (token type 3),
   unknown (2) and user-defined (4) tokens are taken in order of decreasing UTF-8 length (ties by
   id; llama.cpp's ``std::sort`` leaves ties unordered, which matters only for equal-length
   tokens that can overlap: none in Gemma 3's vocabulary) and every occurrence of each in the
   remaining raw text is split out as that token's id. User-defined tokens are *always* split
   out (llama.cpp does so even with ``parse_special = false``: Gemma's ``"\\n"``, runs of spaces,
   tabs and newlines, ``<table>``...); control and unknown tokens only with ``allow_special``.
2. **Per raw fragment**: a space is prepended when ``add_space_prefix`` is set and the previous
   fragment was a special token (or it is the first), then every ``" "`` becomes ``"▁"``
   (U+2581) and the fragment is tokenized on its own:

   * symbols are the UTF-8 characters of the fragment;
   * every adjacent pair whose concatenation is a vocabulary token goes into a priority queue
     keyed by that token's score, highest first, ties broken by the leftmost position;
   * the top pair is merged if both symbols are still as they were when it was queued (neither
     merged away, lengths still summing to the pair's length), and the new symbol's pairs with its
     neighbours are queued; until the queue is empty;
   * each final symbol is its token's id, or, when the text is not a token (a single character
     outside the vocabulary), its UTF-8 bytes as the byte tokens ``<0xXX>``.
3. ``add_bos`` / ``add_eos`` (the GGUF's ``add_bos_token`` / ``add_eos_token``) add BOS / EOS when
   ``add_special`` (llama-cpp-python's ``add_bos`` argument) is true.

No float decides an id: the GGUF's float32 scores are carried as their IEEE-754 bit patterns
(``scores_f32_bits``) and turned at load into integers with the same order (non-negative floats:
the bits; negative: minus the magnitude bits, so -0.0 == +0.0), compared exactly as llama.cpp
compares the floats. NaN scores are refused.

llama.cpp's attribute rules that change tokenization are applied to the token types: tokens
named as end-of-generation markers (``<end_of_turn>``, ``</s>``, ``<|im_end|>``...) become control
tokens even where the GGUF says user-defined (Gemma 3's ``</s>``), except ``</s>`` in vocabularies
with ``<|tool_response>`` / ``<|plamo:eos|>`` (there it is a normal token); control tokens
whose text contains ``unused`` get the unused flag (no effect on ids). Rules llama.cpp keys
on model names (phi-3 / jina / modern-bert strip flags) are not applied: they concern no SPM
vocabulary we serve.

Two deliberate departures, both unreachable with Gemma 3's vocabulary (the tests check that):
a merged symbol whose text is a control or unknown token is never emitted as that id from text
(it is split back into its two halves, recursively: text never yields a control id unless
``allow_special``); a byte with no ``<0xXX>`` token (nor a one-character token) becomes
``unk_id`` where llama.cpp would throw.

Decode follows llama.cpp's ``token_to_piece``: normal tokens with ``▁`` as a space, byte tokens
as their byte (consecutive bytes reassembled into UTF-8), user-defined tokens verbatim, control
and unknown tokens only with ``render_special``, unused/undefined tokens as nothing. No leading
space is stripped (Gemma's ``add_space_prefix`` is false).

Chat prompts use llama.cpp's built-in ``gemma`` template (with BOS, as llama.cpp tokenizes it)::

    <bos><start_of_turn>user\\n[system\\n\\n]user<end_of_turn>\\n<start_of_turn>model\\n

(system and user text trimmed of ASCII whitespace), with the control tokens inserted as ids by
the code and every piece of text encoded as text, so a user who types ``<start_of_turn>`` gets
ordinary text tokens, never a new turn. (Gemma 3 270M's GGUF carries no ``tokenizer.chat_template``;
this is the template llama.cpp applies for Gemma.) User-defined tokens typed by a user become
their ids, as in llama.cpp: they are text-like by definition (Gemma 3's also include
``<start_of_image>`` / ``<end_of_image>`` / ``[multimodal]``, which a text-only prompt never needs).

Encoding is lossy in one way only, as in llama.cpp: a literal ``"▁"`` (U+2581) in the text is
indistinguishable from an escaped space, so it decodes as ``" "``.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

__all__ = ["SPM_SPACE", "SpmTokenizer", "score_keys"]

SPM_SPACE = "\u2581"
START_OF_TURN = "<start_of_turn>"
END_OF_TURN = "<end_of_turn>"

# GGUF token types (llama.cpp's llama_token_type)
_UNDEFINED, _NORMAL, _UNKNOWN, _CONTROL, _USER_DEFINED, _UNUSED, _BYTE = range(7)
# llama.cpp's llama_token_attr bits
ATTR_UNDEFINED = 0
ATTR_UNKNOWN = 1 << 0
ATTR_UNUSED = 1 << 1
ATTR_NORMAL = 1 << 2
ATTR_CONTROL = 1 << 3
ATTR_USER_DEFINED = 1 << 4
ATTR_BYTE = 1 << 5
#: token type -> attribute (types beyond 6, or negative, are undefined)
_TYPE_LUT = (ATTR_UNDEFINED, ATTR_NORMAL, ATTR_UNKNOWN, ATTR_CONTROL, ATTR_USER_DEFINED,
             ATTR_UNUSED, ATTR_BYTE)
#: token texts llama.cpp makes end-of-generation and forces to control (llama-vocab.cpp, load)
_EOG_NAMES = frozenset((
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
    "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
    "<｜end▁of▁sentence｜>", "[e~["))
_S_NORMAL_MARKERS = frozenset(("<|tool_response>", "<|plamo:eos|>"))
_FRAGMENT_CACHE_MAX = 8192
#: what C's isspace() strips (llama.cpp's chat-template trim)
_C_SPACE = " \t\n\v\f\r"


def score_keys(bits: Sequence[int]) -> list[int]:
    """Integers ordered exactly as the float32 values with these IEEE-754 bit patterns.

    Non-negative floats order as their bits; a negative float is minus its magnitude bits
    (-0.0 and +0.0 both give 0, as they compare equal). NaN has no order: refused. (Integer
    arithmetic on the bit patterns only: no float is formed.)"""
    b = np.asarray(bits, dtype=np.int64)
    if b.ndim != 1:
        raise ValueError("score bits must be a flat list")
    if b.size and (int(b.min()) < 0 or int(b.max()) > 0xFFFFFFFF):
        raise ValueError("score bits are not 32-bit patterns")
    mag = b & 0x7FFFFFFF
    if b.size and int(mag.max()) > 0x7F800000:
        raise ValueError("a tokenizer score is NaN")
    keys: list[int] = np.where(b & 0x80000000, -mag, mag).tolist()
    return keys


class SpmTokenizer:
    """llama.cpp's SPM tokenizer over the artifact's tokenizer dict (see the module doc).

    Reads ``tokens``, ``token_types``, ``bos_id``, ``eos_id``, ``pad_id`` and the optional
    ``scores_f32_bits`` (default: every score 0), ``unk_id`` (default 0), ``add_bos`` (default
    True), ``add_eos`` (default False), ``add_space_prefix`` (default True: llama.cpp's defaults
    for an SPM vocabulary without those keys)."""

    model = "llama"

    def __init__(self, meta: Mapping[str, Any]) -> None:
        tokens = list(meta["tokens"])
        n = len(tokens)
        if not all(type(t) is str for t in tokens):
            tokens = [str(t) for t in tokens]
        types_raw = meta.get("token_types")
        types = list(map(int, types_raw)) if types_raw is not None else [_NORMAL] * n
        if len(types) != n:
            raise ValueError(f"{len(types)} token types for {n} tokens")
        bits = meta.get("scores_f32_bits")
        keys = score_keys(bits) if bits is not None else [0] * n
        if len(keys) != n:
            raise ValueError(f"{len(keys)} scores for {n} tokens")
        #: text -> id (all tokens, as llama.cpp's token_to_id: a repeated text keeps the last id)
        self.ids: dict[str, int] = dict(zip(tokens, range(n), strict=True))
        if "" in self.ids:  # llama.cpp renames an empty token "[EMPTY_<id>]"
            tokens = [t if t else f"[EMPTY_{i}]" for i, t in enumerate(tokens)]
            self.ids = dict(zip(tokens, range(n), strict=True))
        #: token texts as llama.cpp holds them
        self.tokens: list[str] = tokens
        self.token_types: list[int] = types
        self._keys = keys
        self.bos_id = int(meta["bos_id"])
        self.eos_id = int(meta["eos_id"])
        self.pad_id = int(meta["pad_id"])
        self.unk_id = int(meta.get("unk_id", 0))
        self.add_bos = bool(meta.get("add_bos", True))
        self.add_eos = bool(meta.get("add_eos", False))
        self.add_space_prefix = bool(meta.get("add_space_prefix", True))

        lut = np.zeros(max(max(types, default=0), len(_TYPE_LUT) - 1) + 1, dtype=np.int64)
        lut[: len(_TYPE_LUT)] = _TYPE_LUT
        ty = np.asarray(types, dtype=np.int64)
        attr_arr = lut[np.where(ty < 0, 0, ty)]
        for i in np.flatnonzero(attr_arr & ATTR_CONTROL).tolist():
            if "unused" in tokens[i]:  # llama.cpp's auto-detected unused control tokens
                attr_arr[i] |= ATTR_UNUSED
        eog = {self.ids[s] for s in _EOG_NAMES if s in self.ids}
        if 0 <= self.eos_id < n:
            eog.add(self.eos_id)
        for i in eog:
            if tokens[i] in _EOG_NAMES:
                attr_arr[i] |= ATTR_CONTROL
        s_id = self.ids.get("</s>")
        if s_id is not None and s_id in eog and any(tokens[i] in _S_NORMAL_MARKERS for i in eog):
            attr_arr[s_id] = ATTR_NORMAL
            eog.discard(s_id)
        #: llama.cpp's end-of-generation ids (EOS and the tokens named as turn/text ends; for
        #: Gemma 3: <eos> 1, <end_of_turn> 106, </s> 212): a chat answer ends at <end_of_turn>
        self.eog_ids: frozenset[int] = frozenset(eog)
        #: llama.cpp's token attributes (ATTR_* bits) after its load-time rules
        self.attrs: list[int] = attr_arr.tolist()
        special = ATTR_CONTROL | ATTR_UNKNOWN
        #: ids plain text never yields (control and unknown tokens): only ``allow_special`` text
        #: or the chat builder produce them
        self.control_ids: frozenset[int] = frozenset(
            np.flatnonzero(attr_arr & special).tolist())
        self.special_ids = self.control_ids
        # llama.cpp's cache_special_tokens: control, user-defined and unknown, longest first
        # (by UTF-8 length; ties by id)
        parts = [(-len(tokens[i].encode("utf-8")), i)
                 for i in np.flatnonzero(attr_arr & (special | ATTR_USER_DEFINED)).tolist()]
        parts.sort()
        self._partition: list[tuple[str, int, bool]] = [
            (tokens[i], i, i in self.control_ids) for _, i in parts]
        #: every prefix of a special token's text, and each such text's rank in _partition: the
        #: specials present in a text are found in one pass over it
        self._special_rank = {t: r for r, (t, _, _) in enumerate(self._partition)}
        self._special_prefixes = frozenset(
            t[:k] for t in self._special_rank for k in range(1, len(t) + 1))
        self._byte_ids = [self._byte_id(b) for b in range(256)]
        self._cache: dict[str, tuple[int, ...]] = {}
        self.start_of_turn_id: int | None = self.ids.get(START_OF_TURN)
        self.end_of_turn_id: int | None = self.ids.get(END_OF_TURN)

    def _byte_id(self, b: int) -> int:
        tid = self.ids.get(f"<0x{b:02X}>")
        if tid is None and b < 0x80:
            tid = self.ids.get(chr(b))
        return self.unk_id if tid is None else tid

    # ------------------------------------------------------------------ encoding
    def _present(self, text: str, allow_special: bool) -> list[int]:
        """Ranks (in _partition) of the special tokens occurring in ``text``, ascending."""
        prefixes, rank = self._special_prefixes, self._special_rank
        found: set[int] = set()
        n = len(text)
        for i in range(n):
            if text[i] not in prefixes:
                continue
            j = i + 1
            while True:
                r = rank.get(text[i:j])
                if r is not None:
                    found.add(r)
                j += 1
                if j > n or text[i:j] not in prefixes:
                    break
        return sorted(r for r in found if allow_special or not self._partition[r][2])

    def _split_special(self, text: str, allow_special: bool) -> list[str | int]:
        """llama.cpp's tokenizer_st_partition: raw text pieces (str) and special ids (int).
        Each special token in turn (longest first) splits every raw piece at its occurrences,
        found left to right without overlap."""
        frags: list[str | int] = [text]
        for r in self._present(text, allow_special):
            tok_text, tid, _ = self._partition[r]
            nxt: list[str | int] = []
            for f in frags:
                if isinstance(f, int) or tok_text not in f:
                    nxt.append(f)
                    continue
                for k, p in enumerate(f.split(tok_text)):
                    if k:
                        nxt.append(tid)
                    if p:
                        nxt.append(p)
            frags = nxt
        return frags

    def _spm(self, text: str) -> tuple[int, ...]:
        """One escaped raw fragment through the bigram merges (llm_tokenizer_spm_session)."""
        cached = self._cache.get(text)
        if cached is not None:
            return cached
        ids = self.ids
        keys = self._keys
        n = len(text)
        sym = list(text)  # each symbol's current text ("" once merged into its left neighbour)
        tree: list[Any] = list(text)  # each symbol's merge tree: a str leaf or (text, l, r)
        prev = list(range(-1, n - 1))
        nxt = list(range(1, n + 1))
        if n:
            nxt[-1] = -1
        heap: list[tuple[int, int, int, int]] = []
        push = heapq.heappush

        for i in range(1, n):
            tid = ids.get(sym[i - 1] + sym[i])
            if tid is not None:
                push(heap, (-keys[tid], i - 1, i, 2))
        while heap:
            _, left, right, size = heapq.heappop(heap)
            ls, rs = sym[left], sym[right]
            if not ls or not rs or len(ls) + len(rs) != size:
                continue  # one of them was merged since this pair was queued
            merged = ls + rs
            sym[left] = merged
            sym[right] = ""
            tree[left] = (merged, tree[left], tree[right])
            nr = nxt[right]
            nxt[left] = nr
            if nr >= 0:
                prev[nr] = left
            p = prev[left]
            if p >= 0:
                tid = ids.get(sym[p] + merged)
                if tid is not None:
                    push(heap, (-keys[tid], p, left, len(sym[p]) + len(merged)))
            if nr >= 0:
                tid = ids.get(merged + sym[nr])
                if tid is not None:
                    push(heap, (-keys[tid], left, nr, len(merged) + len(sym[nr])))

        out: list[int] = []
        i = 0 if n else -1
        while i != -1:
            self._emit(tree[i], out)
            i = nxt[i]
        res = tuple(out)
        if len(self._cache) >= _FRAGMENT_CACHE_MAX:
            self._cache.clear()
        self._cache[text] = res
        return res

    def _emit(self, node: Any, out: list[int]) -> None:
        text = node if isinstance(node, str) else node[0]
        tid = self.ids.get(text)
        if tid is not None and tid not in self.control_ids:
            out.append(tid)
        elif not isinstance(node, str):  # a control token's text made by merging: its halves
            self._emit(node[1], out)
            self._emit(node[2], out)
        else:
            out.extend(self._byte_ids[b] for b in text.encode("utf-8"))

    def encode(self, text: str, *, allow_special: bool = False,
               add_special: bool = True) -> list[int]:
        """Token ids of ``text``, as ``llama_tokenize(text, add_special, parse_special=
        allow_special)``. ``add_special``: BOS first (and EOS last) where the vocabulary says so
        (Gemma: BOS). By default every control-token string (``<start_of_turn>``) is text;
        ``allow_special`` splits those out as their ids: only for trusted text, never a user's.
        User-defined tokens (newlines, space runs, ``<table>``...) are split out always."""
        out: list[int] = []
        if add_special and self.add_bos:
            out.append(self.bos_id)
        out.extend(self._encode_text(text, allow_special))
        if add_special and self.add_eos:
            out.append(self.eos_id)
        return out

    def _encode_text(self, text: str, allow_special: bool = False) -> list[int]:
        out: list[int] = []
        prev_special = True
        for frag in self._split_special(text, allow_special) if text else []:
            if isinstance(frag, int):
                out.append(frag)
                prev_special = True
                continue
            if self.add_space_prefix and prev_special:
                frag = " " + frag
            out.extend(self._spm(frag.replace(" ", SPM_SPACE)))
            prev_special = False
        return out

    # ------------------------------------------------------------------ decoding
    def piece(self, token_id: int, *, render_special: bool = False) -> bytes:
        """The bytes of one token (llama.cpp's token_to_piece)."""
        a = self.attrs[int(token_id)]
        text = self.tokens[int(token_id)]
        if a & (ATTR_CONTROL | ATTR_UNKNOWN):
            return text.encode("utf-8") if render_special else b""
        if a & ATTR_USER_DEFINED:
            return text.encode("utf-8")
        if a & ATTR_NORMAL:
            return text.replace(SPM_SPACE, " ").encode("utf-8")
        if a & ATTR_BYTE:
            return bytes((int(text[3:5], 16),))
        return b""

    def decode(self, ids: Sequence[int], *, render_special: bool = False) -> str:
        """The text of ``ids`` (invalid UTF-8 becomes U+FFFD). Control tokens (``<bos>``,
        ``<end_of_turn>``) are rendered only with ``render_special``."""
        if any(int(i) < 0 for i in ids):
            raise IndexError("negative token id")
        return b"".join(self.piece(i, render_special=render_special) for i in ids).decode(
            "utf-8", errors="replace")

    # ------------------------------------------------------------------ chat
    def chat_text(self, user: str, *, system: str | None = None) -> str:
        r"""The text between the template's control tokens of the user's turn: ``"user
"``,
        then the system prompt and ``"

"`` when one is given (Gemma has no system turn), then
        the user's text, both trimmed of ASCII whitespace (llama.cpp's Gemma template)."""
        sys_text = "" if system is None else system.strip(_C_SPACE)
        prefix = sys_text + "\n\n" if sys_text else ""
        return f"user\n{prefix}{user.strip(_C_SPACE)}"

    def chat_tokens(self, user: str, *, system: str | None = None) -> list[int]:
        r"""Gemma's prompt for one user turn, ready for the model's answer, as ids::

            [<bos>] [<start_of_turn>] text(chat_text(user, system)) [<end_of_turn>] text("
")
            [<start_of_turn>] text("model
")

        ``[x]`` is the token's id, inserted here; ``text(s)`` is ``encode(s)`` with control-token
        recognition off, so ``<start_of_turn>`` typed by the user stays text. This is llama.cpp's
        built-in ``gemma`` chat template tokenized with BOS; for text without control-token
        strings it equals ``encode(chat_prompt(user, system=system), allow_special=True,
        add_special=False)``."""
        start, end = self.start_of_turn_id, self.end_of_turn_id
        if start is None or end is None or not {start, end} <= self.control_ids:
            raise ValueError(f"this vocabulary has no {START_OF_TURN} / {END_OF_TURN} "
                             f"control tokens")
        out = [self.bos_id, start]
        out.extend(self._encode_text(self.chat_text(user, system=system)))
        out.append(end)
        out.extend(self._encode_text("\n"))
        out.append(start)
        out.extend(self._encode_text("model\n"))
        return out

    def chat_prompt(self, user: str, *, system: str | None = None) -> str:
        """The text of ``chat_tokens``, BOS included (for display: tokenize with
        ``chat_tokens``; this string, encoded with ``allow_special=True``, would let user text
        open turns)."""
        return (f"{self.tokens[self.bos_id]}{START_OF_TURN}{self.chat_text(user, system=system)}"
                f"{END_OF_TURN}\n{START_OF_TURN}model\n")
