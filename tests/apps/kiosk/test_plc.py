"""The kiosk's PLC output over real ptys: the frame link with the reference peer (in-process and as
``edgerun serial-peer``), and Modbus RTU with the pymodbus PLC simulator. Every decision acknowledged,
decoded as sent, in order, none lost or duplicated across a pulled cable, a PLC reboot or a kiosk restart."""

from __future__ import annotations

import math
import os
import signal
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from apps.kiosk.plc import FIXED, REGISTERS, PlcMessage, decode, decode_registers, encode, parse_url, registers
from apps.kiosk.plc_links import open_plc
from apps.kiosk.triggers import TRIGGER_COMMAND, CommandTrigger, ModbusTrigger
from apps.kiosk.types import Decision, Verdict
from devices.link.frame import FrameType
from devices.link.modbus import PlcSimulator
from devices.link.nullmodem import NullModem, PtyEnd
from devices.link.peer import PeerStore, ReferencePeer
from runtime.errors import BadInput
from tests.devices.conftest import PeerProcess

CLASSES = ("good", "scratch", "spot")
REPO = Path(__file__).resolve().parents[3]


@pytest.fixture
def line(tmp_path):
    """A software null-modem between two real ptys: (cable, the kiosk's end, the PLC's end)."""
    a, b = PtyEnd(str(tmp_path / "tty-kiosk")), PtyEnd(str(tmp_path / "tty-plc"))
    with NullModem(a, b) as cable:
        yield cable, a, b


def decision(seq: int) -> Decision:
    """A varied decision per seq: pass/reject/review, with a class or an anomaly score, some fail-safe."""
    verdict = (Verdict.PASS, Verdict.REJECT, Verdict.REVIEW)[seq % 3]
    failsafe = seq % 7 == 5
    label = None if failsafe or seq % 4 == 0 else CLASSES[seq % 3]
    return Decision(
        seq=seq, frame_id=f"frame-{seq}", verdict=Verdict.REJECT if failsafe else verdict,
        reason="deadline 150 ms passed" if failsafe else "policy", label=label,
        score=0.0 if failsafe else 0.25 + seq / 1000, confidence=0.0 if failsafe else 0.5 + seq / 1000,
        failsafe=failsafe, model="parts", version="1",
    )  # fmt: skip


def expected(d: Decision) -> tuple:
    return (d.seq, d.verdict, d.failsafe, d.label, pytest.approx(d.score, rel=1e-6), pytest.approx(d.confidence, rel=1e-6))


def as_tuple(m: PlcMessage) -> tuple:
    return (m.seq, m.verdict, m.failsafe, m.label, m.score, m.confidence)


def peer_got(store_path: str) -> list[tuple[int, tuple]]:
    """(frame seq, decoded message) the peer applied, in the order it applied them, duplicates included."""
    store = PeerStore(store_path)
    try:
        return [(r.seq, as_tuple(decode(r.payload))) for r in store.results()]
    finally:
        store.close()


def assert_exactly_once(got: list[tuple[int, tuple]], parts: range) -> None:
    assert [s for s, _ in got] == list(range(1, len(parts) + 1))  # every frame once, in order
    assert [m for _, m in got] == [expected(decision(i)) for i in parts]  # the decisions, intact


def test_every_decision_acknowledged_and_decoded(tmp_path, line):
    _, a, b = line
    applied = []
    with ReferencePeer(b.url, str(tmp_path / "peer.db"), on_apply=applied.append) as peer:
        peer.start()
        with open_plc(f"serial://{a.url}?baud=115200", journal=tmp_path / "j.db") as plc:
            for i in range(60):
                plc.send(decision(i))
            assert plc.drain(10), plc.state()
            state = plc.state()
            assert (state.protocol, state.connected, state.backlog) == ("frames", True, 0)
            assert (state.last_acked_seq, state.last_acked_part) == (60, 59)
            assert [seq for seq, _, _ in plc.journal.failsafes()] == [i + 1 for i in range(60) if decision(i).failsafe]
        peer.stop()
    assert_exactly_once(peer_got(str(tmp_path / "peer.db")), range(60))
    # a fail-safe decision travels as a FAILSAFE frame, so a PLC that only knows the frame types still rejects it
    assert [r.type is FrameType.FAILSAFE for r in applied] == [decision(i).failsafe for i in range(60)]


def test_plc_reboot_delivers_the_backlog_in_order(tmp_path, line):
    # The PLC (`edgerun serial-peer` with its store) is killed mid-stream and comes back a while later.
    _, a, b = line
    store = str(tmp_path / "peer.db")
    peer = PeerProcess(b.url, store).start()
    try:
        with open_plc(a.url, journal=tmp_path / "j.db") as plc:
            for i in range(20):
                plc.send(decision(i))
            assert plc.drain(15), plc.state()
            peer.kill()
            for i in range(20, 50):  # the line keeps running while the PLC reboots
                plc.send(decision(i))
            wait_for(lambda: not plc.state().connected)
            state = plc.state()
            assert not state.connected and state.backlog == 30 and state.waiting_s >= 1.0  # the dashboard sees it
            time.sleep(0.5)  # down a while longer: the link keeps retrying
            peer = PeerProcess(b.url, store).start()
            assert plc.drain(15), plc.state()
            assert plc.state().connected and plc.state().last_acked_part == 49
    finally:
        peer.stop()
    assert_exactly_once(peer_got(store), range(50))


