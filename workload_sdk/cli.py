"""``fx workload``, ``fx replay``, ``fx why``, ``fx trim`` and ``fx audit``.

Exit codes: 0 done; 1 ``replay --diff`` found a difference; 2 the step broke a rule
(:class:`WorkloadError`); 3 a record replay needs is trimmed, missing or undecodable (``LogGap``),
or a holder was fenced; 4 no spec / module mismatch, the fold disagrees with the merge log, or a
workload topic's configuration is refused (``TopicConfigError``: producer-clock timestamps, or
retention shorter than the audit horizon), ``--http-port`` cannot be bound, or a ``--fleet-key``
is not a key; 5 ``fx replay`` stopped at a redacted input (``Redacted``: ``fx redact`` destroyed
its chunk's data key; the message says who redacted it and why). ``fx why`` walks a redacted
input (hashes verify) and marks it ``REDACTED``.

``fx audit``: 0 every invariant checked holds (a skipped replay is said, not failed); 1 an
invariant is violated; 2 a usage or read error (a bad ``--module`` or ``--fleet-key``, a broker
that cannot be read); 3 no violation, but a record a check needs is trimmed, missing or
undecodable (as for ``fx replay``). A replay stopped by a redacted input is a note, not a gap:
the audit holds on everything else.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import socket
import sys
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any

from broker_schema import ChunkRef, InputPolicy, SpecRecord, StreamRef, encode, topics
from fx_kafka.cli_errors import run_command
from fx_kafka.client import make_producer
from fx_kafka.errors import TopicConfigError
from fx_kafka.logs import quiet_client_logs
from fx_kafka.workload import HORIZON_UNKNOWN, HorizonArg, ensure_workload_topics
from fx_kafka.workload_log import LogGap, Redacted, RefGap, WorkloadLog
from fx_kafka.workloads import needs_workload
from workload_sdk._api import Workload, WorkloadError, module_hash
from workload_sdk._code import Code, ModuleUnavailable
from workload_sdk._election import ElectionConfig, HolderElection
from workload_sdk._holder import Fenced, HolderConfig, LeaseHolder, NoSpec
from workload_sdk._kafka_io import default_unsigned_policy, read_workload_log
from workload_sdk._loader import load_workload
from workload_sdk._local import LocalModelUnavailable
from workload_sdk._observe import DEFAULT_GROUP_PREFIXES
from workload_sdk._replay import ReplayError, compare_outputs, diff, replay
from workload_sdk._skip_cli import register as register_skip
from workload_sdk._trim import NEVER_TRIMMED, TrimPlan
from workload_sdk._trim_io import trim_workload
from workload_sdk._why import render_tree, why

if TYPE_CHECKING:
    from workload_sdk._holder_http import HolderServer

EXIT_DIFF = 1
EXIT_WORKLOAD = 2
EXIT_GAP = 3
EXIT_FENCED = 3
EXIT_MISMATCH = 4
#: replay stopped at an input whose chunk was redacted (``fx redact``: :class:`Redacted`)
EXIT_REDACTED = 5


def _bootstrap(args: argparse.Namespace) -> str:
    value = args.bootstrap or os.environ.get("FX_KAFKA_BOOTSTRAP")
    if not value:
        raise SystemExit("no broker: pass --bootstrap HOST:PORT or set FX_KAFKA_BOOTSTRAP")
    return str(value)


def _print_json(value: Any) -> None:
    print(json.dumps(value, indent=2, sort_keys=True, default=str))


# ------------------------------------------------------------------------------- fx workload


def _model_dir(args: argparse.Namespace) -> None:
    """``--model-dir``: where mode A models are loaded from (else ``$FX_MODEL_DIR``)."""
    if getattr(args, "model_dir", None):
        from workload_sdk._local import set_default_model_dir

        set_default_model_dir(args.model_dir)


def _run(args: argparse.Namespace) -> int:
    from fx_kafka.keys import fleet_public_keys

    _model_dir(args)
    fleet: list[bytes] = []
    if not args.no_signature_check:
        try:
            fleet = fleet_public_keys(args.fleet_key)
        except ValueError as exc:
            print(f"cannot run: --fleet-key: {exc}", file=sys.stderr)
            return EXIT_MISMATCH
    workload = load_workload(args.module)
    holder_id = args.holder_id or f"{socket.gethostname()}-{os.getpid()}"
    config = HolderConfig(bootstrap=_bootstrap(args), workload_id=args.id, holder_id=holder_id,
                          check_module=not args.no_module_check, trim_every_s=args.trim_every,
                          chunk_dir=args.chunk_dir, ref_wait_s=args.ref_wait,
                          force_placement=args.force, placement_wait_s=args.placement_wait_s,
                          facts_max_age_s=args.facts_max_age_s,
                          executor_group_prefixes=tuple(args.executor_group_prefix
                                                        or DEFAULT_GROUP_PREFIXES),
                          check_signatures=not args.no_signature_check,
                          fleet_keys=tuple(fleet), sign_requests=not args.no_sign_requests)

    async def main() -> int:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        metrics = None
        if args.http_port is not None:
            from workload_sdk._holder_metrics import HolderMetrics

            metrics = HolderMetrics()
        runner: LeaseHolder | HolderElection
        if args.no_elect:
            runner = LeaseHolder(workload, config, metrics)
        else:
            election = ElectionConfig(session_timeout_ms=args.session_timeout_ms)
            runner = HolderElection(workload, config, election, metrics)
        tasks: list[asyncio.Task[None]] = []
        server = None
        if metrics is not None:
            # bound before anything starts: a port in use ends the process, nothing claimed
            server = _serve_http(args.http_host, args.http_port,
                                 lambda: bool(tasks) and not tasks[0].done(), runner, metrics)
            if server is None:
                return EXIT_MISMATCH
        task = asyncio.create_task(runner.run(stop))
        tasks.append(task)
        try:
            await task
        except Fenced as exc:
            print(f"fenced: {exc}", file=sys.stderr, flush=True)
            return EXIT_FENCED
        except WorkloadError as exc:
            print(f"workload error: {exc}", file=sys.stderr, flush=True)
            return EXIT_WORKLOAD
        except (NoSpec, TopicConfigError) as exc:
            print(f"cannot run: {exc}", file=sys.stderr, flush=True)
            return EXIT_MISMATCH
        except ReplayError as exc:
            print(f"cannot resume: replay disagrees with the log: {exc}", file=sys.stderr,
                  flush=True)
            return EXIT_MISMATCH
        except RefGap as exc:
            print(f"stopped: {exc}", file=sys.stderr, flush=True)
            return EXIT_GAP
        except LogGap as exc:
            print(f"cannot resume: {exc}", file=sys.stderr, flush=True)
            return EXIT_GAP
        except LocalModelUnavailable as exc:
            print(f"cannot run the step: {exc}", file=sys.stderr, flush=True)
            return EXIT_MISMATCH
        finally:
            if server is not None and server.serving is not None:
                server.server.should_exit = True
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(server.serving, timeout=5.0)
        return 0

    return asyncio.run(main())


def _serve_http(host: str, port: int, live: Callable[[], bool],
                runner: LeaseHolder | HolderElection, metrics: Any) -> HolderServer | None:
    """Serve ``/healthz``, ``/readyz`` and ``/metrics`` in the running event loop; the server,
    or None (said on stderr) when it cannot bind ``host:port``."""
    from workload_sdk._holder_http import HolderServer, create_app

    app = create_app(live=live, status=runner.status, metrics=metrics.render)
    server = HolderServer(app, host, port)
    try:
        server.bind()
    except OSError as exc:
        print(f"cannot run: cannot serve HTTP on {host}:{port}: {exc}", file=sys.stderr,
              flush=True)
        return None
    server.serving = asyncio.create_task(server.serve())
    print(f"serving /metrics, /healthz, /readyz on http://{host}:{server.port}",
          file=sys.stderr, flush=True)
    return server


def _spec(args: argparse.Namespace) -> int:
    models = {}
    for item in args.model or []:
        name, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--model takes NAME=sha256:HEX, got {item!r}")
        models[name] = value
    local = {}
    for item in args.local_model or []:
        name, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--local-model takes NAME=sha256:HEX, got {item!r}")
        local[name] = value
    guarantees = {}
    for item in args.guarantee or []:
        kind, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--guarantee takes KIND=GUARANTEE, got {item!r}")
        guarantees[kind] = value
    signers: dict[str, tuple[str, ...]] = {}
    for item in args.signer or []:
        node, sep, key = item.partition("=")
        if not sep or not node:
            raise SystemExit(f"--signer takes NODE=PUBLIC_KEY, got {item!r}")
        signers[node] = (*signers.get(node, ()), key)
    from broker_schema.registry import RegistryError
    from fx_kafka.model_registry import resolve_refs
    from workload_sdk._model_check import ModelCheckError, check_spec_models

    try:  # NAME@VERSION / NAME@ALIAS resolved now, once; the record keeps hash and name
        models, names = asyncio.run(resolve_refs(_bootstrap(args), models))
        local, local_names = asyncio.run(resolve_refs(_bootstrap(args), local))
    except RegistryError as exc:
        print(f"fx workload spec: --model: {exc}", file=sys.stderr, flush=True)
        return EXIT_WORKLOAD
    try:
        unchecked = asyncio.run(check_spec_models(
            _bootstrap(args), {"--model": models, "--local-model": local}, force=args.force,
            model_dir=args.model_dir or os.environ.get("FX_MODEL_DIR")))
    except ModelCheckError as exc:
        print(f"fx workload spec: {exc}", file=sys.stderr, flush=True)
        return EXIT_WORKLOAD
    workload = load_workload(args.module)
    spec = SpecRecord(
        workload_id=args.id,
        unchecked_models=tuple(unchecked),
        module_hash=module_hash(workload),
        unsigned=args.unsigned or default_unsigned_policy(),
        signers=signers,
        effect_kinds=tuple(args.kind or ()),
        models=models,
        guarantees=guarantees,  # validated by the record
        outstanding_limit=args.outstanding_limit,
        deadline_default_ms=args.deadline_ms,
        executor_lease_ms=args.executor_lease_ms,
        snapshot_every=args.snapshot_every,
        audit_horizon_ms=args.audit_horizon_ms,
        local_models=local,
        local_max_tokens_per_step=args.local_max_tokens,
        input_policy=InputPolicy(wait_ms=args.input_wait_ms, then=args.on_unresolvable,
                                 on_step_error=args.on_step_error),
        chunk_store=args.chunk_store,
        model_names={**names, **local_names},
        redactable_inputs=args.redactable_inputs,
    )
    try:
        offset = asyncio.run(_produce(_bootstrap(args), args.id, topics.spec(args.id),
                                      encode(spec), audit_horizon_ms=spec.audit_horizon_ms))
    except TopicConfigError as exc:
        print(f"spec not written: {exc}", file=sys.stderr, flush=True)
        return EXIT_MISMATCH
    _store_code(_bootstrap(args), workload)
    named = "".join(f"; {b} = {spec.model_names[h].text()} = {h}"
                    for b, h in sorted({**spec.models, **spec.local_models}.items())
                    if h in spec.model_names)
    print(f"spec written to {topics.spec(args.id)}@{offset}{named}")
    return 0


def _reference(text: str) -> ChunkRef | StreamRef:
    """A chunk or stream reference from JSON (what ``fx chunk put`` prints); ``ValueError`` with
    one line otherwise."""
    from pydantic import TypeAdapter, ValidationError

    from fx_kafka.cli_errors import one_line

    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"not JSON: {exc}") from None
    if not isinstance(data, dict) or data.get("type") not in ("chunk", "stream"):
        raise ValueError('a reference is a JSON object with "type": "chunk" (as fx chunk put '
                         'prints it) or "stream"')
    try:
        ref: ChunkRef | StreamRef = TypeAdapter(ChunkRef | StreamRef).validate_python(data)
    except ValidationError as exc:
        raise ValueError(one_line(exc)) from None
    return ref


class _ChunkNotStored(Exception):
    """The chunk store refused the write (a directory that cannot be written, a principal
    without WRITE on ``sys.chunks``)."""


#: What ``fx workload input --inline`` says to do about an input over the inline limit.
CLI_REMEDY = "drop --inline to store it as a chunk of the workload and write its reference"


def _store_code(bootstrap: str, workload: Workload) -> None:
    """Keep the spec's module in the module store (``sys.modules``), so a later holder, replay or
    audit can run the steps it runs after the workload's code changed (``fx workload
    deploy``). Code without a UTF-8 source file is said, not stored."""
    from aiokafka.errors import KafkaError

    from workload_sdk._module_store import module_record, store_module

    try:
        asyncio.run(store_module(bootstrap, module_record(workload)))
    except (ValueError, KafkaError, OSError) as exc:
        print(f"module not stored in {topics.MODULES}: {exc!r} (fx workload deploy stores it "
              "later)", file=sys.stderr, flush=True)


def _code(bootstrap: str, workload: Workload | None) -> Code:
    """The code each step ran: the module store, and ``workload`` (``--module``, if given),
    which also stands in for a module the store lacks (said by :func:`_stood_in`)."""
    from workload_sdk._module_store import read_modules

    return Code(workload, asyncio.run(read_modules(bootstrap)), fallback=True)


def _stood_in(code: Code) -> str | None:
    """What to say when ``--module`` ran steps whose own code is not in the module store."""
    if not code.stood_in:
        return None
    return (f"note: module {', '.join(sorted(code.stood_in))} is not in the module store "
            f"{topics.MODULES}: its steps ran --module ({code.given_hash}) instead")


def _input(args: argparse.Namespace) -> int:
    from aiokafka.errors import TopicAuthorizationFailedError

    from workload_sdk._input_writer import InputTooLarge, InputWriter

    value: Any
    if args.json is not None:
        try:
            value = json.loads(args.json)
        except ValueError as exc:
            print(f"fx workload input: --json is not JSON: {exc}", file=sys.stderr, flush=True)
            return EXIT_WORKLOAD
    elif args.text is not None:
        value = args.text
    elif args.ref is not None:
        try:
            value = _reference(args.ref)
        except ValueError as exc:
            print(f"fx workload input: --ref: {exc}", file=sys.stderr, flush=True)
            return EXIT_WORKLOAD
    else:
        with open(args.file, "rb") as fh:
            value = fh.read()
    bootstrap = _bootstrap(args)

    async def main() -> Any:
        async with InputWriter(bootstrap, args.id, chunk_dir=args.chunk_dir,
                               chunk=not args.inline, remedy=CLI_REMEDY) as writer:
            try:
                return await writer.write(value, media_type=args.media_type, source=args.source)
            except (TopicAuthorizationFailedError, OSError) as exc:
                raise _ChunkNotStored(f"cannot store the chunk in {writer.where}: {exc}"
                                      ) from None

    try:
        written = asyncio.run(main())
    except InputTooLarge as exc:
        print(f"fx workload input: {exc}", file=sys.stderr, flush=True)
        return EXIT_WORKLOAD
    except _ChunkNotStored as exc:
        print(f"fx workload input: input not written: {exc}", file=sys.stderr, flush=True)
        return EXIT_MISMATCH
    print(f"input written to {written.topic}@{written.offset}")
    if written.chunked:
        ref = written.body
        print(f"  as a chunk reference: {ref.hash} ({ref.size} B) stored in "
              f"{written.chunk_store}")
    return 0


async def _produce(bootstrap: str, workload_id: str, topic: str, value: bytes, *,
                   audit_horizon_ms: HorizonArg = HORIZON_UNKNOWN) -> int:
    await ensure_workload_topics(bootstrap, workload_id, audit_horizon_ms=audit_horizon_ms)
    producer = make_producer(bootstrap)
    await producer.start()
    try:
        meta = await producer.send_and_wait(topic, value=value, partition=0)
        return int(meta.offset)
    finally:
        await producer.stop()


# --------------------------------------------------------------------------------- fx replay


def _replay(args: argparse.Namespace) -> int:
    _model_dir(args)
    if args.diff and not args.module:
        raise SystemExit("replay --diff needs --module MODULE:Class (the new code)")
    if args.from_step is not None and not args.diff:
        raise SystemExit("--from-step is for --diff (the step the new code runs from)")
    workload = load_workload(args.module) if args.module else None
    try:
        code = _code(_bootstrap(args), None if args.diff else workload)
        log = asyncio.run(read_workload_log(_bootstrap(args), args.id, with_facts=False,
                                            chunk_dir=args.chunk_dir))
    except LogGap as exc:
        print(f"replay stopped: {exc}", file=sys.stderr)
        return EXIT_GAP
    if args.diff:
        assert workload is not None
        try:
            report = diff(workload, log, code=code, from_step=args.from_step or 0)
        except LogGap as exc:
            print(f"diff stopped: {exc}", file=sys.stderr)
            return EXIT_GAP
        except ModuleUnavailable as exc:
            print(f"diff cannot run the recorded code: {exc}", file=sys.stderr)
            return EXIT_MISMATCH
        if args.json:
            _print_json(report.as_dict())
        else:
            print(f"diff over {report.steps} steps: {report.kind}")
            if report.detail:
                print(report.detail)
            if report.first is not None:
                print(f"first difference: seq {report.first['seq']} index "
                      f"{report.first['index']} (.out@{report.first['out_offset']})")
                print(f"  recorded: {report.first['recorded']}")
                print(f"  new:      {report.first['new']}")
            if report.kind == "output_differs":
                print(f"{report.count} outputs differ")
        return 0 if report.kind == "same" else EXIT_DIFF
    try:
        result = replay(workload, log, to_seq=args.to, use_snapshots=not args.from_start,
                        trust_log=args.trust_log, code=code)
        problems = compare_outputs(result, log)
    except Redacted as exc:
        print(f"replay stopped: {exc}", file=sys.stderr)
        return EXIT_REDACTED
    except LogGap as exc:
        print(f"replay stopped: {exc}", file=sys.stderr)
        return EXIT_GAP
    except ModuleUnavailable as exc:
        print(f"replay cannot run the recorded code: {exc}", file=sys.stderr)
        return EXIT_MISMATCH
    except ReplayError as exc:
        print(f"replay disagrees with the merge log: {exc}", file=sys.stderr)
        return EXIT_MISMATCH
    except WorkloadError as exc:
        print(f"workload error during replay: {exc}", file=sys.stderr)
        return EXIT_WORKLOAD
    except LocalModelUnavailable as exc:
        print(f"replay cannot run the step: {exc}", file=sys.stderr)
        return EXIT_MISMATCH
    core = result.core
    if (said := _stood_in(code)) is not None:
        print(said, file=sys.stderr)
    summary = {
        "workload_id": args.id,
        "seq": core.seq,
        "last_step": core.seq - 1,
        "state": core.state,
        "state_hash": core.state_hash,
        "pending": sorted(core.pending),
        "snapshot": None if result.snapshot_seq is None else {
            "merge_offset": result.snapshot_offset, "seq": result.snapshot_seq},
        "entries_replayed": result.entries,
        "steps_replayed": result.steps,
        "trust_log": args.trust_log,
        "outputs_checked": len(result.outputs),
        "output_problems": problems,
    }
    if args.json:
        _print_json(summary)
    else:
        snap = summary["snapshot"]
        print(f"workload {args.id}: state after step {core.seq - 1} "
              f"(from {'snapshot seq ' + str(snap['seq']) if snap else 'the initial state'}, "
              f"{result.entries} merge entries replayed)")
        print(f"state_hash {core.state_hash}")
        print(json.dumps(core.state, indent=2, sort_keys=True))
        print(f"{len(result.outputs)} outputs recomputed, "
              f"{len(problems)} differ from .out" + (f": {problems}" if problems else ""))
    return EXIT_MISMATCH if problems else 0


# ------------------------------------------------------------------------------------ fx why


def _parse_time(text: str) -> int:
    if text.isdigit():
        return int(text)
    try:
        return int(datetime.fromisoformat(text).timestamp() * 1000)
    except ValueError:
        raise SystemExit(f"fx why: --at {text!r} is not a time: give ms since the epoch or "
                         "ISO 8601 (2026-12-03T17:30:00+00:00)") from None


def _why(args: argparse.Namespace) -> int:
    from fx_kafka.keys import fleet_public_keys, read_history

    try:
        fleet = fleet_public_keys(args.fleet_key)
    except ValueError as exc:
        print(f"fx why: --fleet-key: {exc}", file=sys.stderr)
        return 2
    try:
        log = asyncio.run(read_workload_log(_bootstrap(args), args.id))
        history = asyncio.run(read_history(_bootstrap(args), fleet)) if fleet else None
        tree = why(log, out_offset=args.output,
                   at_ms=None if args.at is None else _parse_time(args.at),
                   key_history=history)
    except LogGap as exc:
        print(f"why stopped: {exc}", file=sys.stderr)
        return EXIT_GAP
    if args.json:
        _print_json(tree)
    else:
        print(render_tree(tree))
    return 0


# ----------------------------------------------------------------------------------- fx trim


def _format_ms(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000).astimezone().isoformat(timespec="milliseconds")


def render_trim(plan: TrimPlan, *, dry_run: bool) -> str:
    """``fx trim``'s report: per topic, the old log start -> the new one, and why."""
    lines: list[str] = []
    horizon = ("forever" if plan.audit_horizon_ms is None else f"{plan.audit_horizon_ms} ms")
    head = f"workload {plan.workload_id}: audit horizon {horizon}"
    if plan.cutoff_ms is not None:
        head += f" (records appended before {_format_ms(plan.cutoff_ms)} are older)"
    lines.append(head)
    if plan.snapshot is not None:
        lines.append(f"trim snapshot: seq {plan.snapshot[1]} at .merge@{plan.snapshot[0]} "
                     "(replay and resume start there or later)")
    verb = "would delete" if dry_run else "deleted"
    for trim in plan.topics.values():
        new = plan.low_watermarks.get(trim.stream, trim.new_start)
        change = (f"{verb} {trim.deleted} offsets" if trim.new_start > trim.start
                  else "unchanged")
        lines.append(f"  {trim.topic}: start {trim.start} -> {new} (end {trim.end}; {change}; "
                     f"bound: {trim.bound})")
    for stream in NEVER_TRIMMED:
        lines.append(f"  {topics.stream(plan.workload_id, stream)}: never trimmed")
    if plan.note:
        lines.append(plan.note)
    if dry_run:
        lines.append("dry run: nothing was deleted")
    return "\n".join(lines)


