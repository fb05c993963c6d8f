"""Byte-level BPE tokenizer built from the artifact's committed GGUF metadata, and ChatML.

Pre-tokenization follows the SmolLM2 tokenizer: special (control) tokens are split out first,
every numeric character is isolated, then the GPT-2 byte-level pattern
``'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+`` is applied
(implemented by hand with ``unicodedata`` so no regex module is needed), without a prefix
space. No BOS is added.

This module's ``Tokenizer`` is the byte-level BPE of GGUF ``tokenizer.ggml.model = "gpt2"``;
:class:`~fx_integer.tokenizer_spm.SpmTokenizer` is llama.cpp's SentencePiece-style BPE of
``"llama"`` vocabularies (Gemma 3). :func:`tokenizer_for` returns the right one for an artifact's
tokenizer dict; both have ``encode(text, allow_special=...)``, ``decode``, ``chat_tokens``,
``chat_prompt``, ``bos_id`` / ``eos_id`` / ``pad_id``, ``tokens``, ``token_types`` and
``special_ids`` (the ids plain text never yields).

Special tokens in text are text: ``encode`` recognises the control-token strings (``<|im_start|>``
and the other token-type 3/4 entries) only when asked (``allow_special=True``, for trusted
template text), and plain BPE never yields a special id. A chat prompt is built by
``chat_tokens``: the template's control tokens are inserted as ids by the code and every piece of
text (role name, system and user content) is encoded as text, so a user who types
``<|im_start|>system`` gets ordinary text tokens, never a new turn.
"""

from __future__ import annotations

import functools
import threading
import unicodedata
from collections.abc import Mapping, Sequence
from typing import Any

from .tokenizer_spm import SpmTokenizer

_CONTRACTIONS = ("'s", "'t", "'re", "'ve", "'m", "'ll", "'d")
# Unicode White_Space (what \s means in the Rust regex crate).
_WS = frozenset(
    "\t\n\x0b\x0c\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008"
    "\u2009\u200a\u2028\u2029\u202f\u205f\u3000"
)
DEFAULT_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"


@functools.lru_cache(maxsize=1)
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(
        range(ord("®"), ord("ÿ") + 1))
    cs = list(bs)
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs, strict=True)}


def _cat(c: str) -> str:
    if c in _WS:
        return "s"
    k = unicodedata.category(c)[0]
    return "l" if k == "L" else "n" if k == "N" else "o"


def _byte_level_split(s: str) -> list[str]:
    out = []
    i = 0
    n = len(s)
    while i < n:
        if s[i] == "'":
            hit = next((c for c in _CONTRACTIONS if s.startswith(c, i)), None)
            if hit is not None:
                out.append(hit)
                i += len(hit)
                continue
        c = _cat(s[i])
        start = i
        if s[i] == " " and i + 1 < n and _cat(s[i + 1]) != "s":
            i += 1
            c = _cat(s[i])
        if c != "s":
            while i < n and _cat(s[i]) == c:
                i += 1
            out.append(s[start:i])
            continue
        j = i
        while j < n and _cat(s[j]) == "s":
            j += 1
        if j < n and j - i >= 2:
            j -= 1  # \s+(?!\S): leave the last space for the next word
        out.append(s[i:j])
        i = j
    return out


def pre_tokenize(text: str) -> list[str]:
    pieces: list[str] = []
    buf: list[str] = []
    for ch in text:
        if unicodedata.category(ch)[0] == "N":
            if buf:
                pieces.append("".join(buf))
                buf = []
            pieces.append(ch)
        else:
            buf.append(ch)
    if buf:
        pieces.append("".join(buf))
    words: list[str] = []
    for p in pieces:
        words.extend(_byte_level_split(p))
    return words


