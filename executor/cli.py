"""``fx executor run``, ``fx models import|list|verify``, ``fx chunk put|get``, ``fx ledger``
and the integer engine's commands from :mod:`executor.integer_cli` (``fx models import-int``,
``fx eval fidelity``, ``fx verify``)."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

from executor.config import load_config
from fx_node.settings import ConfigError, default_data_dir

__all__ = ["register"]

log = logging.getLogger(__name__)


def _store_dir(args: argparse.Namespace) -> Path:
    if args.store:
        return Path(args.store)
    try:
        return load_config(args.config).model_dir
    except ConfigError:
        return default_data_dir() / "models"


def _run(args: argparse.Namespace) -> int:
    from executor import affinity, processes

    command = "fx executor run"
    overrides: dict[str, Any] = {}
    if args.onnx_provider:
        overrides["onnx_provider"] = args.onnx_provider
    if args.no_route_by_model:
        overrides["route_by_model"] = False
    if args.speculative_reads is not None:
        overrides["speculative_reads"] = args.speculative_reads
    try:
        if args.processes is not None:  # checked here: one line for a bad N
            overrides["processes"] = (
                "auto" if args.processes == "auto"
                else processes.resolve_processes(args.processes, processes.cores()))
        config = load_config(args.config, **overrides)
        cpus = affinity.cpus_problem(config.engine_cpus, config.loop_cpus,
                                     affinity.allowed_cpus(),
                                     supported=affinity.pinning_supported())
        if cpus is not None:
            raise ConfigError(cpus)
        n = processes.resolve_processes(config.processes, processes.cores())
        children = processes.describe(config, n) if n > 1 else {}
    except (ConfigError, processes.ProcessesError) as exc:
        print(f"{command}: {exc}", file=sys.stderr)
        return 2
    if args.print_config:
        print(config)
        for child_id, where in children.items():
            print(f"# process {child_id}: key_file = {json.dumps(where['key_file'])}, "
                  f"http_port = {json.dumps(where['http_port'])}, "
                  f"engine_cpus = {json.dumps(where['engine_cpus'])}")
        return 0
    if n > 1:
        return processes.run_processes(command, config, n,
                                       verbose=bool(getattr(args, "verbose", False)))
    from executor.service import ExecutorService
    from fx_node.service import run_node

    processes.name_log_lines()  # a child of --processes N: its lines say which
    return run_node(command, config, lambda: ExecutorService(config))


def _import(args: argparse.Namespace) -> int:
    from executor.models import ModelStore

    store = ModelStore(_store_dir(args))
    target = args.source
    path = Path(target)
    if path.is_file() and path.name.startswith("magika-") and path.suffix == ".whl":
        try:
            manifest = store.import_magika_wheel(path)
        except (ValueError, KeyError) as exc:
            print(f"fx models import: {exc}", file=sys.stderr)
            return 2
    elif path.is_file():
        manifest = store.import_path(path, name=args.name)
    else:
        try:
            manifest = store.import_package(target)
        except (ValueError, FileNotFoundError) as exc:
            print(f"fx models import: {exc}", file=sys.stderr)
            return 2
    print(f"{manifest.hash}  {manifest.name}  ({manifest.interface}, {manifest.size} bytes)")
    return 0


def _list(args: argparse.Namespace) -> int:
    from executor.models import ModelStore
    from fx_node.errors import ModelError

    if args.registry:  # the names on sys.models, not the files of a store
        from fx_kafka.client import bootstrap_of
        from fx_kafka.model_registry import print_registry

        return print_registry(bootstrap_of(args.bootstrap), args.json, args.fleet_key)

    store = ModelStore(_store_dir(args))
    rows: list[dict[str, Any]] = []
    bad = 0
    for model_hash in store.hashes():
        try:
            m = store.manifest(model_hash)
        except ModelError as exc:  # a damaged manifest: say so, list the rest
            print(f"error: {exc.message}", file=sys.stderr)
            bad += 1
            continue
        row = {"hash": m.hash, "name": m.name, "engine": m.engine,
               "interface": m.interface, "size": m.size, "source": m.source}
        gguf = (m.config or {}).get("gguf") if isinstance(m.config, dict) else None
        if isinstance(gguf, dict):
            for key, out in (("general.architecture", "arch"), ("general.license", "license"),
                             ("notice", "notice")):
                if gguf.get(key):
                    row[out] = str(gguf[key])
        rows.append(row)
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        for r in rows:
            arch = f"  [{r['arch']}]" if "arch" in r else ""
            print(f"{r['hash']}  {r['name']:<24} {r['engine']}/{r['interface']}  {r['size']} B"
                  f"{arch}")
            if "notice" in r:  # the model's terms require it to travel with the model
                print(f"    notice: {r['notice']}")
    return 1 if bad else 0


def _verify(args: argparse.Namespace) -> int:
    from executor.models import ModelStore

    store = ModelStore(_store_dir(args))
    bad = 0
    for model_hash, ok in store.verify_all().items():
        print(f"{'ok  ' if ok else 'BAD '} {model_hash}")
        bad += not ok
    return 1 if bad else 0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``fx executor`` and ``fx models`` (and the integer engine's commands if present)."""
    ex = subparsers.add_parser("executor", help="the mode B executor service")
    ex_sub = ex.add_subparsers(dest="executor_cmd", required=True)
    run = ex_sub.add_parser(
        "run", help="run an executor node (config from FILE, then FX_EXECUTOR_* variables)"
    )
    run.add_argument("--config", help="TOML or JSON config file")
    run.add_argument("--print-config", action="store_true", help="print the config and exit")
    run.add_argument("--onnx-provider", choices=("auto", "cuda", "cpu"),
                     help="ONNX Runtime execution provider (overrides the config's "
                          "onnx_provider; cuda falls back to cpu, with the reason logged)")
    run.add_argument("--processes", metavar="N|auto",
                     help="executor processes on this machine (overrides the config's "
                          "processes; default auto: one per core): 1 serves in this process, "
                          "N > 1 runs N child processes, node <node_id>-p<i> each "
                          "(docs/executor.md, \"Several processes\")")
    run.add_argument("--no-route-by-model", action="store_true",
                     help="assign workloads round robin instead of by model (overrides the "
                          "config's route_by_model; docs/operations.md, Routing by model)")
    run.add_argument("--speculative-reads", action=argparse.BooleanOptionalAction,
                     default=None,
                     help="prepare inference requests while their transaction is open, "
                          "answer them once it commits (overrides the config's "
                          "speculative_reads; docs/executor.md, \"Speculative reads\")")
    run.set_defaults(func=_run)

    models = subparsers.add_parser("models", help="the content-addressed model store")
    models_sub = models.add_subparsers(dest="models_cmd", required=True)

    def store_args(p: argparse.ArgumentParser) -> None:
        p.add_argument("--store", help="model store directory (default: the config's model_dir)")
        p.add_argument("--config", help="executor config file (for model_dir)")

    imp = models_sub.add_parser(
        "import", help="copy a model into the store: an .onnx PATH, or PACKAGE (magika, silero-vad)"
    )
    imp.add_argument("source", metavar="PATH|PACKAGE")
    imp.add_argument("--name", help="name recorded in the manifest (files only)")
    store_args(imp)
    imp.set_defaults(func=_import)
    lst = models_sub.add_parser("list", help="list stored models")
    lst.add_argument("--json", action="store_true")
    lst.add_argument("--registry", action="store_true",
                     help="list the registered names (sys.models: NAME@VERSION, aliases, hash, "
                     "licence, who registered it) instead of a store's files")
    lst.add_argument("--bootstrap", help="HOST:PORT for --registry (default: "
                     "$FX_KAFKA_BOOTSTRAP)")
    lst.add_argument("--fleet-key", action="append", metavar="PUB",
                     help="with --registry: count only records signed by this fleet key "
                     "(repeatable; default $FX_FLEET_PUBLIC_KEY)")
    store_args(lst)
    lst.set_defaults(func=_list)
    from fx_kafka.model_registry import add_registry_commands

    add_registry_commands(models_sub)
    ver = models_sub.add_parser("verify", help="re-hash every stored model (exit 1 if any fails)")
    store_args(ver)
    ver.set_defaults(func=_verify)

    from executor import integer_cli
    from executor.chunk_cli import add_chunk
    from executor.ledger_cli import add_ledger

    add_chunk(subparsers)
    add_ledger(subparsers)
    integer_cli.add_models_import_int(models_sub)
    # ``fx eval fidelity`` (as documented), and ``fx fidelity``, the name it had first
    eval_sub = subparsers.add_parser(
        "eval", help="evaluations of the integer engine (fx eval fidelity)"
    ).add_subparsers(dest="eval_cmd", required=True, metavar="{fidelity}")
    integer_cli.add_eval(eval_sub)
    integer_cli.add_eval(subparsers)
    integer_cli.add_verify(subparsers)
