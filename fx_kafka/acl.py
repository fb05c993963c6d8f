"""The ACLs the design implies, for a broker with an authorizer (``fx acl apply``).

Roles and what each may do (``User:<name>`` principals, SASL user names):

============  =================================================================================
executor      reads ``wl.<id>.out``, ``.claims``, ``.spec`` and ``.in`` (an input may be a stream
              reference into its own workload) and writes ``wl.<id>.resp``; reads and writes
              the shadow evaluations' topics (``wl.<id>.shadow.*``, PREFIXED); writes ``sys.facts``
              and ``sys.rejects``, reads and writes ``sys.chunks`` (and may create those three);
              joins the consumer groups ``<group prefix>.<kind>``. Nothing else: it cannot write
              ``.out``, ``.merge``, ``.claims`` or ``.spec``. An actuator gateway runs as this
              role too: it also reads and writes its memory ``sys.actuator.<node>`` (PREFIXED)
              and joins ``<actuator group prefix>.<kind>``; its telemetry inputs need the
              producer role's write on ``wl.<id>.in``.
holder        reads, creates and describes (configs too) every topic of its own workload
              (``wl.<id>.*``, PREFIXED); writes ``.out``, ``.resp``, ``.merge`` and
              ``.claims`` only (never ``.spec``: a spec's grants are worth what its writer may
              read, issue 30; nor ``.in``); deletes records of ``.in/.out/.resp/.merge`` for
              ``fx trim`` (DELETE on those LITERAL names); its transactional id
              ``fx-holder.<id>`` and the election group ``fx-holder-elect.<id>``; reads
              ``sys.facts`` (placement, signature checks) and ``sys.keys`` (signature checks
              with ``--fleet-key``) and writes (and may create) ``sys.alarms`` (the alarm
              of an at-most-once ``unknown``, in its transaction). One holder principal per
              workload keeps
              workloads apart: the holder of one cannot read or write another's streams.
producer      writes ``wl.<id>.in`` only.
operator      reads and describes every topic (``*``); writes ``wl.<id>.spec`` and the shadow
              evaluations' topics (``fx shadow``, ``wl.<id>.shadow.*``), creates the
              workload's topics and deletes records below the audit horizon (``fx trim``);
              writes (and creates) ``sys.keys``, the node key history (``fx keys``), and
              writes ``sys.alarms`` (``fx alarms ack``).
============  =================================================================================

Pattern types. Kafka matches a resource name LITERAL (one name, or ``*`` for all), or PREFIXED
(every name starting with the pattern); there is no suffix or glob match, so "every workload's
``.out``" cannot be one ACL. Workload ids hold no ``.`` (``broker_schema.topics``), so the prefix
``wl.<id>.`` names exactly one workload's topics: the holder gets that PREFIXED pattern (its
future streams, shadow ones among them, included), the executor and producer get LITERAL names
per workload, and ``fx acl apply --workload ID`` is run for each workload (idempotent: creating
an ACL that exists changes nothing). A prefix of ``wl.`` would have given the executor every
``.merge`` and ``.in`` of every workload.

ACLs are created with the CreateAcls API through aiokafka's protocol classes (its admin client
has no ACL methods), as the broker's super user (``fx broker start --secure`` writes its
``admin.env``).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import IntEnum

from aiokafka.errors import KafkaConnectionError, for_code
from aiokafka.protocol.admin import (
    CreateAclsRequest_v1,
    DescribeAclsRequest_v1,
)
from aiokafka.protocol.api import Request

from broker_schema import topics
from fx_kafka.client import make_admin, wait_ready
from fx_kafka.errors import BrokerError
from fx_kafka.security import ClientSecurity

__all__ = [
    "AclBinding",
    "Operation",
    "PatternType",
    "ResourceType",
    "Roles",
    "apply_acls",
    "describe_acls",
    "plan_acls",
    "register",
]


class ResourceType(IntEnum):
    ANY = 1
    TOPIC = 2
    GROUP = 3
    CLUSTER = 4
    TRANSACTIONAL_ID = 5


class PatternType(IntEnum):
    ANY = 1
    MATCH = 2
    LITERAL = 3
    PREFIXED = 4


class Operation(IntEnum):
    ANY = 1
    ALL = 2
    READ = 3
    WRITE = 4
    CREATE = 5
    DELETE = 6
    ALTER = 7
    DESCRIBE = 8
    CLUSTER_ACTION = 9
    DESCRIBE_CONFIGS = 10
    ALTER_CONFIGS = 11
    IDEMPOTENT_WRITE = 12


_ALLOW = 3

#: The streams of its own workload a holder writes (``.spec`` and ``.in`` are not among them).
HOLDER_WRITES = ("out", "resp", "merge", "claims")
#: The streams ``fx trim`` deletes records of (below the audit horizon): the only topics any
#: role gets DELETE on. Kafka's DELETE on a topic allows DeleteRecords *and* DeleteTopics; the
#: secured broker runs with ``delete.topic.enable=false`` (``fx broker start --secure``), so it
#: is records only.
TRIMMED = topics.TRIMMED
_ANY_PERMISSION = 1


@dataclass(frozen=True, order=True)
class AclBinding:
    """One ALLOW rule: ``principal`` may ``operation`` on the resource, from any host."""

    principal: str
    resource_type: ResourceType
    name: str
    pattern: PatternType
    operation: Operation

    def __str__(self) -> str:
        return (f"ALLOW {self.principal} {self.operation.name} {self.resource_type.name} "
                f"{self.name} ({self.pattern.name})")


@dataclass(frozen=True)
class Roles:
    """The SASL user of each role; None leaves a role out."""

    executor: str | None = "executor"
    holder: str | None = "holder"
    producer: str | None = "producer"
    operator: str | None = "operator"
    #: the executor's consumer groups are ``<executor_group_prefix>.<kind>``
    executor_group_prefix: str = "fx-executor"
    #: an actuator gateway's (run as the executor role) are ``<actuator_group_prefix>.<kind>``
    actuator_group_prefix: str = "fx-actuator"
    #: ``(node id, user)``: executor nodes that run as a user of their own, each allowed to
    #: write only its own receipt ledger ``sys.ledger.<node>`` (and given every other executor
    #: grant). When any is given, the shared ``executor`` user may only read ledgers: nobody can
    #: append to another node's ledger (docs/ledger.md, "Who may write a ledger").
    ledger_nodes: tuple[tuple[str, str], ...] = ()


def _user(name: str) -> str:
    return name if name.startswith("User:") else f"User:{name}"


def _grant(principal: str, rtype: ResourceType, name: str, pattern: PatternType,
           *ops: Operation) -> list[AclBinding]:
    return [AclBinding(principal, rtype, name, pattern, op) for op in ops]


def plan_acls(roles: Roles, workloads: Iterable[str] = ()) -> list[AclBinding]:
    """The ACLs of ``roles``: the global ones (system topics, groups, read-all) and, per
    workload id, its streams' (see the module docstring). Sorted, no duplicates. Pure."""
    T, G, X = ResourceType.TOPIC, ResourceType.GROUP, ResourceType.TRANSACTIONAL_ID
    LIT, PRE = PatternType.LITERAL, PatternType.PREFIXED
    R, W, C, D = Operation.READ, Operation.WRITE, Operation.CREATE, Operation.DESCRIBE
    out: list[AclBinding] = []
    executors = [_user(u) for u in ([roles.executor] if roles.executor else [])]
    executors += [_user(user) for _, user in roles.ledger_nodes]
    for node, user in roles.ledger_nodes:
        # each node's receipt ledger: written only by its own user
        out += _grant(_user(user), T, topics.ledger(node), LIT, R, W, D, C)
    for ex in executors:
        out += _grant(ex, T, topics.FACTS, LIT, W, D, C)
        out += _grant(ex, T, topics.REJECTS, LIT, W, D, C)
        out += _grant(ex, T, topics.CHUNKS, LIT, R, W, D, C)
        # each node's receipt ledger (sys.ledger.<node>): read back on start, appended to (by
        # any executor, unless nodes have users of their own: then each writes only its own)
        out += (_grant(ex, T, topics.LEDGER_PREFIX, PRE, R, D) if roles.ledger_nodes else
                _grant(ex, T, topics.LEDGER_PREFIX, PRE, R, W, D, C))
        out += _grant(ex, G, f"{roles.executor_group_prefix}.", PRE, R, D)
        # an actuator gateway's memory (sys.actuator.<node>) and consumer groups; the system
        # topics are made at start, sys.alarms among them (a gateway writes an alarm when its
        # device does not confirm a write: docs/actuation.md, "Alarms")
        out += _grant(ex, T, topics.ACTUATOR_PREFIX, PRE, R, W, D, C)
        out += _grant(ex, T, topics.ALARMS, LIT, W, D, C)
        # the module store (workload code by hash): made at start with the other system topics;
        # an executor never reads or writes it
        out += _grant(ex, T, topics.MODULES, LIT, D, C)
        out += _grant(ex, G, f"{roles.actuator_group_prefix}.", PRE, R, D)
    if roles.operator:
        op = _user(roles.operator)
        out += _grant(op, T, "*", LIT, R, D, Operation.DESCRIBE_CONFIGS)
        # the node key history: certificates written with the fleet key (fx keys certify)
        out += _grant(op, T, topics.KEYS, LIT, W, C)
        # fx alarms ack
        out += _grant(op, T, topics.ALARMS, LIT, W)
        # the module store: fx workload deploy (code the holders will run)
        out += _grant(op, T, topics.MODULES, LIT, W, C)
        # the model registry: fx models register / alias (names the specs resolve); nobody
        # else writes it, and nothing but the operator's commands reads it (a record carries
        # the hash a name resolved to, so no service needs the registry)
        out += _grant(op, T, topics.MODELS, LIT, W, C)
        # fx redact / fx tenant-keys: redaction records, key-entry tombstones, re-wrapped keys
        out += _grant(op, T, topics.CHUNKS, LIT, W)
    if roles.holder:
        out += _grant(_user(roles.holder), T, topics.FACTS, LIT, R, D)
        # the node key history, for its signature checks with a fleet key (read only)
        out += _grant(_user(roles.holder), T, topics.KEYS, LIT, R, D)
        # the module store: the code each step runs, by hash (fx workload deploy)
        out += _grant(_user(roles.holder), T, topics.MODULES, LIT, R, D)
        out += _grant(_user(roles.holder), T, topics.ALARMS, LIT, W, D, C)
        # its rejects: a tick on .resp that the holder of its epoch did not write
        out += _grant(_user(roles.holder), T, topics.REJECTS, LIT, W, D, C)
        # its metrics: the executors' and gateways' committed offsets on .out (list and
        # fetch offsets; DESCRIBE reads, it never joins or commits)
        out += _grant(_user(roles.holder), G, f"{roles.executor_group_prefix}.", PRE, D)
        out += _grant(_user(roles.holder), G, f"{roles.actuator_group_prefix}.", PRE, D)
    for wid in dict.fromkeys(workloads):
        topics.check_workload_id(wid)
        for ex in executors:
            for name in (topics.out(wid), topics.claims(wid), topics.spec(wid),
                         topics.inputs(wid)):
                out += _grant(ex, T, name, LIT, R, D)
            out += _grant(ex, T, topics.resp(wid), LIT, W, D)
            # shadow evaluations (fx shadow): read their requests and definitions, answer on
            # their .resp; every evaluation of the workload, named or not yet
            out += _grant(ex, T, topics.shadow_prefix(wid), PRE, R, W, D)
        if roles.holder:
            ho = _user(roles.holder)
            # read, create and describe every topic of the workload; write only the streams it
            # writes: never .spec (a spec's grants are worth what its writer may read, and only
            # the operator, who reads every topic, writes specs) nor .in
            out += _grant(ho, T, topics.prefix(wid), PRE, R, C, D, Operation.DESCRIBE_CONFIGS)
            for name in HOLDER_WRITES:
                out += _grant(ho, T, topics.stream(wid, name), LIT, W)
            for name in TRIMMED:
                out += _grant(ho, T, topics.stream(wid, name), LIT, Operation.DELETE)
            out += _grant(ho, X, f"fx-holder.{wid}", LIT, W, D)
            # the holder election's consumer group (workload_sdk._election)
            out += _grant(ho, G, f"fx-holder-elect.{wid}", LIT, R, D)
        if roles.producer:
            out += _grant(_user(roles.producer), T, topics.inputs(wid), LIT, W, D)
        if roles.operator:
            op = _user(roles.operator)
            out += _grant(op, T, topics.prefix(wid), PRE, C)
            out += _grant(op, T, topics.spec(wid), LIT, W)
            # fx shadow writes an evaluation's definition, requests and timeouts
            out += _grant(op, T, topics.shadow_prefix(wid), PRE, W)
            for name in TRIMMED:
                out += _grant(op, T, topics.stream(wid, name), LIT, Operation.DELETE)
    return sorted(set(out))


