"""One JoinGroup request per rejoin, carrying every assignor's protocol (aiokafka 0.14.0's fix).

aiokafka 0.14.0's ``CoordinatorGroupRebalance.perform_group_join`` sends its JoinGroup request
inside the loop over the consumer's assignors (upstream pull request aio-libs/aiokafka#1168,
open): a consumer with two assignors (routing by model's ``fx-model`` and the ``roundrobin``
fallback, ``fx_node.routing``) sends, at every rejoin, one JoinGroup with ``[fx-model]`` and,
once that one's join phase has ended, a second with ``[fx-model, roundrobin]``. The second
comes from a member the coordinator already knows, with other protocol metadata, while the
group awaits its SyncGroups, so the coordinator starts a new rebalance and refuses every
SyncGroup of the generation just formed; each member then rejoins, again with two requests.
The group settles only when by chance every member's second request lands in the same join
phase: measured on the shared test broker, 2 of 3 runs of
``tests/integration/executor/test_routing.py`` never settled (about 500 rejoins in 90 s, the
members split into alternating generations), and every rejoin was two JoinGroup requests.

:func:`install` replaces that method, for aiokafka 0.14.0 only (the version pyproject pins),
with the same method minus the bug: the protocols of all assignors in one request (the
KIP-394 second request, with the member id the broker gave, kept). Consumers with one
assignor send what they sent before. :func:`fx_kafka.client.make_consumer` installs it.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import aiokafka
import aiokafka.errors as errors
from aiokafka.consumer import group_coordinator
from aiokafka.coordinator.protocol import ConsumerProtocol
from aiokafka.protocol.group import JoinGroupRequest

__all__ = ["FIXED_VERSIONS", "install", "installed", "perform_group_join"]

log = logging.getLogger("aiokafka.consumer.group_coordinator")

#: The aiokafka versions whose ``perform_group_join`` this replaces (checked against the source
#: they ship); another version keeps its own, and ``tests/unit/test_group_join.py`` says so.
FIXED_VERSIONS = frozenset({"0.14.0"})


async def perform_group_join(self: Any) -> tuple[str, bytes] | None:
    """Join the group and return ``(protocol, assignment bytes)`` for the next generation, or
    None (rejoin later): aiokafka 0.14.0's method with every assignor's protocol sent in one
    JoinGroup request. ``self``: the ``CoordinatorGroupRebalance``."""
    log.info("(Re-)joining group %s", self.group_id)
    topics = self._subscription.topics
    metadata_list = []
    for assignor in self._assignors:
        metadata = assignor.metadata(topics)
        if not isinstance(metadata, bytes):
            metadata = metadata.encode()
        metadata_list.append((assignor.name, metadata))
    # KIP-394: a first join without a member id is answered MEMBER_ID_REQUIRED and sent again
    # with the id the broker gave
    while True:
        request = JoinGroupRequest(
            self.group_id, self._session_timeout_ms, self._rebalance_timeout_ms,
            self._coordinator.member_id, self._coordinator._group_instance_id,
            ConsumerProtocol.PROTOCOL_TYPE, metadata_list)
        log.debug("Sending JoinGroup (%s) to coordinator %s", request, self.coordinator_id)
        try:
            response = await self._coordinator._send_req(request)
        except errors.KafkaError:
            # a connection error: the backoff is the coordinator lookup's
            return None
        if not self._subscription.active:
            # the subscription changed: ignore the response, join again
            return None
        error_type = errors.for_code(response.error_code)
        if error_type is not errors.MemberIdRequired:
            break
        self._coordinator.member_id = response.member_id

    if error_type is errors.NoError:
        log.debug("Join group response %s", response)
        self._coordinator.member_id = response.member_id
        self._coordinator.generation = response.generation_id
        protocol = response.group_protocol
        log.info("Joined group '%s' (generation %s) with member_id %s", self.group_id,
                 response.generation_id, response.member_id)
        if response.leader_id == response.member_id:
            log.info("Elected group leader -- performing partition assignments using %s",
                     protocol)
            assignment_bytes = await self._on_join_leader(response)
        else:
            assignment_bytes = await self._on_join_follower()
        if assignment_bytes is None:
            return None
        return (protocol, assignment_bytes)
    if error_type is errors.GroupLoadInProgressError:
        log.debug("Attempt to join group %s rejected since coordinator %s is loading the "
                  "group.", self.group_id, self.coordinator_id)
        await asyncio.sleep(self._retry_backoff_ms / 1000)
    elif error_type is errors.UnknownMemberIdError:
        self._coordinator.reset_generation()
        log.debug("Attempt to join group %s failed due to unknown member id", self.group_id)
    elif error_type in (errors.GroupCoordinatorNotAvailableError,
                        errors.NotCoordinatorForGroupError):
        err = error_type()
        self._coordinator.coordinator_dead()
        log.debug("Attempt to join group %s failed due to obsolete coordinator information: "
                  "%s", self.group_id, err)
    elif error_type in (errors.InconsistentGroupProtocolError,
                        errors.InvalidSessionTimeoutError, errors.InvalidGroupIdError):
        err = error_type()
        log.error("Attempt to join group failed due to fatal error: %s", err)
        raise err
    elif error_type is errors.GroupAuthorizationFailedError:
        raise error_type(self.group_id)
    else:
        err = error_type()
        log.error("Unexpected error in join group '%s' response: %s", self.group_id, err)
        raise errors.KafkaError(repr(err))
    return None


def installed() -> bool:
    """Whether aiokafka's consumers join with :func:`perform_group_join`."""
    return group_coordinator.CoordinatorGroupRebalance.perform_group_join is perform_group_join


def install() -> bool:
    """Make aiokafka's consumers join with :func:`perform_group_join` when the installed
    aiokafka is one of :data:`FIXED_VERSIONS` (idempotent); whether it is in place."""
    if not installed() and aiokafka.__version__ in FIXED_VERSIONS:
        group_coordinator.CoordinatorGroupRebalance.perform_group_join = perform_group_join
    return installed()
