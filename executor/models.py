"""The content-addressed model store.

Layout under the store directory::

    sha256/<hex>            the model file, byte for byte, read-only (0444)
    sha256/<hex>.json       its manifest (:class:`ModelManifest`)

A model is named only by ``sha256:<hex>`` of its file. :meth:`ModelStore.open` hashes the file as
it reads it and refuses (``model_hash_mismatch``) any file that does not hash to its name, so a
tampered or truncated file is never handed to an engine. :meth:`ModelStore.status` is the cheap
check done for every request: it re-hashes only when the file's size, mtime or inode changed since
the last verification.

The manifest is not covered by the model hash (labels and preprocessing live beside the weights);
responses carry the manifest's own hash in their receipt so the record still names it.

Importers (``fx models import PATH|PACKAGE``): ``magika`` (from the installed ``magika`` wheel),
``silero-vad`` (from the ``silero-vad`` wheel, located without importing it: its package imports
torch) and any ``.onnx`` file (interface ``onnx-tensors``, signature read from the file).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import os
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue, ValidationError

from broker_schema.canonical import (
    HASH_PATTERN,
    HASH_PREFIX,
    content_hash,
    hash_from_hex,
    hex_of_hash,
    is_hash,
    sha256_hex,
)
from fx_node.errors import ModelError

__all__ = [
    "INTERFACES",
    "MANIFEST_FORMAT",
    "ModelManifest",
    "ModelStore",
    "ParamDoc",
    "TensorSpec",
    "file_sha256",
    "locate_package_model",
]

MANIFEST_FORMAT: Literal["fx-model-manifest/1"] = "fx-model-manifest/1"
#: Interfaces the ONNX engine implements (what request input and output mean).
INTERFACES = ("magika", "silero-vad", "onnx-tensors")
_BUF = 1 << 20


class TensorSpec(BaseModel):
    """One model input or output: name, element type, shape (None or a name for a free axis)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    name: str
    dtype: str
    shape: tuple[int | str | None, ...]


class ParamDoc(BaseModel):
    """A documented request parameter: its default applies when the request omits it."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    default: JsonValue
    doc: str


class ModelManifest(BaseModel):
    """What an engine needs to know about a stored model file."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    format: Literal["fx-model-manifest/1"] = MANIFEST_FORMAT
    hash: Annotated[str, Field(pattern=HASH_PATTERN)]
    size: int
    name: str
    #: Engine that runs it (``onnxruntime``, or a registered plugin engine such as ``integer``).
    engine: str
    #: How request input and output are read and written (see ``docs/executor.md``).
    interface: str
    #: Version of the preprocessing that turns request input into tensors.
    preprocessing_version: str
    inputs: tuple[TensorSpec, ...] = ()
    outputs: tuple[TensorSpec, ...] = ()
    params: dict[str, ParamDoc] = Field(default_factory=dict)
    #: Interface data the engine needs beside the weights (magika: labels, thresholds).
    config: dict[str, JsonValue] = Field(default_factory=dict)
    #: Where it came from (package and version, or a path), for people.
    source: str = ""

    def manifest_hash(self) -> str:
        """``sha256:`` of the manifest's canonical JSON (carried in response receipts)."""
        return content_hash(self.model_dump(mode="json"))