class _CreateAcls(Request[CreateAclsRequest_v1]):  # type: ignore[misc]
    API_KEY = 30

    def __init__(self, bindings: Sequence[AclBinding]) -> None:
        self._bindings = bindings

    def build(self, request_struct_class: type[CreateAclsRequest_v1]) -> CreateAclsRequest_v1:
        return request_struct_class([
            (int(b.resource_type), b.name, int(b.pattern), b.principal, "*", int(b.operation),
             _ALLOW) for b in self._bindings])


class _DescribeAcls(Request[DescribeAclsRequest_v1]):  # type: ignore[misc]
    API_KEY = 29

    def __init__(self, principal: str | None) -> None:
        self._principal = principal

    def build(self, request_struct_class: type[DescribeAclsRequest_v1]
              ) -> DescribeAclsRequest_v1:
        return request_struct_class(int(ResourceType.ANY), None, int(PatternType.ANY),
                                    self._principal, None, int(Operation.ANY), _ANY_PERMISSION)


async def apply_acls(bootstrap: str, bindings: Sequence[AclBinding], *,
                     security: ClientSecurity | None = None, batch: int = 100) -> None:
    """Create ``bindings`` (idempotent). Raises the broker's error for the first one refused
    (``ClusterAuthorizationFailedError`` when the caller is not allowed to alter ACLs,
    ``SecurityDisabledError`` when the broker has no authorizer)."""
    if not bindings:
        return
    admin = make_admin(bootstrap, security=security)
    try:
        await admin.start()
        for i in range(0, len(bindings), batch):
            chunk = bindings[i:i + batch]
            resp = await admin._send_request(_CreateAcls(chunk))
            for binding, (code, message) in zip(chunk, resp.creation_responses, strict=True):
                if code:
                    raise for_code(code)(f"creating {binding}: {message}")
    finally:
        await admin.close()


