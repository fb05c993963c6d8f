"""A Modbus TCP device as the gateway sees it: write one holding register, read it back.

Every failure is classified by what it leaves the device in, because that is what the gateway
may say about it:

- ``device_unreachable``: the connection could not be made, so nothing was sent (retriable);
- ``device_refused``: the device answered the write with a Modbus exception: nothing changed;
- :class:`InDoubt`: the write was sent and no answer came (a timeout, a dropped connection):
  the device may or may not have taken it.

The client never re-sends a request by itself (``retries=0``, no automatic reconnect): a second
write of an at-most-once command must never come from the protocol stack.
"""

from __future__ import annotations

import asyncio

from pymodbus.client import AsyncModbusTcpClient
from pymodbus.exceptions import ModbusException

from actuator.config import DeviceConfig
from fx_node.errors import OutcomeError

__all__ = ["InDoubt", "ModbusDevice"]


class InDoubt(Exception):
    """The write was sent and its answer never came: it may have been applied."""


class ModbusDevice:
    """One configured device. Commands to it are serialised by :attr:`lock` (the service holds
    it across the whole command: memory, write, read-back, memory, response)."""

    def __init__(self, name: str, config: DeviceConfig) -> None:
        self.name = name
        self.config = config
        self.lock = asyncio.Lock()
        self._client: AsyncModbusTcpClient | None = None
        #: whether the latest connect or read reached the device (None: not tried yet); the
        #: gateway's readiness (docs/operations.md, "Health")
        self.reachable: bool | None = None

    @property
    def connected(self) -> bool:
        """Whether a connection is open now."""
        return self._client is not None and self._client.connected

    async def connect(self) -> None:
        """Open the connection if it is not open; ``device_unreachable`` if it cannot be."""
        if self.connected:
            return
        self.close()
        cfg = self.config
        client = AsyncModbusTcpClient(cfg.host, port=cfg.port, timeout=cfg.timeout_s,
                                      retries=0, reconnect_delay=0)
        try:
            ok = await asyncio.wait_for(client.connect(), cfg.timeout_s + 1)
        except (TimeoutError, OSError, ModbusException) as exc:
            client.close()
            self.reachable = False
            raise OutcomeError("device_unreachable",
                               f"{self.name} ({cfg.host}:{cfg.port}): {exc!r}") from None
        if not ok or not client.connected:
            client.close()
            self.reachable = False
            raise OutcomeError("device_unreachable",
                               f"{self.name} ({cfg.host}:{cfg.port}) does not answer")
        self._client = client
        self.reachable = True

    async def write(self, register: int, value: int) -> None:
        """Write ``value`` to holding ``register`` (function 6). Raises ``device_unreachable``
        (nothing sent), ``device_refused`` (a Modbus exception answer) or :class:`InDoubt`."""
        await self.connect()
        assert self._client is not None
        try:
            reply = await self._client.write_register(register, value,
                                                      device_id=self.config.unit)
        except (ModbusException, OSError, TimeoutError) as exc:
            self.close()
            raise InDoubt(f"{self.name}: no answer to the write of {value} to register "
                          f"{register}: {exc!r}") from None
        if reply.isError():
            raise OutcomeError("device_refused",
                               f"{self.name} refused {value} for register {register}: "
                               f"Modbus exception {getattr(reply, 'exception_code', '?')}")

    async def read(self, register: int) -> int | None:
        """Holding ``register``'s value (function 3), or None when it cannot be read now."""
        try:
            await self.connect()
            assert self._client is not None
            reply = await self._client.read_holding_registers(register, count=1,
                                                              device_id=self.config.unit)
        except (OutcomeError, ModbusException, OSError, TimeoutError):
            self.close()
            self.reachable = False
            return None
        self.reachable = True
        if reply.isError() or not reply.registers:
            return None
        return int(reply.registers[0])

    def close(self) -> None:
        """Drop the connection (the next command opens a new one)."""
        if self._client is not None:
            self._client.close()
            self._client = None