def file_sha256(path: Path) -> str:
    """``sha256:<hex>`` of a file's bytes, read in 1 MiB blocks."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(_BUF):
            h.update(block)
    return hash_from_hex(h.hexdigest())


@dataclass(frozen=True)
class _Verified:
    size: int
    mtime_ns: int
    inode: int


class ModelStore:
    """A directory of model files named by their sha256, each with a manifest.

    Thread-safe: the service calls :meth:`status` from its event loop (through a worker thread when
    a re-hash is needed) and engines call :meth:`open` from their threads.
    """

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self._dir = self.root / "sha256"
        self._verified: dict[str, _Verified] = {}
        #: model hash -> (manifest file stamp, manifest, manifest hash): see _manifest_entry
        self._manifests: dict[str, tuple[_Verified, ModelManifest, str]] = {}
        self._lock = threading.Lock()

    def path(self, model_hash: str) -> Path:
        """Where the file for ``model_hash`` lives (whether or not it exists)."""
        if not is_hash(model_hash):
            raise ModelError("model_unknown", f"not a model hash: {model_hash!r}")
        return self._dir / hex_of_hash(model_hash)

    def manifest(self, model_hash: str, *, stat: bool = True) -> ModelManifest:
        """The manifest of ``model_hash``; ``model_unknown`` if there is none, or if the file
        beside the model is not a valid manifest for that very hash (the manifest is not covered
        by the model hash, so a damaged or misplaced one must be refused, not trusted).

        Read and validated once per manifest content; ``stat=False`` skips even the stat that
        notices a rewritten manifest, for a caller that checked the file a moment ago (the
        executor, within one request)."""
        return self._manifest_entry(model_hash, stat=stat)[1]

    def manifest_hash(self, model_hash: str, *, stat: bool = True) -> str:
        """:meth:`ModelManifest.manifest_hash` of :meth:`manifest`, computed once per manifest
        content (the receipts of every response carry it); ``stat`` as for :meth:`manifest`."""
        return self._manifest_entry(model_hash, stat=stat)[2]

    def _manifest_entry(self, model_hash: str, *,
                        stat: bool = True) -> tuple[_Verified, ModelManifest, str]:
        """The manifest of ``model_hash`` with its hash, read and validated once per content:
        cached under the manifest file's (size, mtime, inode), so a manifest written again is
        read again, and one removed is ``model_unknown`` again."""
        if not stat:
            with self._lock:
                known = self._manifests.get(model_hash)
            if known is not None:
                return known
        mpath = self.path(model_hash).with_suffix(".json")
        try:
            st = mpath.stat()
        except FileNotFoundError:
            raise ModelError("model_unknown", f"no model {model_hash} in {self.root}") from None
        except OSError as exc:
            raise ModelError(
                "model_unknown", f"the manifest {mpath} is unreadable: {str(exc)[:500]}"
            ) from None
        stamp = _Verified(st.st_size, st.st_mtime_ns, st.st_ino)
        with self._lock:
            cached = self._manifests.get(model_hash)
        if cached is not None and cached[0] == stamp:
            return cached
        try:
            data = mpath.read_bytes()
            manifest = ModelManifest.model_validate_json(data)
        except FileNotFoundError:
            raise ModelError("model_unknown", f"no model {model_hash} in {self.root}") from None
        except (OSError, ValidationError) as exc:
            raise ModelError(
                "model_unknown", f"the manifest {mpath} is unreadable: {str(exc)[:500]}"
            ) from None
        if manifest.hash != model_hash:
            raise ModelError(
                "model_unknown", f"the manifest {mpath} describes {manifest.hash}, not {model_hash}"
            )
        entry = (stamp, manifest, manifest.manifest_hash())
        with self._lock:
            self._manifests[model_hash] = entry
        return entry

    def hashes(self) -> list[str]:
        """Every model hash present (a file with a manifest), sorted."""
        if not self._dir.is_dir():
            return []
        return sorted(
            hash_from_hex(p.name)
            for p in self._dir.iterdir()
            if is_hash(f"{HASH_PREFIX}{p.name}") and p.with_suffix(".json").exists()
        )

    def list(self) -> list[ModelManifest]:
        """The manifests of every model present."""
        return [self.manifest(h) for h in self.hashes()]

    def _stat(self, model_hash: str) -> _Verified | None:
        try:
            st = self.path(model_hash).stat()
        except FileNotFoundError:
            return None
        return _Verified(st.st_size, st.st_mtime_ns, st.st_ino)

    def needs_hashing(self, model_hash: str) -> bool:
        """True when :meth:`status` would have to re-hash the file (first use, or it changed)."""
        stat = self._stat(model_hash)
        with self._lock:
            return stat is not None and self._verified.get(model_hash) != stat

    def status(self, model_hash: str) -> Literal["ready", "absent", "corrupt"]:
        """``absent`` (no such file or manifest), ``corrupt`` (the bytes do not hash to the name)
        or ``ready``. Re-hashes only when the file changed since it was last verified."""
        if not is_hash(model_hash):
            return "absent"
        path = self.path(model_hash)
        stat = self._stat(model_hash)
        if stat is None or not path.with_suffix(".json").exists():
            return "absent"
        with self._lock:
            if self._verified.get(model_hash) == stat:
                return "ready"
        if file_sha256(path) != model_hash:
            with self._lock:
                self._verified.pop(model_hash, None)
            return "corrupt"
        with self._lock:
            self._verified[model_hash] = stat
        return "ready"

    def read_verified(self, model_hash: str) -> bytes:
        """The model file's bytes, checked against ``model_hash`` (``model_unknown`` if absent,
        ``model_hash_mismatch`` if they do not match). Engines load from these bytes, never from
        the path, so what runs is what was checked."""
        path = self.path(model_hash)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise ModelError("model_unknown", f"no model {model_hash} in {self.root}") from None
        actual = sha256_hex(data)
        if actual != model_hash:
            raise ModelError(
                "model_hash_mismatch", f"{path} hashes to {actual}, not {model_hash}"
            )
        st = path.stat()
        with self._lock:
            self._verified[model_hash] = _Verified(st.st_size, st.st_mtime_ns, st.st_ino)
        return data

    def verify_all(self) -> dict[str, bool]:
        """Re-hash every model; hash -> whether it matches its name."""
        return {h: file_sha256(self.path(h)) == h for h in self.hashes()}

    # -- import ----------------------------------------------------------------------------------
    def add(self, source: Path, manifest_fields: dict[str, Any]) -> ModelManifest:
        """Copy ``source`` into the store under its hash with a manifest built from
        ``manifest_fields`` (hash and size are filled in). Idempotent."""
        self._dir.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(dir=self._dir, prefix=".import-")
        tmp = Path(tmp_name)
        try:
            h = hashlib.sha256()
            size = 0
            with source.open("rb") as src, os.fdopen(fd, "wb") as dst:
                while block := src.read(_BUF):
                    h.update(block)
                    size += len(block)
                    dst.write(block)
                dst.flush()
                os.fsync(dst.fileno())
            model_hash = hash_from_hex(h.hexdigest())
            manifest = ModelManifest.model_validate(
                {**manifest_fields, "hash": model_hash, "size": size}
            )
            final = self.path(model_hash)
            if final.exists() and file_sha256(final) == model_hash:
                tmp.unlink()
            else:
                if final.exists():
                    final.chmod(0o644)
                os.chmod(tmp, 0o444)
                os.replace(tmp, final)
            mtmp = final.with_suffix(".json.tmp")
            mtmp.write_text(json.dumps(manifest.model_dump(mode="json"), indent=2) + "\n")
            os.replace(mtmp, final.with_suffix(".json"))
            return manifest
        finally:
            if tmp.exists():
                tmp.unlink()

    def import_path(self, path: Path, *, name: str | None = None) -> ModelManifest:
        """Import a ``.onnx`` file with the generic ``onnx-tensors`` interface."""
        inputs, outputs = _onnx_signature(path)
        return self.add(
            path,
            {
                "name": name or path.stem,
                "engine": "onnxruntime",
                "interface": "onnx-tensors",
                "preprocessing_version": "onnx-tensors/1",
                "inputs": inputs,
                "outputs": outputs,
                "params": {
                    "outputs": ParamDoc(
                        default=None, doc="output names to return (null: all)"
                    ).model_dump(),
                },
                "source": str(path.resolve()),
            },
        )

    def import_package(self, package: str) -> ModelManifest:
        """Import a model shipped in an installed wheel: ``magika`` or ``silero-vad``."""
        if package == "magika":
            return self._import_magika()
        if package in ("silero-vad", "silero_vad"):
            return self._import_silero()
        raise ValueError(f"unknown model package {package!r} (known: magika, silero-vad)")

    def _import_magika(self) -> ModelManifest:
        model = locate_package_model("magika", "models/standard_v3_3/model.onnx")
        kb_path = model.parent.parent.parent / "config" / "content_types_kb.min.json"
        version = importlib.metadata.version("magika")
        return self._add_magika(
            model, json.loads((model.parent / "config.min.json").read_text()),
            json.loads(kb_path.read_text()), name="standard_v3_3",
            source=f"magika=={version}:magika/models/standard_v3_3/model.onnx")

    def import_magika_wheel(self, wheel: Path) -> ModelManifest:
        """Import the magika model shipped in a magika wheel file (``magika-<v>-*.whl`` from
        PyPI, downloaded with ``pip download --no-deps``), without installing it: another
        version's model beside the installed one (for example ``standard_v3_2`` of magika 0.6.1
        beside ``standard_v3_3``), to shadow or switch to. Its config must be the v3 format
        (``config.min.json``)."""
        import zipfile

        try:
            zf = zipfile.ZipFile(wheel)
        except (zipfile.BadZipFile, OSError) as exc:
            raise ValueError(f"{wheel} is not a wheel: {exc}") from exc
        with zf:
            names = zf.namelist()
            models = sorted({n.split("/")[2] for n in names
                             if n.startswith("magika/models/") and n.endswith("/model.onnx")})
            if len(models) != 1:
                raise ValueError(f"{wheel}: expected one magika/models/<name>/model.onnx, found "
                                 f"{models or 'none'}")
            name = models[0]
            cfg_name = f"magika/models/{name}/config.min.json"
            kb_name = "magika/config/content_types_kb.min.json"
            if cfg_name not in names or kb_name not in names:
                raise ValueError(f"{wheel}: {name} has no config.min.json (not a v3 magika "
                                 "model) or the wheel has no content-types KB")
            version = next((n.split("-")[1] for n in [wheel.name] if n.count("-") >= 2), "?")
            with tempfile.TemporaryDirectory() as tmp:
                onnx_path = Path(tmp) / "model.onnx"
                onnx_path.write_bytes(zf.read(f"magika/models/{name}/model.onnx"))
                return self._add_magika(
                    onnx_path, json.loads(zf.read(cfg_name)), json.loads(zf.read(kb_name)),
                    name=name, source=f"magika=={version} (wheel {wheel.name}):"
                    f"magika/models/{name}/model.onnx")

    def _add_magika(self, model: Path, config: dict[str, Any], kb: dict[str, Any], *, name: str,
                    source: str) -> ModelManifest:
        labels: list[str] = list(config["target_labels_space"])
        # Text-ness of every label the output can take (model labels and overwrite targets).
        candidates = set(labels) | set(config["overwrite_map"].values()) | {"txt", "unknown"}
        text_labels = sorted(c for c in candidates if kb.get(c, {}).get("is_text", False))
        inputs, outputs = _onnx_signature(model)
        return self.add(
            model,
            {
                "name": f"magika-{name}",
                "engine": "onnxruntime",
                "interface": "magika",
                "preprocessing_version": "magika-features-v2",
                "inputs": inputs,
                "outputs": outputs,
                "params": {
                    "prediction_mode": ParamDoc(
                        default="high-confidence",
                        doc="high-confidence | medium-confidence | best-guess: when the top "
                        "label's score is below the mode's threshold the label becomes txt or "
                        "unknown",
                    ).model_dump(),
                    "top_k": ParamDoc(
                        default=3, doc=f"how many (label, score) pairs to return, "
                        f"0..{len(labels)}"
                    ).model_dump(),
                },
                "config": {
                    "labels": labels,
                    "text_labels": text_labels,
                    **{
                        k: config[k]
                        for k in (
                            "beg_size",
                            "mid_size",
                            "end_size",
                            "block_size",
                            "padding_token",
                            "min_file_size_for_dl",
                            "medium_confidence_threshold",
                            "thresholds",
                            "overwrite_map",
                        )
                    },
                },
                "source": source,
            },
        )

    def _import_silero(self) -> ModelManifest:
        model = locate_package_model("silero_vad", "data/silero_vad.onnx")
        inputs, outputs = _onnx_signature(model)
        version = importlib.metadata.version("silero-vad")
        return self.add(
            model,
            {
                "name": "silero-vad",
                "engine": "onnxruntime",
                "interface": "silero-vad",
                "preprocessing_version": "silero-vad-chunks/1",
                "inputs": inputs,
                "outputs": outputs,
                "params": {
                    "sample_rate": ParamDoc(
                        default=16000, doc="16000 or 8000 Hz (ignored for WAV input: its header "
                        "says); chunks of 512 (256 at 8 kHz) samples"
                    ).model_dump(),
                    "threshold": ParamDoc(
                        default=0.5, doc="a chunk whose probability is >= this counts as speech"
                    ).model_dump(),
                    "encoding": ParamDoc(
                        default="auto",
                        doc="auto (WAV if the input starts with RIFF, else raw) | wav | pcm_s16le",
                    ).model_dump(),
                },
                "config": {"context_16k": 64, "context_8k": 32, "chunk_16k": 512,
                           "chunk_8k": 256, "state_shape": [2, 1, 128]},
                "source": f"silero-vad=={version}:silero_vad/data/silero_vad.onnx",
            },
        )


def locate_package_model(package: str, relative: str) -> Path:
    """The path of a file inside an installed package, without importing the package."""
    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        raise FileNotFoundError(f"package {package!r} is not installed")
    path = Path(spec.origin).parent / relative
    if not path.is_file():
        raise FileNotFoundError(f"{package} has no {relative} (looked at {path})")
    return path


def _onnx_signature(path: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    sess = ort.InferenceSession(str(path), sess_options=opts, providers=["CPUExecutionProvider"])

    def spec(arg: Any) -> dict[str, Any]:
        dtype = str(arg.type).removeprefix("tensor(").removesuffix(")")
        return {"name": arg.name, "dtype": dtype, "shape": list(arg.shape)}

    return [spec(a) for a in sess.get_inputs()], [spec(a) for a in sess.get_outputs()]

