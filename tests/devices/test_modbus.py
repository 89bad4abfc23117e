"""Modbus RTU (pymodbus 3.16.1) over real ptys: decisions written, triggers read, a dead line reported."""

from __future__ import annotations

import pytest

from devices.link.modbus import FC_WRITE_SINGLE_COIL, FC_WRITE_SINGLE_REGISTER, ModbusDecisionLink, ModbusMap, PlcSimulator
from devices.link.transport import LinkDown
from runtime.errors import BadInput


def test_decision_written_and_trigger_read(make_cable):
    _, a, b = make_cable()
    mapping = ModbusMap(device_id=3, decision_register=5, decision_coil=2, trigger_input=1)
    with PlcSimulator(b.url + "?baud=115200", mapping) as plc, ModbusDecisionLink(a.url + "?baud=115200", mapping) as link:
        assert link.read_trigger() is False
        plc.trigger = True  # a part arrives at the station
        assert link.read_trigger() is True
        link.write_decision(1)  # pass: the accept coil on
        link.write_decision(2)  # reject: the accept coil off
    assert plc.writes == [
        (FC_WRITE_SINGLE_REGISTER, 5, [1]),
        (FC_WRITE_SINGLE_COIL, 2, [1]),
        (FC_WRITE_SINGLE_REGISTER, 5, [2]),
        (FC_WRITE_SINGLE_COIL, 2, [0]),
    ]


def test_no_plc_on_the_line_is_link_down(make_cable):
    _, a, _ = make_cable()  # nobody answers on the other end
    with ModbusDecisionLink(a.url, timeout_s=0.1, retries=0) as link, pytest.raises(LinkDown, match="write_register"):
        link.write_decision(1)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"device_id": 0}, "device id 0"),  # 0 is the broadcast address: no reply would ever come
        ({"device_id": 248}, "device id 248"),  # above the RTU address range
        ({"decision_register": 16}, "decision_register=16"),  # outside the simulated table
        ({"decision_coil": -1}, "decision_coil=-1"),
    ],
)
def test_modbus_map_validation(kwargs, message):
    with pytest.raises(BadInput, match=message):
        ModbusMap(**kwargs)


def test_decision_must_fit_a_register(make_cable):
    _, a, _ = make_cable()
    with ModbusDecisionLink(a.url) as link, pytest.raises(BadInput, match="decision value 70000 is invalid"):
        link.write_decision(70000)