def test_cable_pulled_while_deciding(tmp_path, line):
    cable, a, b = line
    with ReferencePeer(b.url, str(tmp_path / "peer.db")) as peer:
        peer.start()
        with open_plc(a.url, journal=tmp_path / "j.db") as plc:
            assert plc.link.wait_connected(5)
            puller = threading.Thread(target=cable.pull, args=(a, 0.5))
            puller.start()
            for i in range(80):
                plc.send(decision(i))
                time.sleep(0.01)  # parts keep coming while the cable is out
            puller.join()
            assert plc.drain(15), plc.state()
            assert plc.link.stats.disconnects >= 1
        peer.stop()
    assert_exactly_once(peer_got(str(tmp_path / "peer.db")), range(80))


def test_kiosk_restart_resends_unacknowledged_in_order(tmp_path, line):
    _, a, b = line
    journal, store = tmp_path / "j.db", str(tmp_path / "peer.db")
    with ReferencePeer(b.url, store) as peer:
        peer.start()
        with open_plc(a.url, journal=journal) as plc:
            for i in range(5):
                plc.send(decision(i))
            assert plc.drain(10)
        peer.stop()  # the PLC stops answering; the kiosk decides 5 more and is shut down
        with open_plc(a.url, journal=journal) as plc:
            for i in range(5, 10):
                plc.send(decision(i))
            time.sleep(0.3)
            assert plc.state().backlog == 5
    with ReferencePeer(b.url, store) as peer:
        peer.start()
        with open_plc(a.url, journal=journal) as plc:  # the restarted kiosk resends them first
            assert plc.state().backlog == 5
            for i in range(10, 13):
                plc.send(decision(i))
            assert plc.drain(10), plc.state()
            assert plc.state().last_acked_part == 12
        peer.stop()
    assert_exactly_once(peer_got(store), range(13))


KIOSK = """
import sys
from apps.kiosk.plc_links import open_plc
from tests.apps.kiosk.test_plc import decision
with open_plc(sys.argv[1], journal=sys.argv[2]) as plc:
    for i in range(10**6):
        plc.send(decision(i))
        print(i, flush=True)  # send() returned: the decision is on disk
"""


def test_kiosk_killed_mid_stream_loses_nothing(tmp_path, line):
    _, a, b = line
    journal, store = tmp_path / "j.db", str(tmp_path / "peer.db")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    with ReferencePeer(b.url, store) as peer:
        peer.start()
        kiosk = subprocess.Popen([sys.executable, "-c", KIOSK, a.url, str(journal)], cwd=REPO, env=env, stdout=subprocess.PIPE, text=True)
        returned = [int(kiosk.stdout.readline()) for _ in range(200)]
        kiosk.send_signal(signal.SIGKILL)  # mid-stream: decisions in flight, some acknowledged, some not
        kiosk.wait(5)
        with open_plc(a.url, journal=journal) as plc:  # the restarted kiosk
            assert plc.drain(15), plc.state()
        peer.stop()
    got = peer_got(store)
    assert len(got) >= len(returned) == 200  # every decision whose send() returned, maybe a few more
    assert_exactly_once(got, range(len(got)))


def test_modbus_decisions_written_and_kept_across_a_plc_reboot(tmp_path, line):
    _, a, b = line
    url = f"modbus://{a.url}?unit=3&register=2&baud=115200"
    with PlcSimulator(b.url + "?baud=115200", parse_modbus_map(url)) as sim:
        with open_plc(url, journal=tmp_path / "j.db", classes=CLASSES, timeout_s=0.1) as plc:
            assert wait_for(lambda: plc.state().connected)  # the port is open before the first decision
            for i in range(6):
                plc.send(decision(i))
            assert plc.drain(10), plc.state()
            sim.stop()  # the PLC reboots
            for i in range(6, 12):
                plc.send(decision(i))
            time.sleep(1.2)
            assert plc.state().backlog == 6 and not plc.state().connected
            with PlcSimulator(b.url + "?baud=115200", parse_modbus_map(url)) as sim2:
                assert plc.drain(10), plc.state()
    writes = sim.writes + sim2.writes
    assert all(fc == 16 and address == 2 and len(values) == REGISTERS for fc, address, values in writes)
    got = [as_tuple(decode_registers(values, CLASSES)) for _, _, values in writes]
    assert got == [expected(decision(i))[:5] + (pytest.approx(decision(i).confidence, abs=1e-4),) for i in range(12)]


