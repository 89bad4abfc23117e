"""The kiosk dashboard in a real browser: real uvicorn on a loopback port, Debian's chromium driven by selenium.

The page is asserted as a person sees it, after the SSE updates arrive; a screenshot is saved as
artifacts/kiosk-dashboard.png (the repository's artifacts/ is gitignored).
"""

from __future__ import annotations

import json
import re
import socket
import struct
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import cv2
import numpy as np
import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from apps.kiosk.dashboard import WEB, load_token, serve_dashboard
from apps.kiosk.plc import PlcState
from apps.kiosk.state import KioskState
from apps.kiosk.types import Decision, Verdict
from runtime.errors import BadInput

ROOT = Path(__file__).resolve().parents[3]
SCREENSHOT = ROOT / "artifacts" / "kiosk-dashboard.png"
TOKEN = "kiosk-test-token-0123456789abcdef"
WAIT_S = 20


@pytest.fixture(scope="session")
def browser() -> Iterator[webdriver.Chrome]:
    options = webdriver.ChromeOptions()
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1400,1500"):
        options.add_argument(arg)
    options.binary_location = "/usr/bin/chromium"
    options.set_capability("goog:loggingPrefs", {"performance": "ALL"})  # every request the page makes
    # an explicit chromedriver: Selenium Manager never looks for one online
    driver = webdriver.Chrome(options=options, service=Service("/usr/bin/chromedriver"))
    yield driver
    driver.quit()


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def part_image(seq: int) -> np.ndarray:
    """A grey plate on a dark belt, with a bright mark whose place depends on ``seq``."""
    image = np.full((120, 160, 3), 30, np.uint8)
    image[20:100, 30:130] = (150, 155, 160)
    x = 35 + (seq * 7) % 80
    image[40:60, x:x + 12] = (240, 240, 240)
    return image


def decide(state: KioskState, seq: int, verdict: Verdict, *, reason: str = "model", failsafe: bool = False,
           heatmap: np.ndarray | None = None, image: bool = True, total: float = 20.0,
           saturated: bool | None = None) -> None:
    latency = {"queue": 1.0, "infer": total - 3.0, "total": total}
    state.on_decision(Decision(seq, f"belt-{seq:04d}", verdict, reason, None, 0.25 + seq / 100, 0.9, failsafe,
                               "plates", "3", latency, heatmap), part_image(seq) if image else None,
                      saturated=saturated)


def text(driver: webdriver.Chrome, element_id: str) -> str:
    return driver.find_element(By.ID, element_id).text


def wait_text(driver: webdriver.Chrome, element_id: str, expected: str) -> None:
    try:
        WebDriverWait(driver, WAIT_S).until(lambda d: text(d, element_id) == expected)
    except Exception:
        raise AssertionError(f"#{element_id} shows {text(driver, element_id)!r}, expected {expected!r}") from None


def page_requests(driver: webdriver.Chrome) -> list[str]:
    urls = []
    for entry in driver.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message["method"] == "Network.requestWillBeSent":
            urls.append(message["params"]["request"]["url"])
    return urls