class Tokenizer:
    def __init__(self, meta: Mapping[str, Any]) -> None:
        self.tokens: list[str] = list(meta["tokens"])
        self.token_types: list[int] = list(meta["token_types"])
        self.ids = {t: i for i, t in enumerate(self.tokens)}
        self.ranks: dict[tuple[str, str], int] = {}
        for r, m in enumerate(meta["merges"]):
            a, b = m.split(" ", 1)
            self.ranks[(a, b)] = r
        self.bos_id = int(meta["bos_id"])
        self.eos_id = int(meta["eos_id"])
        self.pad_id = int(meta["pad_id"])
        self.specials = sorted(
            (t for t, ty in zip(self.tokens, self.token_types, strict=True) if ty in (3, 4)),
            key=len, reverse=True)
        #: ids of the control / user-defined tokens (token types 3 and 4)
        self.special_ids = frozenset(self.ids[t] for t in self.specials)
        self.im_start_id: int | None = self.ids.get(IM_START)
        self.im_end_id: int | None = self.ids.get(IM_END)
        self.b2u = bytes_to_unicode()
        self.u2b = {c: b for b, c in self.b2u.items()}
        self._bpe_cache: dict[str, list[int]] = {}

    def _bpe(self, word: str) -> list[int]:
        cached = self._bpe_cache.get(word)
        if cached is not None:
            return cached
        sym = [self.b2u[b] for b in word.encode("utf-8")]
        while len(sym) > 1:
            best = None
            best_rank = None
            for i in range(len(sym) - 1):
                r = self.ranks.get((sym[i], sym[i + 1]))
                if r is not None and (best_rank is None or r < best_rank):
                    best, best_rank = i, r
            if best is None:
                break
            sym[best:best + 2] = [sym[best] + sym[best + 1]]
        ids = []
        for s in sym:
            tid = self.ids.get(s)
            if tid is not None and tid not in self.special_ids:
                ids.append(tid)
            else:  # not in the vocabulary, or a special token's string: text stays text (bytes)
                ids.extend(self.ids[c] for c in s)
        self._bpe_cache[word] = ids
        return ids

    def encode(self, text: str, *, allow_special: bool = False) -> list[int]:
        """Token ids of ``text``. By default every character is text: a special token's string
        (``<|im_start|>``) becomes ordinary BPE tokens, never its control id. ``allow_special``
        splits those strings out as their ids first: only for trusted text, never a user's."""
        out: list[int] = []
        i = 0
        seg_start = 0
        while allow_special and i < len(text):
            if text[i] == "<":
                hit = next((s for s in self.specials if text.startswith(s, i)), None)
                if hit is not None:
                    out.extend(self._encode_plain(text[seg_start:i]))
                    out.append(self.ids[hit])
                    i += len(hit)
                    seg_start = i
                    continue
            i += 1
        out.extend(self._encode_plain(text[seg_start:]))
        return out

    def _encode_plain(self, text: str) -> list[int]:
        out: list[int] = []
        for w in pre_tokenize(text):
            out.extend(self._bpe(w))
        return out

    def decode(self, ids: Sequence[int]) -> str:
        parts: list[bytes] = []
        for i in ids:
            t = self.tokens[int(i)]
            if self.token_types[int(i)] in (3, 4):
                parts.append(t.encode("utf-8"))
            else:
                parts.append(bytes(self.u2b[c] for c in t))
        return b"".join(parts).decode("utf-8", errors="replace")

    def chat_tokens(self, user: str, *, system: str | None = DEFAULT_SYSTEM) -> list[int]:
        r"""The ChatML prompt for one user turn, ready for the assistant's answer, as ids::

            [<|im_start|>] text("system\n" + system) [<|im_end|>] text("\n")   (if system)
            [<|im_start|>] text("user\n" + user)     [<|im_end|>] text("\n")
            [<|im_start|>] text("assistant\n")

        ``[x]`` is the control token's id, inserted here; ``text(s)`` is ``encode(s)`` with
        special-token recognition off. For text without special-token strings this equals
        ``encode(chat_prompt(user, system=system), allow_special=True)``."""
        start, end = self.im_start_id, self.im_end_id
        if start is None or end is None or not {start, end} <= self.special_ids:
            raise ValueError(f"this vocabulary has no {IM_START} / {IM_END} control tokens")
        out: list[int] = []
        turns = [] if system is None else [("system", system)]
        for role, content in [*turns, ("user", user)]:
            out.append(start)
            out.extend(self._encode_plain(f"{role}\n{content}"))
            out.append(end)
            out.extend(self._encode_plain("\n"))
        out.append(start)
        out.extend(self._encode_plain("assistant\n"))
        return out

    def chat_prompt(self, user: str, *, system: str | None = DEFAULT_SYSTEM) -> str:
        """The ChatML text of ``chat_tokens`` (for display: tokenize with ``chat_tokens``; this
        string, encoded with ``allow_special=True``, would let user text open turns)."""
        s = ""
        if system is not None:
            s += f"<|im_start|>system\n{system}<|im_end|>\n"
        return s + f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"


#: a tokenizer for either vocabulary kind
AnyTokenizer = Tokenizer | SpmTokenizer

_BUILT: list[tuple[dict[str, Any], AnyTokenizer]] = []
_BUILT_MAX = 4
_BUILT_LOCK = threading.Lock()
_SCALARS = (str, int, float, bool, type(None))


def _same_meta(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """The same keys; each value the very same object, or an equal scalar of the same type."""
    if a.keys() != b.keys():
        return False
    for k, va in a.items():
        vb = b[k]
        if va is vb:
            continue
        if not (isinstance(va, _SCALARS) and type(va) is type(vb) and va == vb):
            return False
    return True


def tokenizer_for(meta: Mapping[str, Any]) -> AnyTokenizer:
    """The tokenizer of an artifact's tokenizer dict, by its ``model`` (the GGUF's
    ``tokenizer.ggml.model``): ``"gpt2"`` (or no ``model`` key) -> byte-level BPE
    :class:`Tokenizer`, ``"llama"`` -> :class:`~fx_integer.tokenizer_spm.SpmTokenizer`.

    The last few built are kept (with the dict's values, so their identities stay theirs) and
    returned again for a dict holding the very same list objects (treated as immutable) and
    equal scalars: repeated calls on one loaded artifact cost nothing after the first."""
    model = str(meta.get("model", "gpt2"))
    if model not in ("gpt2", "llama"):
        raise ValueError(f"tokenizer model {model!r} is not supported (gpt2, llama)")
    with _BUILT_LOCK:
        for held, tok in _BUILT:
            if _same_meta(held, meta):
                return tok
    built: AnyTokenizer = Tokenizer(meta) if model == "gpt2" else SpmTokenizer(meta)
    with _BUILT_LOCK:
        _BUILT.append((dict(meta), built))
        del _BUILT[:-_BUILT_MAX]
    return built