async def describe_acls(bootstrap: str, *, principal: str | None = None,
                        security: ClientSecurity | None = None) -> list[AclBinding]:
    """The ALLOW ACLs on the broker (of ``principal`` if given), sorted."""
    admin = make_admin(bootstrap, security=security)
    try:
        await admin.start()
        resp = await admin._send_request(
            _DescribeAcls(_user(principal) if principal else None))
    finally:
        await admin.close()
    if resp.error_code:
        raise for_code(resp.error_code)(resp.error_message or "DescribeAcls failed")
    found: list[AclBinding] = []
    for rtype, name, pattern, acls in resp.resources:
        for who, _host, operation, permission in acls:
            if permission != _ALLOW:
                continue
            try:
                found.append(AclBinding(who, ResourceType(rtype), name, PatternType(pattern),
                                        Operation(operation)))
            except ValueError:
                continue  # a resource type or operation this module does not name
    return sorted(found)


async def existing_workloads(bootstrap: str, *,
                             security: ClientSecurity | None = None) -> list[str]:
    """The ids of the workloads that have a ``wl.<id>.spec`` topic on the broker."""
    admin = make_admin(bootstrap, security=security)
    try:
        await admin.start()
        names = await admin.list_topics()
    finally:
        await admin.close()
    found = []
    for name in names:
        parsed = _parse(name)
        if parsed is not None and parsed[1] == "spec":
            found.append(parsed[0])
    return sorted(found)