def test_the_page_shows_the_line_as_it_runs(browser: webdriver.Chrome) -> None:
    clock = Clock()  # the line's time, moved by the test: three 1 s history buckets
    state = KioskState(model="plates", version="2", bucket_s=1.0, temperature=lambda: 47.5, clock=clock)
    with serve_dashboard(state, port=0) as dash:
        browser.get_log("performance")  # forget what came before
        browser.get(dash.url)
        wait_text(browser, "link", "live")
        assert text(browser, "temperature") == "47.5 °C"
        state.set_model("plates", "3")
        state.set_plc(PlcState("frames", "/dev/pts/7", True, 0, 0.0, 0, None, 0))
        state.set_source({"source": "camera:0", "kind": "camera", "state": "running", "restarts": 0, "errors": 0})
        wait_text(browser, "plc", "connected · backlog 0")
        wait_text(browser, "source", "running")
        wait_text(browser, "model", "plates 3")

        yy, xx = np.mgrid[0:30, 0:40]
        heat = np.exp(-((yy - 12) ** 2 + (xx - 16) ** 2) / 30.0).astype(np.float32)  # where the part differs
        for seq in range(10):
            decide(state, seq, Verdict.PASS, total=10.0 + seq)
        clock.t += 1.0
        for seq in range(10, 16):
            decide(state, seq, Verdict.PASS, total=10.0 + seq)
        decide(state, 16, Verdict.REJECT, reason="anomaly score over 0.40", heatmap=heat, total=30.0)
        decide(state, 17, Verdict.REVIEW, reason="uncertain")
        clock.t += 1.0
        decide(state, 18, Verdict.REJECT, reason="deadline: no decision in 150 ms", failsafe=True, total=151.0)
        decide(state, 19, Verdict.REJECT, reason="corrupt frame: belt-0019.png: cannot decode", failsafe=True,
               image=False)
        decide(state, 20, Verdict.REJECT, reason="saturated: queue full", failsafe=True)
        state.set_pipeline({"decided": 21, "saturation": 1, "saturated": True, "queued": 32, "max_queue": 32,
                            "late": 2})
        state.set_plc(PlcState("frames", "/dev/pts/7", False, 3, 2.5, 18, 17, 21))  # the PLC stopped answering
        state.set_source({"source": "camera:0", "kind": "camera", "state": "reconnecting", "restarts": 1,
                          "errors": 0, "last_frame_age_s": 0.4})
        decide(state, 21, Verdict.REJECT, reason="anomaly score over 0.40", heatmap=heat, total=25.0)

        wait_text(browser, "parts", "22")
        snap = state.snapshot()
        assert text(browser, "pass-count") == "16" and text(browser, "pass-pct") == "72.7 %"
        assert text(browser, "reject-count") == "5" and text(browser, "reject-pct") == "22.7 %"
        assert text(browser, "review-count") == "1" and text(browser, "review-pct") == "4.5 %"
        assert text(browser, "failsafe-count") == "3"
        assert text(browser, "failsafe-reasons") == "deadline 1 · corrupt frame 1 · saturated 1"
        assert text(browser, "saturated-count") == "1"
        assert text(browser, "saturation") == "SATURATED"
        assert text(browser, "p50") == f"{snap['latency_ms']['p50']:.1f}"
        assert text(browser, "p99") == f"{snap['latency_ms']['p99']:.1f}"
        stages = [r.text.split() for r in browser.find_elements(By.CSS_SELECTOR, "#stages tr")]
        assert [r[0] for r in stages] == ["queue", "infer"] and stages[0][1:] == ["1.0", "1.0"]
        assert text(browser, "rate") == "11.0"  # 22 parts in the kiosk's first 2 s
        assert text(browser, "plc") == "disconnected · backlog 3 · last ack #17 · oldest waiting 2.5 s"
        assert text(browser, "source") == "reconnecting · restarts 1"
        assert text(browser, "pipeline") == "queue 32/32 · late 2"
        assert browser.find_element(By.ID, "plc").get_attribute("data-state") == "down"
        assert browser.find_element(By.ID, "source").get_attribute("data-state") == "down"
        assert text(browser, "model") == "plates 3"

        # the live frame: the last part, its decision, and its picture loaded
        verdict = browser.find_element(By.ID, "verdict")
        assert verdict.text == "REJECT" and verdict.get_attribute("data-verdict") == "reject"
        assert "part #21 · belt-0021" in text(browser, "part")
        WebDriverWait(browser, WAIT_S).until(lambda d: d.execute_script(
            "const i = document.getElementById('frame'); return i.complete && i.naturalWidth > 0 "
            "&& i.src.endsWith('seq=21');"))

        # the gallery: the five rejects, newest first, pictures loaded, the heat-mapped ones tagged
        items = browser.find_elements(By.CSS_SELECTOR, "#gallery .reject-item")
        assert [i.get_attribute("data-seq") for i in items] == ["21", "20", "19", "18", "16"]
        assert [bool(i.find_elements(By.CSS_SELECTOR, ".tag")) for i in items] == [True, False, False, False, True]
        assert "no frame" in items[2].text and "fail-safe: corrupt frame" in items[2].text
        WebDriverWait(browser, WAIT_S).until(lambda d: d.execute_script(
            "return [...document.querySelectorAll('#gallery img')].every(i => i.complete && i.naturalWidth > 0);"))
        assert len(browser.find_elements(By.CSS_SELECTOR, "#gallery img")) == 4

        # the charts drew the history's three buckets: 10 pass | 6 pass, a reject, a review | 4 rejects
        bars = browser.find_elements(By.CSS_SELECTOR, "#chart-parts rect")
        titles = [b.find_element(By.TAG_NAME, "title").get_attribute("textContent").split(": ")[1] for b in bars]
        assert titles == ["10 pass", "6 pass", "1 review", "1 reject", "4 reject"]
        assert len({b.get_attribute("x") for b in bars}) == 3
        line = browser.find_element(By.CSS_SELECTOR, "#chart-latency path.line-p99").get_attribute("d")
        assert line.count("M") == 1 and line.count("L") == 2

        SCREENSHOT.parent.mkdir(exist_ok=True)
        assert browser.save_screenshot(str(SCREENSHOT))
        data = SCREENSHOT.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n"
        width, height = struct.unpack(">II", data[16:24])  # IHDR
        assert width >= 1000 and height >= 700
        shot = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
        # the reject red of the verdict badge and tile is on the screen (BGR), not just a blank page
        assert np.count_nonzero((shot[:, :, 2] > 190) & (shot[:, :, 1] < 80) & (shot[:, :, 0] < 80)) > 500

        # nothing but the dashboard itself was asked for
        origin = dash.url.rstrip("/")
        requests = page_requests(browser)
        assert any(u.startswith(origin + "/api/rejects/") for u in requests)
        assert all(u.startswith(origin + "/") for u in requests), [u for u in requests if not u.startswith(origin)]
        assert state.subscribers == 1
    assert state.subscribers == 0  # stopping closed the page's stream


