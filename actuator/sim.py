"""A simulated valve or gate: a real ``pymodbus`` Modbus TCP server with a block of holding
registers, for tests and the demo (``fx actuator device``).

It is a device, not a mock of one: the gateway speaks Modbus TCP to it over a socket, exactly as
to a PLC. Tests read its registers directly (:meth:`SimulatedDevice.registers`, from the
server's own datastore) and count the writes each register received
(:meth:`SimulatedDevice.writes_to`), so "written exactly once" is checked on the device itself.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Coroutine
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, TypeVar

from pymodbus.constants import ExcCodes
from pymodbus.server import ModbusTcpServer
from pymodbus.simulator import DataType, SimData, SimDevice

__all__ = ["SimulatedDevice", "Write"]

_T = TypeVar("_T")

#: Modbus function codes that write holding registers (single, multiple).
_WRITES = frozenset({6, 16})


@dataclass(frozen=True)
class Write:
    """One write the device received: when (its monotonic clock), where, what."""

    at: float
    address: int
    values: tuple[int, ...]


class SimulatedDevice:
    """``registers`` holding registers at addresses ``0..registers-1``, all ``initial``.

    :meth:`start` serves it on ``host:port`` (0: a free port) from a thread of its own (its own
    event loop), so a test's loop blocking on a subprocess never stalls the device; :meth:`serve`
    runs it in the caller's loop instead (the ``fx actuator device`` command)."""

    def __init__(self, *, host: str = "127.0.0.1", port: int = 0, registers: int = 16,
                 unit: int = 1, initial: int = 0) -> None:
        self.host, self.port, self.unit = host, port, unit
        #: while set, a write is never answered nor applied (a device that hangs on writes;
        #: reads are still answered): the gateway's write times out in doubt
        self.stall_writes = False
        self.count, self.initial = registers, initial
        self._writes: list[Write] = []
        self._lock = threading.Lock()
        self._server: ModbusTcpServer | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    async def _action(self, function_code: int, start: int, address: int, count: int,
                      registers: list[int], values: list[int] | list[bool] | None
                      ) -> ExcCodes | None:
        if function_code in _WRITES and values is not None:
            if self.stall_writes:
                # never answered; the client gives up and closes the connection, which
                # cancels this request before the value is applied
                await asyncio.sleep(3600)
            with self._lock:
                self._writes.append(Write(time.monotonic(), address,
                                          tuple(int(v) for v in values)))
        return None

    async def _listen(self) -> int:
        device = SimDevice(id=self.unit, action=self._action, simdata=[SimData(
            0, count=self.count, values=self.initial, datatype=DataType.REGISTERS)])
        self._server = ModbusTcpServer(device, address=(self.host, self.port))
        await self._server.serve_forever(background=True)
        transport: Any = self._server.transport
        self.port = int(transport.sockets[0].getsockname()[1])
        return self.port

    async def serve(self, stop: asyncio.Event) -> None:
        """Serve in the running loop until ``stop`` is set."""
        self._loop = asyncio.get_running_loop()
        await self._listen()
        try:
            await stop.wait()
        finally:
            assert self._server is not None
            await self._server.shutdown()  # type: ignore[no-untyped-call]

    def start(self) -> int:
        """Serve from a thread of its own; returns the port."""
        ready: Future[int] = Future()

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            try:
                ready.set_result(loop.run_until_complete(self._listen()))
            except BaseException as exc:
                ready.set_exception(exc)
                loop.close()
                return
            loop.run_forever()
            loop.close()

        self._thread = threading.Thread(target=run, name=f"modbus-sim-{self.port}", daemon=True)
        self._thread.start()
        return ready.result(timeout=10)

    def stop(self) -> None:
        """Stop a device started with :meth:`start`."""
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        if self._server is not None:
            self._call(self._server.shutdown())  # type: ignore[no-untyped-call]
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        self._thread = None

    def __enter__(self) -> SimulatedDevice:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _call(self, coro: Coroutine[Any, Any, _T]) -> _T:
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout=10)

    def registers(self) -> list[int]:
        """Every holding register's value, read from the server's own datastore."""
        assert self._server is not None
        values = self._call(self._server.async_getValues(self.unit, 3, 0, self.count))
        return [int(v) for v in values]

    def register(self, address: int) -> int:
        """One holding register's value."""
        return self.registers()[address]

    def writes(self) -> list[Write]:
        """Every write received, in order."""
        with self._lock:
            return list(self._writes)

    def writes_to(self, address: int) -> list[Write]:
        """The writes that reached ``address``."""
        return [w for w in self.writes()
                if w.address <= address < w.address + len(w.values)]
