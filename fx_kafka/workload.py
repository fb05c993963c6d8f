"""Topic set-up for workloads and the system topics, with the configs the design relies on."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any, Final, Literal

from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import KafkaError

from broker_schema import topics
from fx_kafka.client import create_topics, make_admin
from fx_kafka.errors import RetentionTooShortError, TopicConfigError
from fx_kafka.retry import backoff_s, broker_unavailable

#: Per-workload topics use the broker's append time as the record timestamp: deadlines, timeouts
#: and `--at TIME` look-ups are judged against it, never against a producer's clock. They have
#: no time or size retention: the broker never deletes a workload record by itself; records
#: older than the spec's audit horizon are deleted by ``fx trim`` (DeleteRecords), which also
#: keeps what a resume or replay from the latest snapshot needs (docs/operations.md).
WORKLOAD_TOPIC_CONFIGS = {
    "message.timestamp.type": "LogAppendTime",
    "retention.ms": "-1",
    "retention.bytes": "-1",
}

#: ``audit_horizon_ms`` for a check made before the spec is known: only ``.spec`` and
#: ``.claims`` (never trimmed, so any retention is too short) are checked for retention.
HORIZON_UNKNOWN: Final = "unknown"

HorizonArg = int | None | Literal["unknown"]


async def ensure_workload_topics(bootstrap: str, workload_id: str, *,
                                 audit_horizon_ms: HorizonArg = HORIZON_UNKNOWN) -> list[str]:
    """Create ``wl.<id>.in/.spec/.claims/.out/.resp/.merge`` (one partition each, append-time
    timestamps, no retention) if they do not exist yet, check them
    (:func:`check_workload_topics`), and return their names."""
    names = topics.all_topics(workload_id)
    await create_topics(bootstrap, names, partitions=1, configs=WORKLOAD_TOPIC_CONFIGS)
    await check_workload_topics(bootstrap, workload_id, audit_horizon_ms=audit_horizon_ms)
    return names


async def ensure_shadow_topics(bootstrap: str, workload_id: str, eval_id: str) -> list[str]:
    """Create a shadow evaluation's ``wl.<id>.shadow.<eval>.eval/.out/.resp`` (one partition
    each, append-time timestamps, no retention) if they do not exist yet; return their names."""
    names = [topics.shadow_stream(workload_id, eval_id, s) for s in topics.SHADOW_STREAMS]
    await create_topics(bootstrap, names, partitions=1, configs=WORKLOAD_TOPIC_CONFIGS)
    return names


#: DescribeConfigs error for a topic the answering broker does not know (yet).
_UNKNOWN_TOPIC = 3


def describe_backoff_s(attempt: int) -> float:
    """The wait before describe retry ``attempt`` (1, 2, ...): 50 ms doubling up to 1 s."""
    return backoff_s(attempt, base_s=0.05, cap_s=1.0)


def sort_described(responses: list[Any]) -> tuple[dict[str, dict[str, str]],
                                                   list[tuple[str, str]]]:
    """DescribeConfigs responses as ``({topic: {key: value}}, [(unknown topic, message)])``:
    a topic the broker does not know (yet) is asked about again by :func:`topic_configs`;
    any other per-topic error is a :class:`TopicConfigError` at once. Pure."""
    out: dict[str, dict[str, str]] = {}
    unknown: list[tuple[str, str]] = []
    for response in responses:
        for error_code, message, _type, name, entries in response.resources:
            if error_code == _UNKNOWN_TOPIC:
                unknown.append((name, message))
            elif error_code:
                raise TopicConfigError(
                    f"describing topic {name!r}: error {error_code} {message}")
            else:
                out[name] = {entry[0]: entry[1] for entry in entries}
    return out, unknown


async def topic_configs(bootstrap: str, names: list[str], *,
                        settle_s: float = 30.0) -> dict[str, dict[str, str]]:
    """The effective configs of ``names`` (``{topic: {key: value}}``), by DescribeConfigs.

    A topic created a moment ago may not be in the answering broker's metadata yet (seen on a
    young broker under load, and on a cluster): an unknown topic, or a broker that cannot be
    reached meanwhile, is asked about again with backoff (:func:`describe_backoff_s`) for up
    to ``settle_s`` seconds before it is a :class:`TopicConfigError`. This is the one place
    topic configs are described."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + settle_s
    out: dict[str, dict[str, str]] = {}
    wanted = list(dict.fromkeys(names))
    attempt = 0
    admin = make_admin(bootstrap)
    try:
        await admin.start()
        while True:
            attempt += 1
            try:
                responses = await admin.describe_configs(
                    [ConfigResource(ConfigResourceType.TOPIC, name, None) for name in wanted])
            except KafkaError as exc:
                if not broker_unavailable(exc) or loop.time() >= deadline:
                    raise
                await asyncio.sleep(describe_backoff_s(attempt))
                continue
            found, unknown = sort_described(responses)
            out.update(found)
            if not unknown:
                return out
            if loop.time() >= deadline:
                name, message = unknown[0]
                raise TopicConfigError(f"describing topic {name!r}: error {_UNKNOWN_TOPIC} "
                                       f"(unknown topic) {message}, still after {settle_s} s")
            wanted = [name for name, _ in unknown]
            await asyncio.sleep(describe_backoff_s(attempt))
    finally:
        await admin.close()


