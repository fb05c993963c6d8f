"""Small aiokafka helpers every part of the project uses: topics, producers, consumers, readiness.

Every aiokafka client of the project is made here (:func:`make_producer`, :func:`make_consumer`,
:func:`make_admin`), so each one takes its SASL/TLS settings from one place:
:func:`fx_kafka.security.current` (the environment's ``FX_KAFKA_*`` variables, or what
:func:`~fx_kafka.security.use_security` installed), unless a caller passes ``security``.

The factories must be called with an event loop running (aiokafka binds each client to the
running loop in its constructor).
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.conn import create_conn
from aiokafka.errors import (
    AuthenticationFailedError,
    KafkaConnectionError,
    KafkaError,
    SaslAuthenticationFailed,
    TopicAlreadyExistsError,
    TopicAuthorizationFailedError,
    for_code,
)

from broker_schema.limits import BROKER_MESSAGE_MAX_BYTES
from fx_kafka import group_join
from fx_kafka.errors import BrokerAuthError, BrokerNotReadyError, MirrorCopyError
from fx_kafka.replication import ReplicationSettings
from fx_kafka.retry import jittered_backoff_s
from fx_kafka.security import ClientSecurity
from fx_kafka.security import current as current_security

__all__ = [
    "FRAME_CAP_BYTES",
    "MIRROR_LOG_START_HEADER",
    "MIRROR_OFFSET_HEADER",
    "MIRROR_SITE_HEADER",
    "PartitionRead",
    "broker_count",
    "check_authorized",
    "create_topics",
    "header_value",
    "make_admin",
    "make_consumer",
    "make_producer",
    "mirror_header",
    "probe_connection",
    "read_partition",
    "wait_brokers",
    "wait_ready",
]

log = logging.getLogger(__name__)

#: Errors a retry cannot cure (wrong credentials): raised at once by the waiting helpers.
_AUTH_ERRORS: tuple[type[BaseException], ...] = (AuthenticationFailedError,
                                                 SaslAuthenticationFailed)

#: The broker's message.max.bytes (deploy/local-kafka/server.properties.template): the schema's
#: MAX_RECORD_BYTES plus 64 KiB for key, headers and batch overhead.
FRAME_CAP_BYTES: int = BROKER_MESSAGE_MAX_BYTES


def _security_options(security: ClientSecurity | None) -> dict[str, Any]:
    return (security if security is not None else current_security()).client_options()


def make_admin(bootstrap: str, *, security: ClientSecurity | None = None,
               **kw: Any) -> AIOKafkaAdminClient:
    """An (unstarted) admin client with the project's security settings; ``kw`` overrides."""
    options: dict[str, Any] = {"bootstrap_servers": bootstrap, **_security_options(security)}
    options.update(kw)
    return AIOKafkaAdminClient(**options)