def test_triggers_share_the_frame_link_with_the_decisions(tmp_path, line):
    # One port, one owner: the PLC's trigger commands arrive on the link that carries the decisions.
    _, a, b = line
    trigger = CommandTrigger()
    with ReferencePeer(b.url, str(tmp_path / "peer.db"), command_timeout_s=0.05) as peer:
        peer.start()
        with open_plc(a.url, journal=tmp_path / "j.db", on_command=trigger.on_command) as plc:
            for i in range(5):
                peer.send_command(TRIGGER_COMMAND)  # a part at the station
                assert trigger.wait(5)
                plc.send(decision(i))  # its decision
            assert plc.drain(10)
        peer.stop()
    assert trigger.fired == 5
    assert_exactly_once(peer_got(str(tmp_path / "peer.db")), range(5))


def test_modbus_trigger_reads_through_the_outputs_port(tmp_path, line):
    _, a, b = line
    url = f"modbus://{a.url}?unit=1"
    with PlcSimulator(b.url, parse_modbus_map(url)) as sim, open_plc(url, journal=tmp_path / "j.db") as plc:
        trigger = ModbusTrigger(plc.link, lock=plc.lock)
        for i in range(5):
            sim.trigger = True
            assert trigger.wait(5)
            sim.trigger = False
            plc.send(decision(i))
            assert not trigger.wait(0.05)  # one edge, one part; the writes in between do not disturb the reads
        assert plc.drain(10)
    assert [decode_registers(v).seq for _, _, v in sim.writes] == list(range(5))


def test_modbus_has_no_commands(tmp_path):
    with pytest.raises(BadInput, match="carries no commands"):
        open_plc("modbus:///dev/ttyUSB0", journal=tmp_path / "j.db", on_command=print)


def wait_for(condition, timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def parse_modbus_map(url: str):
    from devices.link.modbus import ModbusMap

    _, _, options = parse_url(url)
    return ModbusMap(device_id=options.get("unit", 1), decision_register=options.get("register", 0), size=16)


def test_payload_round_trip_and_edges():
    d = decision(1)
    payload = encode(d)
    assert len(payload) == FIXED.size + len(d.label) and payload[0] == 1  # compact, versioned
    assert as_tuple(decode(payload)) == expected(d)
    huge = Decision(2**40, "f", Verdict.REJECT, "r", "é" * 200, 1e300, 1.0, False, "m", "1")  # 400 bytes of label
    got = decode(encode(huge))
    assert got.label == "é" * 127 and got.score == math.inf and got.seq == 2**40  # cut at a character, not mid-byte
    # registers: the seq mod 2^32, no class index for a label outside the model's classes
    assert decode_registers(registers(got, CLASSES), CLASSES) == PlcMessage(0, Verdict.REJECT, False, None, math.inf, 1.0)


@pytest.mark.parametrize(
    "payload, message",
    [
        (b"\x01\x02", "shorter than its 20-byte"),  # a cut frame payload
        (b"\x02" + bytes(19), "version 2 is unknown"),  # a newer kiosk's message
        (struct.pack(">BBBBQff", 1, 9, 0, 0, 1, 0, 0), "verdict code 9"),
        (struct.pack(">BBBBQff", 1, 1, 0, 3, 1, 0, 0) + b"ab", "label length 3"),
        (struct.pack(">BBBBQff", 1, 1, 0, 2, 1, 0, 0) + b"\xff\xfe", "not UTF-8"),
    ],
)
def test_decode_refuses_what_is_not_a_message(payload, message):
    with pytest.raises(BadInput, match=message):
        decode(payload)


@pytest.mark.parametrize(
    "url, message",
    [
        ("ftp://plc", "scheme 'ftp'"),  # a scheme no link speaks
        ("ttyUSB0", "absolute path"),  # a relative device path
        ("", "empty"),
        ("serial:///dev/ttyUSB0?baud=fast", "baud='fast'"),  # the serial settings are checked too
        ("modbus:///dev/ttyUSB0?unit=x", "unit='x'"),
        ("modbus:///dev/ttyUSB0?unit=0", "device id 0"),  # 0 is Modbus broadcast: no PLC would answer
        ("modbus:///dev/ttyUSB0?register=65530", "register=65530"),  # the 9-register block would pass 65535
    ],
)
def test_bad_url_is_one_line(tmp_path, url, message):
    with pytest.raises(BadInput, match=message) as info:
        open_plc(url, journal=tmp_path / "j.db")
    assert "\n" not in str(info.value)


def test_a_journal_folder_that_cannot_be_made_is_one_line(tmp_path):
    (tmp_path / "file").write_text("a file where the kiosk's folder should be")
    with pytest.raises(BadInput, match="cannot create the PLC journal's folder"):
        open_plc("/dev/ttyUSB0", journal=tmp_path / "file" / "kiosk" / "plc.db")
