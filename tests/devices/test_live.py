"""Live state readers: meminfo, cgroup v1/v2 limits, thermal zones, Pi throttling, on trees built per case."""

from __future__ import annotations

import os

import pytest

from devices import live
from devices.live import ThrottleFlag, Throttling, available_memory_bytes, parse_throttled, snapshot
from runtime.errors import BadInput
from tests.devices.conftest import FIXTURES

GiB = 1 << 30
MEMINFO = "MemTotal:        8000000 kB\nMemFree:         1000000 kB\nMemAvailable:    4000000 kB\nBuffers: 100 kB\nCached: 200 kB\n"


def _tree(root, files: dict[str, str]) -> str:
    for rel, text in files.items():
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as fh:
            fh.write(text)
    return str(root)


@pytest.mark.parametrize(
    "files, expected",
    [
        # no cgroup files at all: MemAvailable (kB -> bytes)
        ({}, 4_000_000 * 1024),
        # kernels before 3.14 have no MemAvailable: MemFree + Buffers + Cached
        ({"proc/meminfo": "MemTotal: 8000000 kB\nMemFree: 1000000 kB\nBuffers: 100 kB\nCached: 200 kB\n"}, 1_000_300 * 1024),
        # v2 "max" is unlimited
        (
            {"sys/fs/cgroup/cgroup.controllers": "", "sys/fs/cgroup/memory.max": "max\n", "sys/fs/cgroup/memory.current": "5\n"},
            4_000_000 * 1024,
        ),
        # v2 limit below MemAvailable caps it: 1 GiB - 256 MiB used
        (
            {
                "sys/fs/cgroup/cgroup.controllers": "",
                "sys/fs/cgroup/memory.max": f"{GiB}\n",
                "sys/fs/cgroup/memory.current": f"{GiB // 4}\n",
            },
            GiB - GiB // 4,
        ),
        # inactive file cache is reclaimable and not counted as used
        (
            {
                "sys/fs/cgroup/cgroup.controllers": "",
                "sys/fs/cgroup/memory.max": f"{GiB}\n",
                "sys/fs/cgroup/memory.current": f"{GiB // 2}\n",
                "sys/fs/cgroup/memory.stat": f"anon 1\ninactive_file {GiB // 4}\n",
            },
            GiB - GiB // 4,
        ),
        # the limit is on a parent of our cgroup (a systemd slice): found by walking up from /proc/self/cgroup
        (
            {
                "proc/self/cgroup": "0::/app.slice/edgerun.service\n",
                "sys/fs/cgroup/cgroup.controllers": "",
                "sys/fs/cgroup/app.slice/memory.max": f"{2 * GiB}\n",
                "sys/fs/cgroup/app.slice/memory.current": f"{GiB}\n",
                "sys/fs/cgroup/app.slice/edgerun.service/memory.max": "max\n",
            },
            GiB,
        ),
        # v1: LONG_MAX rounded to a page means unlimited
        (
            {"sys/fs/cgroup/memory/memory.limit_in_bytes": "9223372036854771712\n", "sys/fs/cgroup/memory/memory.usage_in_bytes": "1\n"},
            4_000_000 * 1024,
        ),
        # v1 limit with hierarchical total_inactive_file preferred over the local one
        (
            {
                "sys/fs/cgroup/memory/memory.limit_in_bytes": f"{GiB}\n",
                "sys/fs/cgroup/memory/memory.usage_in_bytes": f"{GiB // 2}\n",
                "sys/fs/cgroup/memory/memory.stat": f"inactive_file 1\ntotal_inactive_file {GiB // 2}\n",
            },
            GiB,
        ),
        # usage above the limit (possible transiently) is 0 headroom, never negative
        ({"sys/fs/cgroup/cgroup.controllers": "", "sys/fs/cgroup/memory.max": "100\n", "sys/fs/cgroup/memory.current": "200\n"}, 0),
    ],
)
def test_available_memory(tmp_path, files, expected):
    root = _tree(tmp_path, {"proc/meminfo": MEMINFO, **files})
    assert available_memory_bytes(root) == expected