def _trim(args: argparse.Namespace) -> int:
    plan = asyncio.run(trim_workload(_bootstrap(args), args.id, dry_run=args.dry_run))
    if args.json:
        _print_json(plan.as_dict())
    else:
        print(render_trim(plan, dry_run=args.dry_run))
    return 0


# ---------------------------------------------------------------------------------- fx audit

EXIT_AUDIT_VIOLATION = 1
EXIT_AUDIT_USAGE = 2
#: Reads of the log before ``fx audit`` gives up waiting for ``.merge`` to stop growing.
AUDIT_READS = 3


async def _read_audit_log(bootstrap: str, workload_id: str, *,
                          chunk_dir: str | None = None) -> tuple[WorkloadLog, bool]:
    """The committed log for an audit, read in the order that keeps it consistent with a live
    holder: ``.merge`` first (whatever an entry names was appended before it), then ``.out``,
    ``.in`` and ``.resp``, then ``.claims`` (every epoch used is claimed before), then ``.spec``
    (every spec a claim names is older). Read again (up to :data:`AUDIT_READS` times) while
    ``.merge`` grew during the read; returns the log and whether it was settled. What the
    referenced bodies replay needs name is read last (:func:`~workload_sdk._kafka_io.
    resolve_log`)."""
    from fx_kafka.workload_log import read_facts, read_topic
    from fx_kafka.workloads import require_workload
    from workload_sdk._kafka_io import resolve_log
    from workload_sdk._refs_io import RefResolver

    def topic(stream: str) -> str:
        return topics.stream(workload_id, stream)

    # a topic that does not exist would be waited for (the client's request timeout)
    await require_workload(bootstrap, workload_id)  # UnknownWorkload, a LookupError
    settled = False
    for _ in range(AUDIT_READS):
        log = WorkloadLog.empty(workload_id)
        log.views["merge"] = await read_topic(bootstrap, topic("merge"))
        log.views["out"] = await read_topic(bootstrap, topic("out"))
        log.views["in"], log.views["resp"] = await asyncio.gather(
            read_topic(bootstrap, topic("in")), read_topic(bootstrap, topic("resp")))
        log.views["claims"] = await read_topic(bootstrap, topic("claims"))
        log.views["spec"] = await read_topic(bootstrap, topic("spec"))
        tail = await read_topic(bootstrap, topic("merge"), start=log["merge"].end)
        if tail.end <= log["merge"].end:
            settled = True
            break
    log.facts = await read_facts(bootstrap)
    async with RefResolver(bootstrap, chunk_dir=chunk_dir) as resolver:
        await resolve_log(log, resolver)
    return log, settled


