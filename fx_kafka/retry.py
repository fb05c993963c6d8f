"""Telling a broker outage from a real failure, and how long to wait before trying again (pure).

While a broker restarts, aiokafka retries most requests by itself (an idempotent or
transactional producer never expires a batch; commits and fetches retry), but some calls still
fail: a send that waits past ``request_timeout_ms`` for metadata or buffer space
(:class:`~aiokafka.errors.KafkaTimeoutError`), a client started while the broker is down
(:class:`~aiokafka.errors.KafkaConnectionError`), a request to a node not connected yet. Those are
:func:`broker_unavailable`: trying the same thing again later is right. A fenced or unauthorised
producer never is (:data:`NEVER_RETRY`): a newer producer owns the transactional id, and retrying
would only hide that.
"""

from __future__ import annotations

from aiokafka.errors import (
    InvalidProducerEpoch,
    KafkaConnectionError,
    KafkaError,
    KafkaTimeoutError,
    KafkaUnavailableError,
    NodeNotReadyError,
    OutOfOrderSequenceNumber,
    ProducerFenced,
    RequestTimedOutError,
    TransactionalIdAuthorizationFailed,
    UnknownProducerId,
)

__all__ = ["NEVER_RETRY", "OUTAGE", "backoff_s", "batch_lost", "broker_unavailable"]

#: Errors that end a producer for good (fencing, authorisation): never retried.
NEVER_RETRY: tuple[type[BaseException], ...] = (
    ProducerFenced, InvalidProducerEpoch, TransactionalIdAuthorizationFailed,
)
#: What a broker that is down or restarting looks like to a client, retriable flag or not.
OUTAGE: tuple[type[BaseException], ...] = (
    KafkaConnectionError, KafkaTimeoutError, KafkaUnavailableError, NodeNotReadyError,
    RequestTimedOutError,
)


def broker_unavailable(exc: BaseException) -> bool:
    """True when ``exc`` says the broker cannot be reached or answer right now (retry later);
    False for fencing and for every error that is not Kafka's."""
    if isinstance(exc, NEVER_RETRY):
        return False
    if isinstance(exc, OUTAGE):
        return True
    return isinstance(exc, KafkaError) and bool(exc.retriable)


def batch_lost(exc: BaseException) -> bool:
    """True when a batch an idempotent producer had accepted failed in a way that leaves the
    producer unable to go on, so it must be replaced by a new one (a new producer id) before the
    record is sent again: the broker was away longer than ``request_timeout_ms`` while the
    partition had no leader (aiokafka then fails the batch, yet keeps its sequence number, so
    every later batch to that partition is ``OutOfOrderSequenceNumber``), or the broker no longer
    knows the producer. Fencing is never this."""
    if isinstance(exc, NEVER_RETRY):
        return False
    return isinstance(exc, OutOfOrderSequenceNumber | UnknownProducerId) or broker_unavailable(exc)


def backoff_s(attempt: int, *, base_s: float = 0.2, cap_s: float = 5.0) -> float:
    """The wait before retry number ``attempt`` (1, 2, ...): ``base_s`` doubling up to ``cap_s``.
    No jitter: one client per workload (the holder) or per node (the executor) retries, so there
    is no herd to spread."""
    if attempt < 1:
        return 0.0
    return float(min(cap_s, base_s * 2 ** min(attempt - 1, 30)))
