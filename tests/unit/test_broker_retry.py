"""The pure parts of riding out a broker restart: which errors are retried, the backoff, and
whether a restarting lease holder keeps its epoch, claims anew or stays down."""

from __future__ import annotations

import pytest
from aiokafka.errors import (
    CommitFailedError,
    InvalidProducerEpoch,
    KafkaConnectionError,
    KafkaTimeoutError,
    NodeNotReadyError,
    NotLeaderForPartitionError,
    OutOfOrderSequenceNumber,
    ProducerFenced,
    RecordTooLargeError,
    RequestTimedOutError,
    UnknownProducerId,
)

from broker_schema import ClaimRecord
from fx_kafka.retry import JITTER, backoff_s, batch_lost, broker_unavailable, jittered_backoff_s
from workload_sdk import Replaced, check_restart, rejoin_epoch

HASH = "sha256:" + "ab" * 32


@pytest.mark.parametrize("exc", [KafkaConnectionError(), KafkaTimeoutError(), NodeNotReadyError(),
                                 RequestTimedOutError(), NotLeaderForPartitionError()])
def test_outage_errors_are_retried(exc: Exception) -> None:
    assert broker_unavailable(exc) and batch_lost(exc)


@pytest.mark.parametrize("exc", [ProducerFenced(), InvalidProducerEpoch(), RecordTooLargeError(),
                                 CommitFailedError(), ValueError("not kafka")])
def test_fencing_and_real_failures_are_not(exc: Exception) -> None:
    assert not broker_unavailable(exc) and not batch_lost(exc)


def test_a_broken_sequence_needs_a_new_producer_but_is_no_outage() -> None:
    for exc in (OutOfOrderSequenceNumber(), UnknownProducerId()):
        assert batch_lost(exc) and not broker_unavailable(exc)


def test_backoff_doubles_up_to_the_cap() -> None:
    assert [backoff_s(a) for a in range(0, 8)] == [0.0, 0.2, 0.4, 0.8, 1.6, 3.2, 5.0, 5.0]
    assert backoff_s(10_000, cap_s=7.0) == 7.0


def test_jitter_takes_a_drawn_share_off_each_wait() -> None:
    # u is drawn by the caller: the schedule itself is pure
    assert backoff_s(3, jitter=0.5, u=0.0) == pytest.approx(0.8)
    assert backoff_s(3, jitter=0.5, u=1.0) == pytest.approx(0.4)
    assert backoff_s(3, jitter=0.5, u=0.5) == pytest.approx(0.6)
    assert backoff_s(0, jitter=0.5, u=0.3) == 0.0
    with pytest.raises(ValueError):
        backoff_s(1, jitter=1.5, u=0.1)
    draws = iter([0.0, 0.999, 0.25])
    waits = [jittered_backoff_s(20, base_s=0.5, cap_s=10.0, rng=lambda: next(draws))
             for _ in range(3)]
    assert waits == pytest.approx([10.0, 5.005, 8.75])
    # many clients that lost the broker together spread over [cap/2, cap], never past the cap
    spread = [jittered_backoff_s(9) for _ in range(500)]
    assert all(JITTER * 5.0 <= w <= 5.0 for w in spread) and max(spread) - min(spread) > 1.0
    # and the schedule grows: the n-th wait is at least half the un-jittered one
    assert all(jittered_backoff_s(n) >= backoff_s(n) / 2 for n in range(1, 12))


def _claim(epoch: int, holder: str, spec_offset: int = 0) -> ClaimRecord:
    return ClaimRecord(workload_id="w", epoch=epoch, holder_id=holder, spec_hash=HASH,
                       spec_offset=spec_offset)


def test_a_holder_whose_claim_is_still_the_latest_keeps_its_epoch() -> None:
    claims = [_claim(1, "a"), _claim(2, "me")]
    check_restart(claims, epoch=2, holder_id="me", fenced=True)
    assert rejoin_epoch(claims, epoch=2, holder_id="me", spec_offset=0) == 2


def test_a_new_spec_or_an_uncommitted_claim_means_claiming_anew() -> None:
    assert rejoin_epoch([_claim(2, "me")], epoch=2, holder_id="me", spec_offset=5) is None
    # its own claim never committed (the broker went down first): the highest is the old one
    check_restart([_claim(1, "a")], epoch=2, holder_id="me", fenced=False)
    assert rejoin_epoch([_claim(1, "a")], epoch=2, holder_id="me", spec_offset=0) is None
    assert rejoin_epoch([], epoch=1, holder_id="me", spec_offset=0) is None


def test_a_higher_claim_means_replaced() -> None:
    claims = [_claim(2, "me"), _claim(3, "b")]
    with pytest.raises(Replaced):
        check_restart(claims, epoch=2, holder_id="me", fenced=False)
    with pytest.raises(Replaced):
        rejoin_epoch(claims, epoch=2, holder_id="me", spec_offset=0)


def test_fenced_without_a_claim_of_its_own_on_top_means_replaced() -> None:
    with pytest.raises(Replaced):
        check_restart([_claim(1, "a")], epoch=2, holder_id="me", fenced=True)
    with pytest.raises(Replaced):
        check_restart([_claim(2, "other")], epoch=2, holder_id="me", fenced=True)
