"""Kafka plumbing for ninelives-fx: a local Apache Kafka broker without Docker, a broker chooser
for tests, and small aiokafka helpers with the project's defaults."""

from fx_kafka._sync import run_sync
from fx_kafka.client import (
    FRAME_CAP_BYTES,
    create_topics,
    make_admin,
    make_consumer,
    make_producer,
    wait_ready,
)
from fx_kafka.errors import (
    BrokerAlreadyRunningError,
    BrokerError,
    BrokerNotReadyError,
    BrokerStartError,
    FetchError,
    JavaNotFoundError,
    NoBrokerError,
)
from fx_kafka.local import (
    DEFAULT_KAFKA_VERSION,
    BrokerState,
    BrokerStatus,
    LocalKafka,
)
from fx_kafka.security import ClientSecurity, use_security
from fx_kafka.testing import broker_for_tests, kafka_for_tests

__all__ = [
    "DEFAULT_KAFKA_VERSION",
    "FRAME_CAP_BYTES",
    "BrokerAlreadyRunningError",
    "BrokerError",
    "BrokerNotReadyError",
    "BrokerStartError",
    "BrokerState",
    "BrokerStatus",
    "ClientSecurity",
    "FetchError",
    "JavaNotFoundError",
    "LocalKafka",
    "NoBrokerError",
    "broker_for_tests",
    "create_topics",
    "kafka_for_tests",
    "make_admin",
    "make_consumer",
    "make_producer",
    "run_sync",
    "use_security",
    "wait_ready",
]
