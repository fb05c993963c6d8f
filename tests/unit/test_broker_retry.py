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
from fx_kafka.retry import backoff_s, batch_lost, broker_unavailable
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