def test_the_page_and_its_script_name_no_other_host() -> None:
    for name in ("index.html", "app.js", "style.css"):
        body = (WEB / name).read_text()
        assert not re.search(r"(https?:)?//[a-z0-9.-]+\.[a-z]", body, re.I), name
        assert "@import" not in body and "url(" not in body, name


def request(url: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args, **kwargs):
            return None

    opener = urllib.request.build_opener(NoRedirect)
    try:
        with opener.open(urllib.request.Request(url, headers=headers or {}), timeout=10) as resp:
            return resp.status, {k.lower(): v for k, v in resp.headers.items()}, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, {k.lower(): v for k, v in err.headers.items()}, err.read()


def test_lan_bind_without_a_token_is_refused_before_binding() -> None:
    with pytest.raises(BadInput, match="refusing to serve the kiosk dashboard on '0.0.0.0' without a token"):
        serve_dashboard(KioskState(temperature=None), host="0.0.0.0", port=0)


def test_token_file(tmp_path: Path) -> None:
    good = tmp_path / "token"
    good.write_text(TOKEN + "\n")
    assert load_token(good) == TOKEN
    short = tmp_path / "short"
    short.write_text("abc\n")
    with pytest.raises(BadInput, match="at least 16 characters"):
        load_token(short)
    odd = tmp_path / "odd"
    odd.write_text("a;b+c/d=e f%20ghijklmnop\n")  # would not survive a URL or a cookie as it is
    with pytest.raises(BadInput, match="A-Z a-z 0-9"):
        load_token(odd)
    (tmp_path / "empty").write_text("\n\n")
    with pytest.raises(BadInput, match="at least 16"):
        load_token(tmp_path / "empty")
    with pytest.raises(BadInput, match="the dashboard token must be"):
        serve_dashboard(KioskState(temperature=None), port=0, token="short")
    with pytest.raises(BadInput, match="cannot read the dashboard token file"):
        load_token(tmp_path / "missing")


def test_token_is_required_and_kept_in_a_cookie(browser: webdriver.Chrome) -> None:
    state = KioskState(temperature=None)
    with serve_dashboard(state, port=0, token=TOKEN) as dash:
        for path in ("", "api/state", "events", "app.js", "api/frame/latest", "api/rejects/1"):
            status, _, body = request(dash.url + path)
            assert status == 401 and b"missing dashboard token" in body, path
            status, _, body = request(dash.url + path, {"Authorization": "Bearer " + TOKEN[:-1] + "x"})
            assert status == 401 and b"wrong dashboard token" in body, path
        assert request(dash.url + "api/state?token=nope")[0] == 401
        status, _, body = request(dash.url + "api/state", {"Authorization": "Bearer " + TOKEN})
        assert status == 200 and json.loads(body)["counts"]["parts"] == 0
        status, headers, _ = request(dash.url + "?token=" + urllib.parse.quote(TOKEN))
        assert status == 303 and headers["location"] == "/"
        assert f"kiosk_token={TOKEN}" in headers["set-cookie"] and "httponly" in headers["set-cookie"].lower()

        browser.get(dash.url + "?token=" + TOKEN)  # once; the cookie keeps it, the address bar loses it
        assert browser.current_url == dash.url
        wait_text(browser, "link", "live")
        decide(state, 0, Verdict.PASS)
        wait_text(browser, "parts", "1")
        assert text(browser, "temperature") == "no sensor"  # None is shown as such, never a made-up number
        assert text(browser, "plc") == "no PLC"
        browser.delete_all_cookies()