def _audit_code(bootstrap: str, workload: Workload | None, log: WorkloadLog) -> Code | None:
    """The code ``fx audit`` replays with: with ``--module``, it and the module store (each
    range of steps with the module its spec names); without, the module store alone when it
    holds every module a claimed spec runs (else None: replay is skipped, as before)."""
    from workload_sdk._module_store import read_modules

    try:
        code = Code(workload, asyncio.run(read_modules(bootstrap)), fallback=True)
    except (OSError, TimeoutError) as exc:
        print(f"fx audit: the module store cannot be read ({exc!r}): replaying with --module "
              "alone", file=sys.stderr)
        return None
    if workload is not None:
        return code
    try:
        named = [m for o in sorted({c.spec_offset for c in log.claims()})
                 if isinstance(s := log["spec"].get(o), SpecRecord) for m in s.module_hashes()]
    except LogGap:  # the audit reports it
        return None
    return code if named and all(code.has(m) for m in named) else None


def _audit(args: argparse.Namespace) -> int:
    from aiokafka.errors import KafkaError

    from fx_kafka.keys import fleet_public_keys, read_history
    from workload_sdk._audit import audit, render_report

    _model_dir(args)
    try:
        fleet = fleet_public_keys(args.fleet_key)
    except ValueError as exc:
        print(f"fx audit: --fleet-key: {exc}", file=sys.stderr)
        return EXIT_AUDIT_USAGE
    workload = None
    if args.module:
        try:
            workload = load_workload(args.module)
        except (ImportError, AttributeError, TypeError, ValueError, SyntaxError) as exc:
            print(f"fx audit: --module {args.module}: {type(exc).__name__}: {exc}",
                  file=sys.stderr)
            return EXIT_AUDIT_USAGE
    try:
        bootstrap = _bootstrap(args)
    except SystemExit as exc:  # no broker named: a usage error (exit 2), not a violation
        print(f"fx audit: {exc}", file=sys.stderr)
        return EXIT_AUDIT_USAGE
    try:
        log, settled = asyncio.run(_read_audit_log(bootstrap, args.id, chunk_dir=args.chunk_dir))
        history = asyncio.run(read_history(bootstrap, fleet)) if fleet else None
    except LookupError as exc:
        print(f"fx audit: {exc}", file=sys.stderr)
        return EXIT_AUDIT_USAGE
    except (KafkaError, TimeoutError, OSError) as exc:
        print(f"fx audit: cannot read the log of {args.id}: {exc!r}", file=sys.stderr)
        return EXIT_AUDIT_USAGE
    code = _audit_code(bootstrap, workload, log)
    report = audit(log, workload, key_history=history, clock_skew_ms=args.clock_skew_ms,
                   merge_settled=settled, code=code)
    if code is not None and (said := _stood_in(code)) is not None:
        report["replay"].note(said.removeprefix("note: "))
    if not settled:
        report.notes.append(f"{topics.stream(args.id, 'merge')} grew while it was read "
                            f"{AUDIT_READS} times (a live holder): outputs past the end of the "
                            "merge log as read were not judged")
    if args.json:
        _print_json(report.as_dict())
    else:
        print(render_report(report))
    return {"ok": 0, "violated": EXIT_AUDIT_VIOLATION, "gap": EXIT_GAP}[report.result]


