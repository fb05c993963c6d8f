"""Telling a broker outage from a real failure, and how long to wait before trying again (pure;
:func:`jittered_backoff_s` draws the jitter).

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

import random
from collections.abc import Callable

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

__all__ = ["JITTER", "NEVER_RETRY", "OUTAGE", "backoff_s", "batch_lost", "broker_unavailable",
           "jittered_backoff_s"]

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


def backoff_s(attempt: int, *, base_s: float = 0.2, cap_s: float = 5.0, jitter: float = 0.0,
              u: float = 0.0) -> float:
    """The wait before retry number ``attempt`` (1, 2, ...): ``base_s`` doubling up to ``cap_s``
    (``d``), less a random share of it: ``d * (1 - jitter * u)`` for ``u`` in ``[0, 1)`` (the
    caller draws it: this function stays pure). ``jitter`` 0 (the default): exactly ``d``;
    0.5: somewhere in ``[d/2, d]``, so clients that lost the same broker at the same moment do
    not all come back in step. 0 before the first retry. The one backoff schedule of the project
    (:func:`jittered_backoff_s` draws ``u``)."""
    if attempt < 1:
        return 0.0
    if not 0.0 <= jitter <= 1.0 or not 0.0 <= u <= 1.0:
        raise ValueError(f"jitter {jitter} and u {u} must be in [0, 1]")
    full = float(min(cap_s, base_s * 2 ** min(attempt - 1, 30)))
    return full * (1.0 - jitter * u)


#: the share of each wait drawn at random by :func:`jittered_backoff_s`
JITTER = 0.5


def jittered_backoff_s(attempt: int, *, base_s: float = 0.2, cap_s: float = 5.0,
                       rng: Callable[[], float] = random.random) -> float:
    """:func:`backoff_s` with :data:`JITTER` and ``u`` drawn from ``rng``: what the services'
    reconnect loops wait (broker and device)."""
    return backoff_s(attempt, base_s=base_s, cap_s=cap_s, jitter=JITTER, u=rng())