def _parse(name: str) -> tuple[str, str] | None:
    try:
        wid, stream = topics.parse(name)
    except ValueError:
        return None
    return wid, stream


# -- fx acl -----------------------------------------------------------------------------------
def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``fx acl apply`` and ``fx acl list``."""
    acl = subparsers.add_parser(
        "acl", help="write or list the ACLs of the project's roles (a secured broker)",
        description="The ACLs of the roles executor, holder, producer and operator "
        "(docs/operations.md, 'Security: authentication and ACLs'). Run as the broker's super "
        "user (e.g. `. .fx/broker/security/admin.env`).")
    actions = acl.add_subparsers(dest="acl_command", metavar="{apply,list}")
    actions.required = True

    def bootstrap(p: argparse.ArgumentParser) -> None:
        import os

        p.add_argument("--bootstrap", default=os.environ.get("FX_KAFKA_BOOTSTRAP",
                                                             "127.0.0.1:9092"),
                       help="broker address (default: $FX_KAFKA_BOOTSTRAP or 127.0.0.1:9092)")

    apply = actions.add_parser("apply", help="create the ACLs (idempotent)")
    bootstrap(apply)
    apply.add_argument("--workload", action="append", default=[], metavar="ID",
                       help="a workload to grant its streams for (repeatable)")
    apply.add_argument("--existing", action="store_true",
                       help="also every workload with a wl.<id>.spec topic on the broker")
    for role, default in (("executor", "executor"), ("holder", "holder"),
                          ("producer", "producer"), ("operator", "operator")):
        apply.add_argument(f"--{role}", default=default, metavar="USER",
                           help=f"the {role} role's SASL user (default {default!r}; '' leaves "
                           "the role out)")
    apply.add_argument("--ledger-node", action="append", default=[], metavar="NODE=USER",
                       help="an executor node that runs as a user of its own: USER gets every "
                            "executor grant and is the only writer of sys.ledger.NODE; with any "
                            "given, the shared executor user only reads ledgers (repeatable)")
    apply.add_argument("--executor-group-prefix", default="fx-executor",
                       help="the executor's group_prefix (default fx-executor)")
    apply.add_argument("--dry-run", action="store_true", help="print the ACLs, create nothing")
    apply.set_defaults(func=cmd_apply)

    listing = actions.add_parser("list", help="print the ACLs on the broker")
    bootstrap(listing)
    listing.add_argument("--principal", default=None, help="only this user's")
    listing.set_defaults(func=cmd_list)


def cmd_apply(args: argparse.Namespace) -> int:
    try:
        nodes = []
        for item in args.ledger_node:
            node, sep, user = item.partition("=")
            if not sep or not node or not user:
                raise ValueError(f"--ledger-node {item!r}: expected NODE=USER")
            topics.ledger(node)  # a node id that names a topic
            nodes.append((node, user))
        roles = Roles(executor=args.executor or None, holder=args.holder or None,
                      producer=args.producer or None, operator=args.operator or None,
                      executor_group_prefix=args.executor_group_prefix,
                      ledger_nodes=tuple(nodes))
        workloads = [topics.check_workload_id(w) for w in args.workload]
    except ValueError as exc:
        print(f"fx acl apply: {exc}", file=sys.stderr)
        return 2

    async def run() -> int:
        wanted = list(workloads)
        if args.existing:
            wanted += await existing_workloads(args.bootstrap)
        bindings = plan_acls(roles, wanted)
        for binding in bindings:
            print(binding)
        if args.dry_run:
            print(f"(dry run: {len(bindings)} ACLs, nothing created)", file=sys.stderr)
            return 0
        await apply_acls(args.bootstrap, bindings)
        print(f"applied {len(bindings)} ACLs for {len(dict.fromkeys(wanted))} workload(s)",
              file=sys.stderr)
        return 0

    try:
        return asyncio.run(run())
    except Exception as exc:  # the broker's refusal, an unreachable broker: one line, exit 1
        why = _explained(args.bootstrap, exc)
        print(f"fx acl apply: {why.__class__.__name__}: {why}", file=sys.stderr)
        return 1


def _explained(bootstrap: str, exc: Exception) -> BaseException:
    """For aiokafka's bootstrap error, what one direct connection says (wrong password,
    untrusted certificate, a plaintext client on a secured listener)."""
    if not isinstance(exc, KafkaConnectionError):
        return exc

    async def probe() -> BaseException | None:
        try:
            await wait_ready(bootstrap, 2.0)
        except BrokerError as err:
            return err
        return None

    return asyncio.run(probe()) or exc


def cmd_list(args: argparse.Namespace) -> int:
    try:
        found = asyncio.run(describe_acls(args.bootstrap, principal=args.principal))
    except Exception as exc:
        why = _explained(args.bootstrap, exc)
        print(f"fx acl list: {why.__class__.__name__}: {why}", file=sys.stderr)
        return 1
    for binding in found:
        print(binding)
    return 0
