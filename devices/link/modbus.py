"""Modbus RTU for PLCs that speak it instead of the edgerun frame protocol (pymodbus, pinned 3.16.1).

edgerun is the Modbus client (master); the PLC is the server (slave) at
``device_id``. A decision is written to a holding register (and optionally a
coil, for PLCs that want a plain accept/reject bit); a trigger is read from a
discrete input. Decision values are the kiosk's verdict codes (docs/kiosk.md,
apps/kiosk/plc.py): 1 pass, 2 reject, 3 review; 0 is a PLC's cleared register
and is never sent. The register gets the code itself, the coil is on for pass
only (a reject or a part for review must not open the accept gate). Transports are the same URLs as the frame link (a tty path with
``?baud=``, ``loop://``, ``socket://``), because pymodbus opens them with
``serial.serial_for_url`` too.

Modbus has its own CRC and the PLC answers every write, so a write that returns
has been applied; it has no journal or sequence numbers, so "exactly once"
holds per write, not across a crash between deciding and writing.

:class:`PlcSimulator` is the reference PLC side for tests and the
``serial-peer --protocol modbus`` demo: a pymodbus server on its own thread that
records every write and serves a trigger input the test sets.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from dataclasses import dataclass, field

from devices.link.transport import LinkDown, SerialURL
from runtime.errors import BadInput, missing

log = logging.getLogger(__name__)

FC_READ_DISCRETE_INPUTS = 2
FC_WRITE_SINGLE_COIL = 5
FC_WRITE_SINGLE_REGISTER = 6
REGISTER_MAX = 0xFFFF
MAX_WRITE_REGISTERS = 123  # the Modbus limit for one write-multiple-registers request
DECISION_PASS, DECISION_REJECT, DECISION_REVIEW = 1, 2, 3  # the register values; same codes as apps/kiosk/plc.py
DECISION_COIL = {DECISION_PASS: True, DECISION_REJECT: False, DECISION_REVIEW: False}  # coil on = accept


@dataclass(frozen=True)
class ModbusMap:
    """Where things live in the PLC's address space (0-based protocol addresses)."""

    device_id: int = 1
    decision_register: int = 0  # holding register the decision value is written to
    decision_coil: int | None = None  # coil set True for pass, False for reject and review (DECISION_COIL); None: not used
    trigger_input: int = 0  # discrete input the PLC raises when a part is ready
    size: int = 16  # registers/bits the simulator serves in each table

    def __post_init__(self) -> None:
        if not 1 <= self.device_id <= 247:
            raise BadInput(f"Modbus device id {self.device_id!r} is invalid; valid: 1..247")
        for name in ("decision_register", "trigger_input"):
            value = getattr(self, name)
            if not 0 <= value < self.size:
                raise BadInput(f"Modbus {name}={value!r} is outside 0..{self.size - 1}")
        if self.decision_coil is not None and not 0 <= self.decision_coil < self.size:
            raise BadInput(f"Modbus decision_coil={self.decision_coil!r} is outside 0..{self.size - 1}")