# -------------------------------------------------------------------------------- register


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``fx workload``, ``fx replay``, ``fx why``, ``fx trim``, ``fx audit``,
    ``fx upgrade``, ``fx rollback``, ``fx shadow`` and ``fx log``."""
    from workload_sdk._bindings import register as register_bindings
    from workload_sdk._log_cli import register as register_log
    from workload_sdk._shadow_cli import register as register_shadow

    register_bindings(subparsers)
    register_shadow(subparsers)
    register_log(subparsers)
    def bootstrap_arg(p: argparse.ArgumentParser) -> None:
        p.add_argument("--bootstrap", help="HOST:PORT (default: $FX_KAFKA_BOOTSTRAP)")

    from workload_sdk._redact_cli import register as register_redact

    register_redact(subparsers, bootstrap_arg, _bootstrap)

    def chunk_dir_arg(p: argparse.ArgumentParser) -> None:
        p.add_argument("--chunk-dir", metavar="DIR",
                       help="read (and write) chunks in this filesystem store, shared with the "
                       "executors (their chunk_dir), instead of sys.chunks")

    wl = subparsers.add_parser("workload", help="run a workload's lease holder; write specs "
                               "and inputs")
    sub = wl.add_subparsers(dest="workload_cmd", required=True)
    run = sub.add_parser("run", help="hold the lease of a workload and run its fold")
    run.add_argument("module", help="MODULE:Class or file.py:Class")
    run.add_argument("--id", required=True, help="workload id")
    run.add_argument("--holder-id", help="this holder's id (default: host-pid)")
    run.add_argument("--no-module-check", action="store_true",
                     help="run even if the module does not hash to the spec's module_hash")
    run.add_argument("--no-elect", action="store_true",
                     help="claim the lease at once instead of taking part in the holder "
                     "election (fx-holder-elect.<id>): one process only, no stand-bys")
    run.add_argument("--session-timeout-ms", type=int, default=6000,
                     help="election: how long a dead holder keeps the lease before a stand-by "
                     "is elected (default 6000, the broker's minimum)")
    run.add_argument("--model-dir", metavar="DIR",
                     help="mode A: the model store the spec's local_models are loaded from "
                     "(default: $FX_MODEL_DIR)")
    run.add_argument("--trim-every", type=float, metavar="SECONDS",
                     help="also trim the log by the spec's audit horizon this often, as "
                     "`fx trim` does (default: never)")
    chunk_dir_arg(run)
    run.add_argument("--ref-wait", type=float, default=30.0, metavar="SECONDS",
                     help="how long a chunk or stream record an input or answer names is "
                     "waited for before the holder stops, naming it (default 30)")
    run.add_argument("--force", action="store_true",
                     help="claim even when no live node on sys.facts serves every kind and "
                     "model the spec binds (what was missing is recorded in the claim)")
    run.add_argument("--placement-wait-s", type=float, default=30.0, metavar="SECONDS",
                     help="how long to wait for nodes that serve what the spec binds before "
                     "giving up (exit 4; default 30; 0: do not wait)")
    run.add_argument("--facts-max-age-s", type=float, default=300.0, metavar="SECONDS",
                     help="facts older than this on sys.facts are not a live node (default 300)")
    run.add_argument("--http-port", type=int, metavar="PORT",
                     help="serve /metrics, /healthz and /readyz on this port (0: a free one, "
                     "printed at start; default: no HTTP, since several holders and stand-bys "
                     "often share a host: give each its own port)")
    run.add_argument("--http-host", default="127.0.0.1", metavar="ADDR",
                     help="the address to serve HTTP on (default 127.0.0.1; 0.0.0.0 for a "
                     "scraper on another host)")
    run.add_argument("--executor-group-prefix", action="append", metavar="PREFIX",
                     help="metrics: the consumer groups <PREFIX>.<kind> whose unread requests "
                     "on .out are reported (the executors' and gateways' group_prefix; "
                     "repeatable; default fx-executor and fx-actuator)")
    run.add_argument("--no-sign-requests", action="store_true",
                     help="do not sign the records written on .out (by default the holder "
                     "makes a key, names it in its claims and signs each record in the header "
                     "fx-holder-sig; executors answer only requests their epoch's holder "
                     "signed: docs/security.md)")
    run.add_argument("--no-signature-check", action="store_true",
                     help="do not check the signature of each response read from .resp (by "
                     "default each is checked as fx why does, counted in "
                     "fx_holder_signature_failures_total and logged; it decides nothing)")
    run.add_argument("--fleet-key", action="append", default=[], metavar="KEY",
                     help="check signatures against the node keys this fleet public key "
                     "certified on sys.keys instead of sys.facts (repeatable; default "
                     "$FX_FLEET_PUBLIC_KEY, else sys.facts)")
    bootstrap_arg(run)
    run.set_defaults(func=needs_workload(_run, exit_code=EXIT_MISMATCH, bootstrap=_bootstrap,
                                         waits_for_broker=True))

    spec = sub.add_parser("spec", help="write a spec record for a workload")
    spec.add_argument("id")
    spec.add_argument("--module", required=True, help="MODULE:Class (its hash goes in the spec)")
    spec.add_argument("--kind", action="append", help="an effect kind to bind (repeatable)")
    spec.add_argument("--model", action="append", metavar="NAME=MODEL",
                      help="NAME=sha256:HEX, or NAME=MODEL@VERSION / NAME=MODEL@ALIAS from the "
                      "registry (fx models list --registry), resolved now and recorded with "
                      "its name (repeatable)")
    spec.add_argument("--local-model", action="append", metavar="NAME=HASH",
                      help="mode A (experimental): an integer artifact the step runs itself "
                      "(repeatable)")
    spec.add_argument("--local-max-tokens", type=int, default=64,
                      help="mode A: tokens a step may spend on local models (default 64)")
    spec.add_argument("--guarantee", action="append", metavar="KIND=GUARANTEE",
                      help="the guarantee an actuation kind must be served with: idempotent, "
                      "fenced or at-most-once (repeatable; docs/actuation.md)")
    spec.add_argument("--unsigned", choices=("count", "refuse"), default=None,
                      help="what the holder does with an executor's answer without a "
                      "signature: count it and merge it, or refuse it (pass it over as "
                      "unsigned). Default: refuse on a secured broker (FX_KAFKA_SECURITY_"
                      "PROTOCOL=SASL_*), count otherwise (docs/security.md)")
    spec.add_argument("--signer", action="append", metavar="NODE=PUBLIC_KEY",
                      help="a node whose signed answers the holder trusts, and one of its "
                      "public keys (base64, as on sys.facts; repeatable). With any, a signed "
                      "answer by another key or node is passed over as untrusted_key")
    spec.add_argument("--outstanding-limit", type=int, default=16)
    spec.add_argument("--deadline-ms", type=int, default=5_000)
    spec.add_argument("--executor-lease-ms", type=int, default=30_000)
    spec.add_argument("--snapshot-every", type=int, default=100)
    spec.add_argument("--audit-horizon-ms", type=int, metavar="MS",
                      help="keep .in/.out/.resp/.merge records at least this long; `fx trim` "
                      "deletes older ones (default: forever, nothing is trimmed)")
    spec.add_argument("--input-wait-ms", type=int, default=30_000, metavar="MS",
                      help="input_policy: how long after an input is appended the holder "
                      "waits for a chunk or stream record it names (default 30000)")
    spec.add_argument("--on-unresolvable", choices=("quarantine", "stop"), default="quarantine",
                      help="input_policy: then skip the input on the record, with an alarm "
                      "(default), or stop the holder there")
    spec.add_argument("--on-step-error", choices=("quarantine", "stop"), default="quarantine",
                      help="input_policy: an input whose step raises is skipped on the record, "
                      "with an alarm (default), or stops the holder")
    spec.add_argument("--chunk-store", choices=("kafka", "fs"), default="kafka",
                      help="the chunk store every service of the workload uses: sys.chunks "
                      "(default) or a shared directory (a holder with another refuses to "
                      "start; docs/operations.md)")
    spec.add_argument("--redactable-inputs", action="store_true",
                      help="every input goes through a chunk (sealed under the workload's "
                      "tenant key), however small, so fx redact can remove it early")
    spec.add_argument("--force", action="store_true",
                      help="write model hashes no node on sys.facts (and no --model-dir store) "
                      "holds; they are recorded on the spec as unchecked_models")
    spec.add_argument("--model-dir", metavar="DIR",
                      help="a model store whose models count as known when the hashes are "
                      "checked (default: $FX_MODEL_DIR; sys.facts is always read)")
    bootstrap_arg(spec)
    spec.set_defaults(func=_spec)

    from workload_sdk._deploy import register as register_deploy

    register_deploy(sub)

    inp = sub.add_parser("input", help="append an input record to wl.<id>.in (over the inline "
                         "limit: stored as a chunk, the record carries its reference)")
    inp.add_argument("id")
    group = inp.add_mutually_exclusive_group(required=True)
    group.add_argument("--json", help="a JSON value")
    group.add_argument("--text", help="UTF-8 text")
    group.add_argument("--file", help="a file's bytes")
    group.add_argument("--ref", metavar="JSON",
                       help="a chunk reference already stored for the workload (what fx chunk "
                       "put --workload ID prints) or a stream reference, as the body")
    inp.add_argument("--media-type", help="recorded on the body (or the chunk reference)")
    inp.add_argument("--source", help="who or what the input comes from (recorded)")
    inp.add_argument("--inline", action="store_true",
                     help="refuse an input over the 64 KiB inline limit instead of storing it as "
                     "a chunk (by default such an input is stored as a chunk of the workload "
                     "and the input record carries its reference)")
    chunk_dir_arg(inp)
    bootstrap_arg(inp)
    inp.set_defaults(func=needs_workload(_input, exit_code=EXIT_MISMATCH,
                                        bootstrap=_bootstrap))
    register_skip(sub, bootstrap_arg, _bootstrap, EXIT_MISMATCH)

    rp = subparsers.add_parser("replay", help="rebuild a workload's state from its log "
                               "(never calls an executor)")
    rp.add_argument("id")
    rp.add_argument("--module", help="MODULE:Class: code at hand (default: each step's code "
                    "from the module store, by the hash its spec names; with --diff: the new "
                    "code)")
    rp.add_argument("--to", type=int, help="stop after the step at this merge seq")
    rp.add_argument("--from-start", action="store_true", help="ignore snapshots")
    rp.add_argument("--trust-log", action="store_true",
                    help="do not validate the log's records again (the holder validated them "
                    "when it merged them): faster; the fold's own checks stay "
                    "(docs/replay.md)")
    rp.add_argument("--diff", action="store_true", help="run --module over the recorded "
                    "inputs and answers and report the first output that differs")
    rp.add_argument("--from-step", type=int, metavar="STEP",
                    help="with --diff: the steps before STEP run the code recorded for them "
                    "(the module store), --module runs from STEP on: what deploying it there "
                    "would have done")
    rp.add_argument("--json", action="store_true")
    rp.add_argument("--model-dir", metavar="DIR",
                    help="mode A: where the spec's local_models are loaded from, to recompute "
                    "them (default: $FX_MODEL_DIR)")
    chunk_dir_arg(rp)
    bootstrap_arg(rp)
    rp.set_defaults(func=needs_workload(_replay, exit_code=EXIT_MISMATCH,
                                       bootstrap=_bootstrap))

    wy = subparsers.add_parser("why", help="walk from an output back to its inputs and model")
    wy.add_argument("id")
    where = wy.add_mutually_exclusive_group(required=True)
    where.add_argument("--output", type=int, help="offset of the output on wl.<id>.out")
    where.add_argument("--at", help="time (ms since the epoch, or ISO 8601): the latest output "
                       "appended at or before it")
    wy.add_argument("--json", action="store_true")
    wy.add_argument("--fleet-key", action="append", default=[],
                    help="fleet public key (base64/hex; default $FX_FLEET_PUBLIC_KEY): check "
                         "signatures against the node keys it certified on sys.keys, not "
                         "against sys.facts")
    bootstrap_arg(wy)
    wy.set_defaults(func=needs_workload(_why, exit_code=EXIT_MISMATCH, bootstrap=_bootstrap))

    tr = subparsers.add_parser("trim", help="delete a workload's records older than its "
                               "audit horizon (keeps what resume and replay need)")
    tr.add_argument("id")
    tr.add_argument("--dry-run", action="store_true", help="print what would be deleted, "
                    "delete nothing")
    tr.add_argument("--json", action="store_true")
    bootstrap_arg(tr)
    tr.set_defaults(func=needs_workload(_trim, exit_code=EXIT_MISMATCH, bootstrap=_bootstrap))

    au = subparsers.add_parser("audit", help="check every invariant of a workload's log "
                               "(answers, .out slots, epochs, signatures, merge order, replay)")
    au.add_argument("id")
    au.add_argument("--module", help="MODULE:Class: replay with it from the start and from "
                    "each snapshot (without it the replay check is skipped, and says so)")
    au.add_argument("--json", action="store_true")
    au.add_argument("--fleet-key", action="append", default=[],
                    help="fleet public key (base64/hex; default $FX_FLEET_PUBLIC_KEY): check "
                         "signatures against the node keys it certified on sys.keys, not "
                         "against sys.facts")
    au.add_argument("--model-dir", metavar="DIR",
                    help="mode A: where the spec's local_models are loaded from, for the "
                    "replay check (default: $FX_MODEL_DIR)")
    au.add_argument("--clock-skew-ms", type=int, default=0, metavar="MS",
                    help="how far the brokers' clocks may differ (epoch check by append time; "
                    "default 0, one broker)")
    chunk_dir_arg(au)
    bootstrap_arg(au)
    au.set_defaults(func=needs_workload(_audit, exit_code=EXIT_AUDIT_USAGE,
                                       bootstrap=_bootstrap))


def main(argv: list[str] | None = None) -> int:
    """``python -m workload_sdk``: the same subcommands as ``fx``, without the rest of ``fx``."""
    import logging

    parser = argparse.ArgumentParser(prog="python -m workload_sdk",
                                     description="workload, replay and why (as in fx)")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        stream=sys.stderr)
    logging.getLogger("aiokafka").setLevel(logging.WARNING)
    quiet_client_logs()  # a broker outage: one line per kind per 10 s, not thousands
    return run_command(args.func, args, verbose=args.verbose)