async def check_workload_topics(bootstrap: str, workload_id: str, *,
                                audit_horizon_ms: HorizonArg = HORIZON_UNKNOWN) -> None:
    """Raise :class:`TopicConfigError` if a workload topic does not use the broker's append
    time (a topic auto-created by a producer's first write on a broker whose default is
    ``CreateTime``): deadlines would then be judged on producer clocks.

    Raise :class:`RetentionTooShortError` (a :class:`TopicConfigError`) if the broker would
    delete records the workload must keep (see :func:`retention_problems`): ``audit_horizon_ms``
    is the spec's horizon (None: forever), or :data:`HORIZON_UNKNOWN` before the spec is known
    (then only ``.spec`` and ``.claims`` are checked for retention).
    """
    configs = await topic_configs(bootstrap, topics.all_topics(workload_id))
    wrong = sorted(name for name, cfg in configs.items()
                   if cfg.get("message.timestamp.type") != "LogAppendTime")
    if wrong:
        raise TopicConfigError(
            f"{', '.join(wrong)}: message.timestamp.type is not LogAppendTime, so record times "
            "would be producer clocks; fix with `kafka-configs --alter --entity-type topics "
            "--entity-name TOPIC --add-config message.timestamp.type=LogAppendTime`, or set the "
            "broker default log.message.timestamp.type=LogAppendTime")
    problems = retention_problems(workload_id, configs, audit_horizon_ms)
    if problems:
        raise RetentionTooShortError(retention_message(problems, audit_horizon_ms),
                                     problems=problems, audit_horizon_ms=audit_horizon_ms)


def _as_int(value: str | None) -> int | None:
    try:
        return None if value is None else int(value)
    except ValueError:
        return None


def retention_problems(workload_id: str, configs: Mapping[str, Mapping[str, str]],
                       audit_horizon_ms: HorizonArg) -> list[tuple[str, str, int]]:
    """The retention settings of a workload's topics that would let the broker delete records
    the workload must keep, as ``(topic, key, value)``; empty when there are none. Pure.

    - ``.spec`` and ``.claims`` are never trimmed (every claim and spec stays auditable), so any
      ``retention.ms`` or ``retention.bytes`` other than -1 is a problem.
    - ``.in``, ``.out``, ``.resp`` and ``.merge``: a ``retention.ms`` shorter than the audit
      horizon (any finite one when the horizon is None, forever), and any finite
      ``retention.bytes`` (size retention deletes records of any age). Not checked while the
      horizon is :data:`HORIZON_UNKNOWN`.

    A missing or unparsable value is not judged.
    """
    keep_all = {topics.spec(workload_id), topics.claims(workload_id)}
    problems: list[tuple[str, str, int]] = []
    for name in topics.all_topics(workload_id):
        cfg = configs.get(name, {})
        if name not in keep_all and audit_horizon_ms == HORIZON_UNKNOWN:
            continue
        ms = _as_int(cfg.get("retention.ms"))
        if ms is not None and ms >= 0 and (
                name in keep_all or audit_horizon_ms is None
                or (isinstance(audit_horizon_ms, int) and ms < audit_horizon_ms)):
            problems.append((name, "retention.ms", ms))
        size = _as_int(cfg.get("retention.bytes"))
        if size is not None and size >= 0:
            problems.append((name, "retention.bytes", size))
    return problems


def retention_message(problems: list[tuple[str, str, int]], audit_horizon_ms: HorizonArg) -> str:
    """The operator's message for :func:`retention_problems`' findings: what, why, how to fix."""
    horizon = ("forever (the spec sets no audit_horizon_ms)" if audit_horizon_ms is None
               else "not known yet (no spec read)" if audit_horizon_ms == HORIZON_UNKNOWN
               else f"{audit_horizon_ms} ms")
    lines = [f"workload topics would lose records the log must keep (audit horizon: {horizon}):"]
    for name, key, value in problems:
        why = ("this topic is never trimmed" if name.endswith((".spec", ".claims"))
               else "size retention deletes records of any age" if key == "retention.bytes"
               else "shorter than the audit horizon")
        lines.append(f"  {name}: {key}={value} ({why})")
    lines.append(
        "fix: `kafka-configs --bootstrap-server HOST:PORT --alter --entity-type topics "
        "--entity-name TOPIC --add-config retention.ms=-1,retention.bytes=-1` for each topic "
        "(or write a spec whose --audit-horizon-ms is no longer than the retention); records "
        "older than the horizon are deleted by `fx trim`, which also keeps what a resume needs")
    return "\n".join(lines)


async def ensure_alarms_topic(bootstrap: str) -> None:
    """Create ``sys.alarms`` (one partition, no retention: alarms are history) if missing: the
    lease holder writes an alarm in the transaction of an at-most-once ``unknown``, and a
    transaction to a topic that does not exist would fail."""
    await create_topics(bootstrap, [topics.ALARMS], partitions=1,
                        configs={"retention.ms": "-1", "retention.bytes": "-1"})


async def ensure_rejects_topic(bootstrap: str) -> None:
    """Create ``sys.rejects`` if missing: the lease holder writes a tick its epoch's holder did
    not write there, in a transaction (which a missing topic would fail)."""
    await create_topics(bootstrap, [topics.REJECTS])


async def ensure_system_topics(bootstrap: str) -> None:
    """Create ``sys.facts``, ``sys.chunks`` and ``sys.modules`` (compacted), ``sys.rejects``
    and ``sys.alarms`` (one partition, no retention: alarms are history) if missing."""
    await create_topics(bootstrap, [topics.FACTS, topics.CHUNKS, topics.MODULES],
                        compacted=True)
    await ensure_rejects_topic(bootstrap)
    await ensure_alarms_topic(bootstrap)
