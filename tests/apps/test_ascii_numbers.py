"""Numbers from users are ASCII digits only, wherever they are parsed.

``"²".isdigit()`` is true but ``int("²")`` raises (a 500 and a traceback where a 400 was due), and ``int()`` and
regex ``\\d`` take other scripts' digits ("٣" is 3) that no one meant as a number. Each case names its parser.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from starlette.requests import Request

from apps.kiosk.plc import parse_url
from apps.kiosk.report_cmd import since_time
from apps.kiosk.sources import open_source
from apps.server.config import ModelEntry, ServeConfig
from apps.server.security import read_body
from converters.vision.calib import _label_of
from devices.link.transport import SerialURL
from devices.live import _limit_value
from runtime.errors import BadInput
from runtime.units import parse_size
from tests.apps.serve_harness import LiveServer

SUPERSCRIPT, ARABIC_THREE = "\u00b2", "\u0663"  # "²": isdigit() but not int(); "٣": int() gives 3


@pytest.mark.parametrize("value", [SUPERSCRIPT, ARABIC_THREE])
@pytest.mark.parametrize("parse, form, fragment", [
    (parse_url, "modbus:///dev/ttyUSB0?unit={}", "give a small non-negative integer"),  # the kiosk's PLC URL
    (SerialURL.parse, "/dev/ttyUSB0?baud={}", "a positive integer"),  # the serial link's URL
    (parse_size, "{}M", "is not a size"),  # --memory and every size
    (open_source, "camera:{}", "is not a camera index"),  # the kiosk's --source
])
def test_non_ascii_digits_are_one_bad_input_line(parse, form: str, fragment: str, value: str) -> None:
    with pytest.raises(BadInput, match=fragment) as err:
        parse(form.format(value))
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("value", [f"{SUPERSCRIPT}h", f"{ARABIC_THREE}d"])
def test_report_since_takes_ascii_ages_only(value: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="is not a time"):
        since_time(value)


def test_a_calibration_folder_named_by_a_superscript_is_a_label_name(tmp_path: Path) -> None:
    root = tmp_path / "calib"
    assert _label_of(root / SUPERSCRIPT / "a.png", root, ["cat"]) == -1  # not a class index (int() would raise)
    assert _label_of(root / "3" / "a.png", root, []) == 3


def test_a_cgroup_limit_that_is_not_ascii_digits_is_no_limit() -> None:
    assert _limit_value(SUPERSCRIPT) is None and _limit_value("max") is None and _limit_value("1048576") == 1048576


def _request(headers: list[tuple[bytes, bytes]]) -> Request:
    async def receive() -> dict:
        return {"type": "http.request", "body": b"{}", "more_body": False}

    return Request({"type": "http", "method": "POST", "path": "/", "headers": headers}, receive)


@pytest.mark.parametrize("declared", [SUPERSCRIPT, "1" + SUPERSCRIPT, " 2", "9" * 5000])  # 5000 digits: int() refuses
def test_content_length_must_be_ascii_digits(declared: str) -> None:
    # h11 checks Content-Length before the app under uvicorn; read_body holds on its own under any ASGI server.
    # Header bytes are Latin-1 to ASGI: "²" (0xB2) is one that str.isdigit() takes.
    request = _request([(b"content-length", declared.encode("latin-1"))])
    with pytest.raises(BadInput, match="Content-Length|over the limit"):
        asyncio.run(read_body(request, 1024))
    assert asyncio.run(read_body(_request([(b"content-length", b"2")]), 1024)) == b"{}"


@pytest.fixture(scope="module")
def server() -> Iterator[LiveServer]:
    live = LiveServer(ServeConfig(models=[ModelEntry("default", "default")]), load=False)
    live.state.ready.set()  # no model loaded: the header is refused before one would be needed
    yield live
    live.stop()


@pytest.mark.parametrize("value", [SUPERSCRIPT, "1" + SUPERSCRIPT])
def test_deadline_header_with_a_superscript_is_400(server: LiveServer, value: str) -> None:
    # http.client sends the header as Latin-1 ("²" is byte 0xB2), Starlette reads it back as "²"
    body = {"model": "default", "prompt": "hi"}
    status, _, raw = server.request("POST", "/v1/completions", body, {"X-Deadline-Ms": value})
    assert status == 400 and "X-Deadline-Ms must be an integer" in json.loads(raw)["error"]["message"], raw


def test_dashboard_frame_seq_takes_ascii_digits_only() -> None:
    from apps.kiosk.dashboard import serve_dashboard
    from apps.kiosk.state import KioskState

    with serve_dashboard(KioskState(temperature=None), port=0) as dash:
        for seq, status in ((ARABIC_THREE, 400), (" 5", 400), ("1_0", 400), ("7", 404)):  # 404: no frame 7 yet
            url = dash.url + "api/frame/latest?seq=" + urllib.parse.quote(seq)
            try:
                with urllib.request.urlopen(url, timeout=10) as resp:
                    got = resp.status
            except urllib.error.HTTPError as err:
                got = err.code
            assert got == status, seq