async def wait_ready(bootstrap: str, timeout: float = 30.0, *,
                     security: ClientSecurity | None = None) -> None:
    """Return once ``bootstrap`` answers an admin call (list topics); else raise
    :class:`~fx_kafka.errors.BrokerNotReadyError` after ``timeout`` seconds. A failed
    authentication is not waited out: it is raised at once (aiokafka's error)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    last: BaseException | None = None
    while True:
        remaining = deadline - loop.time()
        if remaining <= 0:
            raise BrokerNotReadyError(
                f"Kafka at {bootstrap} not ready after {timeout:.1f} s (last error: {last!r})"
            )
        admin = make_admin(
            bootstrap,
            security=security,
            request_timeout_ms=max(1000, int(min(remaining, 10.0) * 1000)),
        )
        try:
            await asyncio.wait_for(_list_topics(admin), timeout=remaining)
            return
        except (TimeoutError, KafkaError, OSError) as exc:
            last = exc
            if isinstance(exc, KafkaConnectionError):
                # aiokafka's bootstrap error hides why: one direct connection tells
                cause = await probe_connection(bootstrap, security=security,
                                               timeout=max(0.5, min(5.0, remaining)))
                if cause is not None:
                    _raise_if_auth(cause, bootstrap, security)
                    last = cause
        finally:
            await admin.close()
        await asyncio.sleep(min(0.2, max(0.0, deadline - loop.time())))


def _raise_if_auth(exc: BaseException, bootstrap: str, security: ClientSecurity | None) -> None:
    sec = security if security is not None else current_security()
    if isinstance(exc, _AUTH_ERRORS):
        raise BrokerAuthError(
            f"Kafka at {bootstrap} refused the credentials of {sec.principal} "
            f"({sec.mechanism} over {sec.protocol}): {exc}. Check FX_KAFKA_SASL_USERNAME and "
            "FX_KAFKA_SASL_PASSWORD(_FILE)") from exc
    if isinstance(exc, ssl.SSLCertVerificationError):
        raise BrokerAuthError(
            f"the TLS certificate of Kafka at {bootstrap} cannot be verified: {exc}. Set "
            "FX_KAFKA_CA_FILE to the CA that signed it (a local secured broker's is "
            "DATA_DIR/security/ca.crt)") from exc


async def probe_connection(bootstrap: str, *, security: ClientSecurity | None = None,
                           timeout: float = 5.0) -> BaseException | None:
    """Open one connection (TLS, SASL) to the first host of ``bootstrap`` with the security
    settings in force; return what went wrong, or None when it worked."""
    host, _, port = bootstrap.split(",")[0].strip().rpartition(":")
    sec = security if security is not None else current_security()
    opts = sec.client_options()
    try:
        conn = await asyncio.wait_for(create_conn(
            host, int(port), request_timeout_ms=max(500, int(timeout * 1000)),
            security_protocol=opts["security_protocol"], ssl_context=opts.get("ssl_context"),
            sasl_mechanism=opts.get("sasl_mechanism"),
            sasl_plain_username=opts.get("sasl_plain_username"),
            sasl_plain_password=opts.get("sasl_plain_password")), timeout)
    except (TimeoutError, KafkaError, OSError, ValueError) as exc:
        if isinstance(exc, TimeoutError | KafkaConnectionError) and not sec.tls:
            hinted: BaseException = KafkaConnectionError(
                f"{host}:{port} closed or ignored a {sec.protocol} connection ({exc or 'timeout'}"
                "): if the broker is secured, set FX_KAFKA_SECURITY_PROTOCOL=SASL_SSL, "
                "FX_KAFKA_SASL_USERNAME, FX_KAFKA_SASL_PASSWORD(_FILE) and FX_KAFKA_CA_FILE")
            return hinted
        return exc
    conn.close()
    return None


async def broker_count(bootstrap: str, *, security: ClientSecurity | None = None) -> int:
    """How many brokers the cluster at ``bootstrap`` has registered (from its metadata)."""
    admin = make_admin(bootstrap, security=security)
    try:
        await admin.start()
        cluster = await admin.describe_cluster()
        return len(cluster["brokers"])
    finally:
        await admin.close()


async def wait_brokers(bootstrap: str, count: int, timeout: float = 60.0, *,
                       security: ClientSecurity | None = None) -> None:
    """Return once the cluster at ``bootstrap`` has ``count`` brokers registered; else raise
    :class:`~fx_kafka.errors.BrokerNotReadyError` after ``timeout`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    seen: int | None = None
    last: BaseException | None = None
    while loop.time() < deadline:
        try:
            seen = await asyncio.wait_for(broker_count(bootstrap, security=security),
                                          timeout=max(0.5, deadline - loop.time()))
            if seen >= count:
                return
        except (TimeoutError, KafkaError, OSError) as exc:
            last = exc
        await asyncio.sleep(0.2)
    raise BrokerNotReadyError(f"Kafka at {bootstrap}: {seen} of {count} brokers registered after "
                              f"{timeout:.1f} s (last error: {last!r})")


async def _list_topics(admin: AIOKafkaAdminClient) -> list[str]:
    await admin.start()
    topics: list[str] = await admin.list_topics()
    return topics


async def create_topics(
    bootstrap: str,
    names: Iterable[str],
    *,
    partitions: int = 1,
    compacted: bool = False,
    replication: ReplicationSettings | None = None,
    configs: dict[str, str] | None = None,
    security: ClientSecurity | None = None,
) -> None:
    """Create ``names`` (idempotent: a topic that already exists is left as it is).

    Replication follows ``replication`` (default: :meth:`ReplicationSettings.from_env`, resolved
    against the cluster's broker count: factor ``min(3, brokers)``, ``min.insync.replicas`` 2 from
    3 replicas on, no unclean leader election). ``compacted`` sets ``cleanup.policy=compact``;
    ``configs`` adds topic configs (and may override the replication ones). Any other per-topic
    error raises the matching aiokafka exception.
    """
    wanted = list(dict.fromkeys(names))
    if not wanted:
        return
    settings = replication if replication is not None else ReplicationSettings.from_env()
    admin = make_admin(bootstrap, security=security)
    try:
        await admin.start()
        brokers = len((await admin.describe_cluster())["brokers"])
        replication_factor, _ = settings.resolve(brokers)
        topic_configs = settings.topic_configs(brokers) | dict(configs or {})
        if compacted:
            topic_configs["cleanup.policy"] = "compact"
        resp = await admin.create_topics(
            [
                NewTopic(
                    name=name,
                    num_partitions=partitions,
                    replication_factor=replication_factor,
                    topic_configs=topic_configs,
                )
                for name in wanted
            ]
        )
        for entry in resp.topic_errors:
            topic, code = entry[0], entry[1]
            if code == 0:
                continue
            error_cls = for_code(code)
            if error_cls is TopicAlreadyExistsError:
                log.debug("topic %s already exists", topic)
                continue
            message = entry[2] if len(entry) > 2 else ""
            raise error_cls(f"creating topic {topic!r}: {message}")
    finally:
        await admin.close()


async def check_authorized(consumer: AIOKafkaConsumer, topics: Iterable[str]) -> None:
    """Raise :class:`~aiokafka.errors.TopicAuthorizationFailedError` at once when the broker
    denies this client any of ``topics`` (its ACLs do not let it describe them); aiokafka itself
    would retry an offset look-up on such a topic until its request timeout (40 s). Call it on
    a started consumer after ``assign``."""
    names = list(topics)
    client = consumer._client  # aiokafka (pinned) has no public view of unauthorized topics
    for name in names:
        client.add_topic(name)
    await client.force_metadata_update()
    denied = sorted(set(names) & set(client.cluster.unauthorized_topics))
    if denied:
        raise TopicAuthorizationFailedError(", ".join(denied))


def bootstrap_of(given: str | None) -> str:
    """The bootstrap a command line names: ``--bootstrap``, else ``$FX_KAFKA_BOOTSTRAP``, else
    the local default ``127.0.0.1:9092`` (the one home of that rule for the ``fx`` commands)."""
    import os

    return str(given or os.environ.get("FX_KAFKA_BOOTSTRAP") or "127.0.0.1:9092")


def make_producer(
    bootstrap: str,
    *,
    enable_idempotence: bool = True,
    transactional_id: str | None = None,
    security: ClientSecurity | None = None,
    **kw: Any,
) -> AIOKafkaProducer:
    """An (unstarted) producer with the project's defaults: ``acks="all"``, idempotence on,
    ``max_request_size`` equal to the broker's frame cap, the security settings in force
    (:mod:`fx_kafka.security`). ``kw`` overrides any of them."""
    options: dict[str, Any] = {
        "bootstrap_servers": bootstrap,
        **_security_options(security),
        "acks": "all",
        "enable_idempotence": enable_idempotence or transactional_id is not None,
        "max_request_size": FRAME_CAP_BYTES,
        "linger_ms": 0,
    }
    if transactional_id is not None:
        options["transactional_id"] = transactional_id
    options.update(kw)
    producer = AIOKafkaProducer(**options)
    pace_metadata_updates(producer.client)
    return producer


#: the backoff between forced metadata updates after a failed one (jittered, from the base)
METADATA_BACKOFF_BASE_S, METADATA_BACKOFF_CAP_S = 0.1, 2.0


def pace_metadata_updates(client: Any) -> None:
    """Space the forced metadata updates of an aiokafka ``client`` that follow a failed one by
    :func:`fx_kafka.retry.jittered_backoff_s` (from 0.1 s, at most 2 s).

    aiokafka's fetcher asks for a metadata update each time it finds an assigned partition
    without a leader, and while the broker is down each update fails at once, so the fetcher
    loops without pause (about 1,300 connect attempts a second, most of a core, measured in
    ``tests/integration/test_health.py``). Paced, a forced update asked for before the next try
    is due answers "not updated" when it is due; the first update after the broker is back
    resets the pace. Applied by :func:`make_consumer` and :func:`make_producer`."""
    original = client.force_metadata_update
    pace = {"failures": 0, "next_at": 0.0}

    def settle(fut: asyncio.Future[Any]) -> None:
        if fut.cancelled():  # the caller stopped waiting: says nothing of the broker
            return
        if fut.exception() is None and bool(fut.result()):
            pace["failures"], pace["next_at"] = 0, 0.0
            return
        pace["failures"] += 1
        pace["next_at"] = asyncio.get_running_loop().time() + jittered_backoff_s(
            int(pace["failures"]), base_s=METADATA_BACKOFF_BASE_S, cap_s=METADATA_BACKOFF_CAP_S)

    def paced() -> asyncio.Future[Any]:
        loop = asyncio.get_running_loop()
        if loop.time() < pace["next_at"]:
            later: asyncio.Future[Any] = loop.create_future()

            def due() -> None:
                if not later.done():
                    later.set_result(False)

            loop.call_at(pace["next_at"], due)
            return later
        fut: asyncio.Future[Any] = original()
        fut.add_done_callback(settle)
        return fut

    client.force_metadata_update = paced


def make_consumer(
    bootstrap: str,
    *topics: str,
    group_id: str | None = None,
    isolation_level: str = "read_committed",
    auto_offset_reset: str = "earliest",
    enable_auto_commit: bool = False,
    security: ClientSecurity | None = None,
    **kw: Any,
) -> AIOKafkaConsumer:
    """An (unstarted) consumer with the project's defaults: ``read_committed``, from the earliest
    offset, no auto commit, fetch sizes that admit a record at the frame cap, the security
    settings in force (:mod:`fx_kafka.security`). ``kw`` overrides. A consumer with several
    assignors joins with one request for all (:mod:`fx_kafka.group_join`)."""
    options: dict[str, Any] = {
        "bootstrap_servers": bootstrap,
        **_security_options(security),
        "group_id": group_id,
        "isolation_level": isolation_level,
        "auto_offset_reset": auto_offset_reset,
        "enable_auto_commit": enable_auto_commit,
        "max_partition_fetch_bytes": FRAME_CAP_BYTES,
        "fetch_max_bytes": max(52_428_800, FRAME_CAP_BYTES),
    }
    options.update(kw)
    group_join.install()  # one JoinGroup per rejoin (aiokafka 0.14.0 sends one per assignor)
    consumer = AIOKafkaConsumer(*topics, **options)
    pace_metadata_updates(consumer._client)
    return consumer


#: Headers that ``fx mirror`` (MirrorMaker 2 with this project's ``SourceOffsetHeader``
#: transform, deploy/local-kafka/mirror) puts on every record it copies to the fleet: the
#: record's offset on the site (ASCII decimal), the site's alias, and, on the first record copied
#: from a partition, the site's log start offset then. Must equal the Java constants (a unit
#: test checks).
MIRROR_OFFSET_HEADER = "fx.mirror.offset"
MIRROR_SITE_HEADER = "fx.mirror.site"
MIRROR_LOG_START_HEADER = "fx.mirror.log_start"


def broker_time_us(msg: Any) -> int | None:
    """A consumed record's broker append time in µs (a time its producer did not choose), or
    None when the topic stamps the producer's time (``CreateTime``)."""
    return int(msg.timestamp) * 1000 if getattr(msg, "timestamp_type", None) == 1 else None


def header_value(headers: Iterable[tuple[str, bytes]] | None, name: str) -> bytes | None:
    """The value of the first header ``name`` of a consumer record's ``headers``, or None."""
    for key, value in headers or ():
        if key == name:
            return bytes(value or b"")
    return None


def mirror_header(headers: Iterable[tuple[str, bytes]] | None, name: str) -> int | None:
    """The integer value of header ``name`` (one of the ``MIRROR_*_HEADER`` offsets), or None
    when the record does not carry it; :class:`MirrorCopyError` if it is not a decimal."""
    for key, value in headers or ():
        if key == name:
            text = bytes(value or b"").decode("ascii", "replace")
            if not text.isdigit():
                raise MirrorCopyError(f"header {name}={text!r} is not an offset")
            return int(text)
    return None


@dataclass
class PartitionRead:
    """What :func:`read_partition` read: the log start (``begin``), the last stable offset at
    the time of the call (``end``) and every record in between as ``(offset, broker time,
    value)``.

    On a mirrored copy (``mirrored``: its records carry :data:`MIRROR_OFFSET_HEADER`) every
    offset is the site's: ``records`` hold the site offsets, ``begin`` is the site's log start
    when the mirror first copied the partition (its first record's offset when unknown) and
    ``end`` the offset after the last record copied (the site's own end may be higher by the
    transaction markers after it, which a copy cannot see). ``raw_end`` is the copy's own last
    stable offset."""

    begin: int
    end: int
    records: list[tuple[int, int, bytes]] = field(default_factory=list)
    mirrored: bool = False
    #: Whether every record read carries the broker's append time (``LogAppendTime``: a time
    #: its producer did not choose); False for a mirrored copy or a ``CreateTime`` topic.
    broker_times: bool = True
    raw_end: int | None = None


async def _first_headers(consumer: AIOKafkaConsumer, tp: TopicPartition, begin: int, end: int,
                         deadline: float) -> Any:
    """The first committed record at or after ``begin`` (None when there is none below
    ``end``)."""
    loop = asyncio.get_running_loop()
    consumer.seek(tp, begin)
    while await consumer.position(tp) < end:
        if loop.time() > deadline:
            raise TimeoutError(f"reading {tp.topic}: no record found from {begin} to {end}")
        batch = await consumer.getmany(tp, timeout_ms=500, max_records=1)
        for m in batch.get(tp, []):
            if m.offset < end:
                return m
    return None


def _site_records(topic: str, raw: list[Any]) -> tuple[list[tuple[int, int, bytes]], int | None]:
    """A mirrored copy's records with their site offsets (in the copy's order, which is the
    site's), and the log start the first one carries. A record copied twice (same site offset,
    same value and time: an at-least-once mirror after a crash) is kept once; a second record
    with the same or a lower site offset and different bytes, or one without the header among
    copied records, is a :class:`MirrorCopyError`."""
    out: list[tuple[int, int, bytes]] = []
    seen: dict[int, tuple[int, bytes]] = {}
    log_start: int | None = None
    for m in raw:
        site = mirror_header(m.headers, MIRROR_OFFSET_HEADER)
        if site is None:
            raise MirrorCopyError(f"{topic}: the record at offset {m.offset} of this copy carries "
                                  f"no {MIRROR_OFFSET_HEADER} header: it was not written by the "
                                  "mirror (a mirrored copy is read-only)")
        if not out:
            log_start = mirror_header(m.headers, MIRROR_LOG_START_HEADER)
        value = m.value or b""
        if out and site <= out[-1][0]:
            if seen.get(site) == (m.timestamp, value):
                continue  # the same record copied again
            raise MirrorCopyError(f"{topic}: the record at offset {m.offset} of this copy names "
                                  f"site offset {site}, after {out[-1][0]}, with other bytes")
        out.append((site, m.timestamp, value))
        seen[site] = (m.timestamp, value)
    return out, log_start


async def read_partition(consumer: AIOKafkaConsumer, topic: str, *, start: int | None = None,
                         timeout: float = 30.0) -> PartitionRead:
    """Read partition 0 of ``topic`` with ``consumer`` (started, read_committed) from ``start``
    (default: the log start) up to its last stable offset at the time of the call.
    ``TimeoutError`` when the read does not get there within ``timeout`` seconds. The one
    partition reader of the project: replay, why, verify and the ledger all read through it.

    A copy that ``fx mirror`` made on the fleet is read in the site's offsets (see
    :class:`PartitionRead`): ``start`` is then a site offset, and the copy is read from its
    beginning and cut there (the copy's own offsets differ from the site's: the site's
    transaction markers are not copied and the mirror's own transactions add markers)."""
    tp = TopicPartition(topic, 0)
    consumer.assign([tp])
    begin = (await consumer.beginning_offsets([tp]))[tp]
    end = (await consumer.end_offsets([tp]))[tp]
    read = PartitionRead(begin=begin, end=end)
    if begin >= end:
        return read
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    first = begin if start is None else max(begin, start)
    if first > begin:
        # is this a mirrored copy? (then ``start`` is a site offset: read from the beginning)
        head = await _first_headers(consumer, tp, begin, end, deadline)
        if head is not None and mirror_header(head.headers, MIRROR_OFFSET_HEADER) is not None:
            first = begin
    if first >= end:
        return read
    consumer.seek(tp, first)
    raw: list[Any] = []  # a mirrored copy's records, kept whole until their site offsets are read
    mirrored: bool | None = None
    while await consumer.position(tp) < end:
        if loop.time() > deadline:
            raise TimeoutError(f"reading {topic}: stuck at {await consumer.position(tp)} "
                               f"of {end}")
        batch = [m for m in (await consumer.getmany(tp, timeout_ms=500)).get(tp, [])
                 if m.offset < end]
        if batch and mirrored is None:
            mirrored = mirror_header(batch[0].headers, MIRROR_OFFSET_HEADER) is not None
        if mirrored:
            raw.extend(batch)
        else:
            read.records.extend((m.offset, m.timestamp, m.value or b"") for m in batch)
            if any(m.timestamp_type != 1 for m in batch):
                read.broker_times = False
    if not mirrored:
        return read
    records, log_start = _site_records(topic, raw)
    site_begin = records[0][0] if log_start is None else min(log_start, records[0][0])
    site_end = records[-1][0] + 1
    return PartitionRead(
        begin=site_begin, end=max(site_end, start or 0),
        records=[r for r in records if start is None or r[0] >= start],
        mirrored=True, raw_end=end, broker_times=False)
