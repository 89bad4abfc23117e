"""Decision values over Modbus RTU (pymodbus 3.16.1, real ptys): each verdict code reads back as itself.

The codes are the kiosk's (docs/kiosk.md, apps/kiosk/plc.py): 1 pass, 2 reject, 3 review. The coil is the
plain accept bit, on for pass only; the old encoding wrote ``bool(value)``, so reject (2) opened the gate.
"""

from __future__ import annotations

import pytest

from devices.link.modbus import FC_WRITE_SINGLE_COIL, FC_WRITE_SINGLE_REGISTER, ModbusDecisionLink, ModbusMap, PlcSimulator
from runtime.errors import BadInput

# The documented codes, spelled out rather than imported: the test checks the module against the docs.
DECISION_PASS, DECISION_REJECT, DECISION_REVIEW = 1, 2, 3

MAPPING = ModbusMap(device_id=2, decision_register=4, decision_coil=6)


@pytest.mark.parametrize(
    "value, coil",
    [
        (DECISION_PASS, True),  # the only value that opens the accept gate
        (DECISION_REJECT, False),  # was bool(2) == True: a rejected part accepted
        (DECISION_REVIEW, False),  # a part for human review is not accepted either
    ],
)
def test_each_decision_reads_back_as_itself(make_cable, value, coil):
    _, a, b = make_cable()
    with PlcSimulator(b.url + "?baud=115200", MAPPING) as plc, ModbusDecisionLink(a.url + "?baud=115200", MAPPING) as link:
        # Start from the opposite coil state so a write that did not happen cannot pass.
        link.write_decision(DECISION_REJECT if coil else DECISION_PASS)
        link.write_decision(value)
        assert plc.writes[-2:] == [(FC_WRITE_SINGLE_REGISTER, 4, [value]), (FC_WRITE_SINGLE_COIL, 6, [int(coil)])]
        assert link.read_decision() == (value, coil)  # and the PLC's tables hold it


def test_reject_without_a_coil_reads_back_as_reject(make_cable):
    _, a, b = make_cable()
    mapping = ModbusMap(decision_register=1)
    with PlcSimulator(b.url, mapping) as plc, ModbusDecisionLink(a.url, mapping) as link:
        link.write_decision(DECISION_REJECT)
        assert plc.writes == [(FC_WRITE_SINGLE_REGISTER, 1, [DECISION_REJECT])]
        assert link.read_decision() == (DECISION_REJECT, None)


@pytest.mark.parametrize(
    "value",
    [
        0,  # a PLC's cleared register: never a decision
        4,  # no such verdict; the old code wrote it and set the accept coil
        70000,  # does not fit a register either
        -1,
        True,  # bool is an int; True would have passed as 1, "pass"
        2.0,  # a float is not coerced to a code
        "reject",  # names are the caller's to map (apps/kiosk/plc.py VERDICT_CODES)
    ],
)
def test_values_without_a_documented_meaning_are_refused_before_anything_is_written(make_cable, value):
    _, a, b = make_cable()
    with PlcSimulator(b.url, MAPPING) as plc, ModbusDecisionLink(a.url, MAPPING) as link:
        with pytest.raises(BadInput, match=r"decision value .* is invalid; valid: 1 pass, 2 reject, 3 review"):
            link.write_decision(value)
    assert plc.writes == []


@pytest.mark.parametrize("values", [[1, True], [1, 2.5], [70000], []])  # no bool, float or oversized value coerced
def test_register_block_refuses_values_a_register_cannot_hold(make_cable, values):
    _, a, b = make_cable()
    with PlcSimulator(b.url, MAPPING) as plc, ModbusDecisionLink(a.url, MAPPING) as link:
        with pytest.raises(BadInput, match="register block is"):
            link.write_registers(values)
    assert plc.writes == []
