"""Detection on captured board trees, and profile files validated like any other input."""

from __future__ import annotations

import os

import pytest

from devices.accelerators import AcceleratorKind
from devices.machine import detect
from devices.profiles import ThreadPolicy, load_profiles, match_profile, parse_profile
from devices.target import Target
from runtime.errors import BadInput
from tests.devices.conftest import FIXTURES

# fixture: (board model, profile, arch, cpu model, logical, physical, features that must be present, accelerator kinds)
BOARDS = {
    "pi5": (
        "Raspberry Pi 5 Model B Rev 1.0",
        "raspberry-pi-5",
        "aarch64",
        "Cortex-A76",
        4,
        4,
        {"neon", "dotprod", "fp16"},
        [AcceleratorKind.DRM_GPU],
    ),
    "pi4-coral": (
        "Raspberry Pi 4 Model B Rev 1.5",
        "raspberry-pi-4",
        "aarch64",
        "Cortex-A72",
        4,
        4,
        {"neon"},
        [AcceleratorKind.EDGETPU_USB, AcceleratorKind.DRM_GPU],
    ),
    "jetson-orin-nano": (
        "NVIDIA Jetson Orin Nano Developer Kit",
        "jetson-orin",
        "aarch64",
        "Cortex-A78AE",
        6,
        6,
        {"neon", "dotprod"},
        [AcceleratorKind.JETSON_GPU],
    ),
    "x86-server": (
        "Dell Inc. PowerEdge R650",
        "x86-64",
        "x86_64",
        "Intel(R) Xeon(R) Gold 6334 CPU @ 3.60GHz",
        16,
        8,
        {"avx2", "avx512", "avx512_vnni", "fma"},
        [AcceleratorKind.NVIDIA_GPU],
    ),
}


@pytest.mark.parametrize("fixture", sorted(BOARDS))
def test_captured_board(fixture):
    model, profile, arch, cpu_model, logical, physical, features, kinds = BOARDS[fixture]
    m = detect(os.path.join(FIXTURES, fixture))
    assert m.board.model == model
    assert m.profile.name == profile
    assert (m.cpu.arch, m.cpu.model, m.cpu.logical_cpus, m.cpu.physical_cores) == (arch, cpu_model, logical, physical)
    assert features <= set(m.cpu.features)
    assert [a.kind for a in m.accelerators] == kinds


def test_pi4_has_no_dotprod_so_llamacpp_uses_the_slower_kernels():
    # The A72 lacks the dot-product instructions; reporting it would mislead quantisation choices.
    assert "dotprod" not in detect(os.path.join(FIXTURES, "pi4-coral")).cpu.features


def test_jetson_release_and_power_mode():
    j = detect(os.path.join(FIXTURES, "jetson-orin-nano")).board.jetson
    assert (j.l4t_release, j.power_mode, j.power_mode_id) == ("36.3.0", "7W", 1)


def test_nvidia_gpu_named_from_the_driver():
    (gpu,) = detect(os.path.join(FIXTURES, "x86-server")).accelerators
    assert gpu.name == "NVIDIA A2" and gpu.target is Target.GPU


def test_coral_pcie_without_driver_is_reported_as_a_problem(tmp_path):
    # The M.2 Coral shows up on the PCI bus before the gasket driver exists; /dev/apex_0 does not.
    dev = tmp_path / "sys/bus/pci/devices/0000:01:00.0"
    dev.mkdir(parents=True)
    (dev / "vendor").write_text("0x1ac1\n")
    (dev / "device").write_text("0x089a\n")
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc/meminfo").write_text("MemTotal: 1000 kB\nMemAvailable: 500 kB\n")
    (acc,) = detect(str(tmp_path)).accelerators
    assert acc.kind is AcceleratorKind.EDGETPU_PCIE and "apex" in acc.problem


def test_unknown_board_gets_generic_profile(tmp_path):
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc/meminfo").write_text("MemTotal: 1000 kB\nMemAvailable: 500 kB\n")
    (tmp_path / "proc/cpuinfo").write_text("processor\t: 0\nCPU architecture: 7\nFeatures\t: half thumb vfp neon\nCPU part\t: 0xc07\n")
    m = detect(str(tmp_path))
    assert m.profile.name == "generic" and m.cpu.arch == "armv7l" and m.board.model == "unknown"


def test_every_packaged_profile_loads_and_ends_on_cpu():
    profiles = load_profiles()
    assert {"generic", "raspberry-pi-4", "raspberry-pi-5", "jetson-orin", "x86-64"} <= {p.name for p in profiles}
    assert all(p.preferred_targets[-1] is Target.CPU for p in profiles)


def test_device_tree_beats_architecture():
    # A Jetson is also aarch64; the compatible string must select the board profile.
    assert match_profile(("nvidia,tegra234",), "aarch64").name == "jetson-orin"
    assert match_profile((), "x86_64").name == "x86-64"
    assert match_profile(("acme,unknown",), "riscv64").name == "generic"


GOOD = 'name = "b"\n[match]\narch = ["x"]\n[defaults]\nthreads = "big"\n'


@pytest.mark.parametrize(
    "text, message",
    [
        ("name = [", "not valid TOML"),  # syntax error names the file
        ('name = "b"\ncolour = "red"\n', "unknown key.*colour"),  # a typo is not silently ignored
        ('name = "b"\n[defaults]\nthreds = "all"\n', "unknown \\[defaults\\] key.*threds"),  # misspelt default
        ('name = "b"\n[defaults]\nthreads = "many"\n', "threads='many'.*'all', 'physical', 'big'"),  # bad enum lists choices
        ('name = "b"\n[defaults]\nmemory_budget_fraction = 1.5\n', "memory_budget_fraction=1.5"),  # over 100 % of memory
        ('name = "b"\n[defaults]\npreferred_targets = ["tpu"]\n', "target 'tpu'.*cpu, gpu, npu"),  # unknown target
        ('name = "b"\n[defaults]\npreferred_targets = ["auto"]\n', "cannot contain 'auto'"),  # auto is a request, not a target
        ('name = ""\n', "non-empty string"),  # nameless profile
    ],
)
def test_bad_profile_files(text, message):
    with pytest.raises(BadInput, match=message):
        parse_profile(text, "profiles/test.toml")


def test_good_profile_gets_cpu_appended():
    p = parse_profile(GOOD, "profiles/test.toml")
    assert p.threads is ThreadPolicy.BIG and p.preferred_targets == (Target.GPU, Target.NPU, Target.CPU)


def test_profile_directory_without_generic_is_refused(tmp_path):
    (tmp_path / "b.toml").write_text(GOOD)
    with pytest.raises(BadInput, match="no 'generic' profile"):
        load_profiles(str(tmp_path))