def test_without_a_token_only_loopback_names_are_answered() -> None:
    with serve_dashboard(KioskState(temperature=None), port=0) as dash:
        assert request(dash.url + "api/state")[0] == 200
        assert request(dash.url.replace("127.0.0.1", "localhost") + "api/state")[0] == 200
        # a page on another site that rebinds its name to 127.0.0.1 still sends its own name
        for host in ("evil.example:8080", "127.0.0.1.evil.example", "127.evil.example:80", "[::2]:80"):
            status, _, body = request(dash.url + "api/state", {"Host": host})
            assert status == 403 and b"loopback" in body, host
        for host in ("localhost", "127.0.0.2:8080", "[::1]:8080"):
            assert request(dash.url + "api/state", {"Host": host})[0] == 200, host
        status, headers, body = request(dash.url + "api/frame/latest")
        assert status == 404
        for seq in ("--5", "\u00b2", "1e3", "x" * 100):  # never a 500
            status, _, body = request(dash.url + "api/frame/latest?seq=" + urllib.parse.quote(seq))
            assert status == 400 and b"seq must be a part number" in body, seq
        status, headers, _ = request(dash.url)
        assert "default-src 'none'" in headers["content-security-policy"]


def test_port_in_use_is_one_line() -> None:
    with serve_dashboard(KioskState(temperature=None), port=0) as dash:
        with pytest.raises(BadInput, match=f"cannot listen on 127.0.0.1:{dash.port}"):
            serve_dashboard(KioskState(temperature=None), port=dash.port)


def test_a_browser_that_stops_reading_never_slows_the_line() -> None:
    state = KioskState(temperature=None)
    with serve_dashboard(state, port=0) as dash:
        stuck = socket.create_connection((dash.host, dash.port))
        stuck.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        stuck.sendall(f"GET /events HTTP/1.1\r\nHost: 127.0.0.1:{dash.port}\r\n\r\n".encode())
        deadline = time.monotonic() + 10
        while state.subscribers < 1:
            assert time.monotonic() < deadline, "the stream did not open"
            time.sleep(0.01)
        long_reason = "model: " + "x" * 2000  # big snapshots fill the socket buffers fast
        started = time.monotonic()
        for seq in range(3000):
            decide(state, seq, Verdict.REJECT, reason=long_reason, image=False)
        elapsed = time.monotonic() - started
        assert elapsed < 3.0, f"3000 decisions took {elapsed:.1f} s with a stuck browser"
        status, _, body = request(dash.url + "api/state")  # the dashboard still answers others
        assert status == 200 and json.loads(body)["counts"]["parts"] == 3000
        stuck.close()  # the browser goes: its stream and subscription end
        deadline = time.monotonic() + 20
        while state.subscribers:
            assert time.monotonic() < deadline, "a closed browser's subscription stayed"
            time.sleep(0.05)


def test_the_real_pipeline_feeds_the_page(browser: webdriver.Chrome, tmp_path: Path) -> None:
    # the wiring the kiosk app uses: on_part on capture, KioskState.on_decision as the pipeline's on_decision, a
    # Follower for the pipeline's stats; a real anomaly bundle through the residency manager
    from apps.kiosk.pipeline import Pipeline
    from apps.kiosk.policy import Policy
    from apps.kiosk.state import Follower
    from runtime.residency.manager import ModelSpec, ResidencyManager
    from tests.apps.kiosk.kiosk_models import anomaly_bundle, part

    bundle = anomaly_bundle(tmp_path / "anomaly", "3")
    state = KioskState(temperature=None)
    with ResidencyManager(1 << 30) as rm, serve_dashboard(state, port=0) as dash:
        rm.add(ModelSpec("parts", str(bundle), "anomaly", options={"threads": 1, "batch": 8}))
        with Pipeline("parts", rm, Policy(), deadline_ms=2000, on_decision=state.on_decision) as pipeline, \
                Follower(state, stats=pipeline.stats, every_s=0.1):
            browser.get(dash.url)
            wait_text(browser, "link", "live")
            for seq in range(6):
                p = part(seq, "good")
                if seq % 2:
                    p.image[:6, :6] = (40, 40, 220)  # a blue spot on the red part: an anomaly
                state.on_part(p)
                pipeline.submit(p)
            assert pipeline.wait_idle(10)
            wait_text(browser, "parts", "6")
            wait_text(browser, "pipeline", "queue 0/32")
        assert text(browser, "reject-count") == "3" and text(browser, "pass-count") == "3"
        assert text(browser, "model") == "parts 3"
        items = browser.find_elements(By.CSS_SELECTOR, "#gallery .reject-item")
        assert [i.get_attribute("data-seq") for i in items] == ["5", "3", "1"]
        assert all(i.find_elements(By.CSS_SELECTOR, ".tag") for i in items)  # every reject has its heat map
        WebDriverWait(browser, WAIT_S).until(lambda d: d.execute_script(
            "const imgs = [...document.querySelectorAll('#gallery img')];"
            "return imgs.length === 3 && imgs.every(i => i.complete && i.naturalWidth > 0);"))
