"""Errors a node (the executor, the actuator gateway) turns into ``error`` outcomes.

Every failure that can reach a response carries an :data:`~broker_schema.ErrorCode` from the wire
contract's closed set; retriability is data (:data:`broker_schema.ERROR_RETRIABLE`), not a class
hierarchy. This module imports only the wire contract, so engines and the integer engine's adapter
can raise these without pulling in the service.
"""

from __future__ import annotations

from typing import get_args

from broker_schema.records import ERROR_RETRIABLE, ErrorCode

__all__ = ["EngineError", "ModelError", "OutcomeError"]

_CODES = frozenset(get_args(ErrorCode))


class OutcomeError(Exception):
    """An error that becomes an ``error`` outcome with ``code`` (one of :data:`ErrorCode`)."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        if code not in _CODES:  # a bug in the caller: never put an unknown code on the wire
            raise ValueError(f"unknown error code {code!r}")
        super().__init__(f"{code}: {message}")
        self.code: ErrorCode = code
        self.message = message[:4096]

    @property
    def retriable(self) -> bool:
        """Whether reissuing the same request can succeed."""
        return ERROR_RETRIABLE[self.code]


class EngineError(OutcomeError):
    """Raised by an engine: bad input (``input_invalid``), bad parameters (``params_invalid``),
    or a failure while running (``engine_error``)."""


class ModelError(OutcomeError):
    """Raised by the model store: ``model_unknown`` or ``model_hash_mismatch``."""