def _is_register(value: object) -> bool:
    """An integer a 16-bit register holds as is (no bool, float or out-of-range value coerced into one)."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= REGISTER_MAX


def _pymodbus():
    try:
        import pymodbus
        from pymodbus import FramerType
        from pymodbus.client import ModbusSerialClient
    except ModuleNotFoundError:
        raise missing("pymodbus", "modbus") from None
    return pymodbus, FramerType, ModbusSerialClient


class ModbusDecisionLink:
    """The edgerun side: ``with ModbusDecisionLink(url) as plc: plc.write_decision(1)``."""

    def __init__(self, url: str, mapping: ModbusMap = ModbusMap(), *, timeout_s: float = 0.5, retries: int = 3) -> None:
        self.url = SerialURL.parse(url)
        self.mapping = mapping
        _, framer, client_cls = _pymodbus()
        self._client = client_cls(
            self.url.target,
            framer=framer.RTU,
            baudrate=self.url.baudrate,
            parity=self.url.parity.value,
            stopbits=self.url.stopbits,
            bytesize=self.url.bytesize,
            timeout=timeout_s,
            retries=retries,
        )

    def open(self) -> "ModbusDecisionLink":
        if not self._client.connect():
            raise LinkDown(f"cannot open Modbus port {self.url.target}")
        return self

    def write_decision(self, value: int) -> None:
        """Write the decision code ``value`` (1 pass, 2 reject, 3 review) to the decision register, and the
        coil (on for pass only) when the map has one; BadInput for any other value, LinkDown when the PLC
        does not answer."""
        # bool is an int: True would otherwise pass as 1, "pass"
        if not isinstance(value, int) or isinstance(value, bool) or value not in DECISION_COIL:
            raise BadInput(
                f"decision value {value!r} is invalid; valid: {DECISION_PASS} pass, {DECISION_REJECT} reject, {DECISION_REVIEW} review"
            )
        m = self.mapping
        self._call("write_register", m.decision_register, value, device_id=m.device_id)
        if m.decision_coil is not None:
            self._call("write_coil", m.decision_coil, DECISION_COIL[value], device_id=m.device_id)

    def write_registers(self, values: list[int]) -> None:
        """Write ``values`` to consecutive holding registers from the decision register in one request
        (function 16), so the PLC sees them together; LinkDown when the PLC does not answer."""
        if not 1 <= len(values) <= MAX_WRITE_REGISTERS or not all(_is_register(v) for v in values):
            raise BadInput(f"a register block is 1..{MAX_WRITE_REGISTERS} values of 0..{REGISTER_MAX}, got {values!r:.80}")
        m = self.mapping
        self._call("write_registers", m.decision_register, list(values), device_id=m.device_id)

    def read_decision(self) -> tuple[int, bool | None]:
        """Read back (decision register, coil or None without one) from the PLC: what it will act on."""
        m = self.mapping
        register = self._call("read_holding_registers", m.decision_register, count=1, device_id=m.device_id).registers[0]
        coil = None
        if m.decision_coil is not None:
            coil = bool(self._call("read_coils", m.decision_coil, count=1, device_id=m.device_id).bits[0])
        return int(register), coil

    def read_trigger(self) -> bool:
        reply = self._call("read_discrete_inputs", self.mapping.trigger_input, count=1, device_id=self.mapping.device_id)
        return bool(reply.bits[0])

    def _call(self, method: str, *args, **kwargs):
        from pymodbus.exceptions import ModbusException

        try:
            reply = getattr(self._client, method)(*args, **kwargs)
        except ModbusException as exc:
            raise LinkDown(f"Modbus {method} to device {self.mapping.device_id} on {self.url.target}: {exc}") from exc
        if reply.isError():
            raise LinkDown(f"Modbus {method} refused by device {self.mapping.device_id}: {reply}")
        return reply

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> "ModbusDecisionLink":
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass
class PlcSimulator:
    """A Modbus RTU server standing in for the PLC. ``writes`` lists (function code, address, values)."""

    url: str
    mapping: ModbusMap = ModbusMap()
    trigger: bool = False
    writes: list[tuple[int, int, list[int]]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._url = SerialURL.parse(self.url)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None

    async def _action(self, function_code, start_address, address, count, current_registers, set_values):
        if set_values is not None:
            self.writes.append((function_code, address, [int(v) for v in set_values]))
        elif function_code == FC_READ_DISCRETE_INPUTS:
            # pymodbus 3.16.1 packs 16 discrete inputs per register of the block, LSB first
            # (input n is bit n % 16 of register n // 16), whatever the addressing mode says.
            index, bit = divmod(self.mapping.trigger_input, 16)
            index -= start_address
            if 0 <= index < len(current_registers):
                if self.trigger:
                    current_registers[index] |= 1 << bit
                else:
                    current_registers[index] &= ~(1 << bit) & 0xFFFF
        return None

    def _device(self):
        from pymodbus.simulator import DataType, SimData, SimDevice

        n = self.mapping.size

        def bits():
            return [SimData(0, count=n, values=False, datatype=DataType.BITS)]

        def regs():
            return [SimData(0, count=n, values=0, datatype=DataType.REGISTERS)]

        # distinct tables: (coils, discrete inputs, holding registers, input registers)
        return SimDevice(id=self.mapping.device_id, simdata=(bits(), bits(), regs(), regs()), action=self._action)

    def start(self) -> "PlcSimulator":
        _pymodbus()
        from pymodbus import FramerType
        from pymodbus.server import ModbusSerialServer

        async def serve() -> None:
            self._server = ModbusSerialServer(
                self._device(), framer=FramerType.RTU, port=self._url.target, baudrate=self._url.baudrate
            )
            self._ready.set()
            await self._server.serve_forever()

        def run() -> None:
            self._loop = asyncio.new_event_loop()
            try:
                self._loop.run_until_complete(serve())
            except BaseException as exc:  # reported by start() below or at stop()
                self._error = exc
                self._ready.set()
            finally:
                self._loop.close()

        self._thread = threading.Thread(target=run, name="modbus plc simulator", daemon=True)
        self._thread.start()
        self._ready.wait(5.0)
        if self._error is not None:
            raise LinkDown(f"Modbus simulator on {self._url.target} failed: {self._error}")
        return self

    def stop(self) -> None:
        if self._loop is not None and self._server is not None and self._thread is not None and self._thread.is_alive():
            asyncio.run_coroutine_threadsafe(self._server.shutdown(), self._loop).result(5.0)
            self._thread.join(5.0)
        self._thread = None

    def __enter__(self) -> "PlcSimulator":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