@pytest.mark.parametrize(
    "fixture, expected",
    [
        ("pi5", 7_512_344 * 1024),  # cgroup v2, no limit anywhere on the path
        ("pi4-coral", 1_073_741_824 - (209_715_200 - 52_428_800)),  # cgroup v1 service with MemoryMax=1G
        ("jetson-orin-nano", 4 * GiB - (GiB - GiB // 4)),  # container with a 4 GiB v2 limit at the namespace root
        ("x86-server", 58_000_000 * 1024),  # limits "max" at every level
    ],
)
def test_available_memory_on_captured_boards(fixture, expected):
    assert available_memory_bytes(os.path.join(FIXTURES, fixture)) == expected


def test_root_must_be_a_linux_tree(tmp_path):
    with pytest.raises(BadInput, match="not a directory"):
        available_memory_bytes(str(tmp_path / "nope"))
    with pytest.raises(BadInput, match="no /proc/meminfo"):
        available_memory_bytes(str(tmp_path))


@pytest.mark.parametrize(
    "text, raw",
    [
        ("throttled=0x0", 0),  # vcgencmd on a healthy Pi
        ("throttled=0x50005\n", 0x50005),  # vcgencmd with under-voltage now and since boot
        ("50000", 0x50000),  # the sysfs file has no prefix
        ("  e0008 \n", 0xE0008),  # whitespace around sysfs values
    ],
)
def test_parse_throttled(text, raw):
    assert parse_throttled(text) == raw


@pytest.mark.parametrize("text", ["throttled=", "throttled=0xZZ", "", "-1", "0x1ffffffff"])
def test_parse_throttled_rejects_garbage(text):
    # hostile or truncated firmware output is an error, not a silent "not throttled"
    with pytest.raises(BadInput):
        parse_throttled(text)


def test_throttling_flags_split_now_and_since_boot():
    t = Throttling(raw=ThrottleFlag.UNDER_VOLTAGE | ThrottleFlag.THROTTLED_OCCURRED, source="test")
    assert t.now == ("under_voltage",)
    assert t.since_boot == ("throttled_occurred",)
    assert t.is_throttled_now


def test_snapshot_of_a_captured_pi4():
    state = snapshot(os.path.join(FIXTURES, "pi4-coral"))
    assert state.cpu_temp_c == 61.0
    assert state.load_avg == (1.10, 0.95, 0.80)
    assert state.throttling.raw == 0x50005 and state.throttling.source.startswith("sysfs:")
    assert state.cgroup.version == 1 and state.cgroup_limit_bytes == GiB
    d = state.to_dict()
    assert d["throttling"]["raw"] == "0x50005" and d["available_bytes"] == state.available_bytes


def test_cpu_zone_preferred_over_hotter_zones(tmp_path):
    # On a Jetson the GPU zone may be hotter; the CPU temperature is the cpu-thermal zone.
    root = _tree(
        tmp_path,
        {
            "proc/meminfo": MEMINFO,
            "sys/class/thermal/thermal_zone0/type": "gpu-thermal\n",
            "sys/class/thermal/thermal_zone0/temp": "70000\n",
            "sys/class/thermal/thermal_zone1/type": "cpu-thermal\n",
            "sys/class/thermal/thermal_zone1/temp": "50000\n",
            "sys/class/thermal/thermal_zone2/type": "disabled\n",  # a zone whose temp is unreadable is skipped
        },
    )
    state = snapshot(root)
    assert state.cpu_temp_c == 50.0
    assert [z.type for z in state.thermal_zones] == ["gpu-thermal", "cpu-thermal"]


def test_snapshot_of_this_machine_is_consistent():
    state = snapshot("/")
    assert 0 < state.available_bytes <= state.mem_total_bytes
    assert 0 < live.available_memory_bytes("/") <= state.mem_total_bytes
