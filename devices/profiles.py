"""Board profiles: data files (``devices/profiles/*.toml``) that give each known board its defaults.

A profile matches by device-tree ``compatible`` strings (any one equal) or CPU
architecture; the matching profile with the highest ``priority`` wins, and
``generic`` applies when none matches. Adding a board is adding a file, never a
code branch. Files are validated when loaded: an unknown key, a bad enum value
or a fraction outside (0, 1] is an error naming the file and the valid values.
"""

from __future__ import annotations

import enum
import functools
import importlib.resources
import os
from dataclasses import dataclass

from devices.target import Target
from runtime.errors import BadInput

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

GENERIC = "generic"
_TOP_KEYS = {"name", "description", "priority", "match", "defaults"}
_MATCH_KEYS = {"compatible", "arch"}
_DEFAULT_KEYS = {"threads", "max_threads", "memory_budget_fraction", "preferred_targets"}


class ThreadPolicy(str, enum.Enum):
    ALL = "all"  # every logical CPU (boards without SMT)
    PHYSICAL = "physical"  # one per physical core (skip SMT siblings)
    BIG = "big"  # performance cores only (big.LITTLE)


@dataclass(frozen=True)
class BoardProfile:
    name: str
    description: str
    priority: int
    compatible: tuple[str, ...]
    arch: tuple[str, ...]
    threads: ThreadPolicy
    max_threads: int | None
    memory_budget_fraction: float  # share of available memory the planner may use
    preferred_targets: tuple[Target, ...]  # order tried for --target auto
    source: str  # file it came from

    def matches(self, compatible: tuple[str, ...], arch: str) -> bool:
        return bool(set(self.compatible) & set(compatible)) or arch in self.arch

    def to_dict(self) -> dict[str, object]:
        return {
            "name": self.name,
            "description": self.description,
            "threads": self.threads.value,
            "max_threads": self.max_threads,
            "memory_budget_fraction": self.memory_budget_fraction,
            "preferred_targets": [t.value for t in self.preferred_targets],
            "source": self.source,
        }


def parse_profile(text: str, source: str) -> BoardProfile:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise BadInput(f"profile {source}: not valid TOML: {exc}") from None
    _keys(data, _TOP_KEYS, source, "")
    match, defaults = data.get("match", {}), data.get("defaults", {})
    _keys(match, _MATCH_KEYS, source, "[match] ")
    _keys(defaults, _DEFAULT_KEYS, source, "[defaults] ")
    name = data.get("name")
    if not isinstance(name, str) or not name:
        raise BadInput(f"profile {source}: 'name' must be a non-empty string")
    try:
        threads = ThreadPolicy(defaults.get("threads", "physical"))
    except ValueError:
        raise BadInput(f"profile {source}: threads={defaults.get('threads')!r}; valid: {[p.value for p in ThreadPolicy]}") from None
    fraction = defaults.get("memory_budget_fraction", 0.6)
    if not isinstance(fraction, (int, float)) or not 0 < fraction <= 1:
        raise BadInput(f"profile {source}: memory_budget_fraction={fraction!r}; give a number in (0, 1]")
    max_threads = defaults.get("max_threads")
    if max_threads is not None and (not isinstance(max_threads, int) or max_threads < 1):
        raise BadInput(f"profile {source}: max_threads={max_threads!r}; give a positive integer")
    targets = []
    for t in defaults.get("preferred_targets", ["gpu", "npu", "cpu"]):
        target = Target.parse(t)
        if target is Target.AUTO:
            raise BadInput(f"profile {source}: preferred_targets cannot contain 'auto'; valid: cpu, gpu, npu")
        targets.append(target)
    if Target.CPU not in targets:
        targets.append(Target.CPU)  # the last resort is always the CPU
    return BoardProfile(
        name=name,
        description=str(data.get("description", name)),
        priority=int(data.get("priority", 0)),
        compatible=tuple(match.get("compatible", ())),
        arch=tuple(match.get("arch", ())),
        threads=threads,
        max_threads=max_threads,
        memory_budget_fraction=float(fraction),
        preferred_targets=tuple(targets),
        source=source,
    )


def _keys(table: object, valid: set[str], source: str, where: str) -> None:
    if not isinstance(table, dict):
        raise BadInput(f"profile {source}: {where or 'file'} must be a table")
    unknown = set(table) - valid
    if unknown:
        raise BadInput(f"profile {source}: unknown {where}key(s) {sorted(unknown)}; valid: {sorted(valid)}")


@functools.lru_cache(maxsize=None)
def load_profiles(directory: str | None = None) -> tuple[BoardProfile, ...]:
    """Every profile, highest priority first. ``directory`` None: the packaged ones."""
    if directory is None:
        files = importlib.resources.files("devices") / "profiles"
        entries = [(f.name, f.read_text(encoding="utf-8")) for f in files.iterdir() if f.name.endswith(".toml")]
    else:
        entries = []
        for name in sorted(os.listdir(directory)):
            if name.endswith(".toml"):
                with open(os.path.join(directory, name), encoding="utf-8") as fh:
                    entries.append((name, fh.read()))
    profiles = [parse_profile(text, f"profiles/{name}") for name, text in sorted(entries)]
    names = [p.name for p in profiles]
    duplicates = {n for n in names if names.count(n) > 1}
    if duplicates:
        raise BadInput(f"profiles: name(s) {sorted(duplicates)} defined twice")
    if GENERIC not in names:
        raise BadInput(f"profiles: no '{GENERIC}' profile; it is the fallback for unknown boards")
    return tuple(sorted(profiles, key=lambda p: (-p.priority, p.name)))


def match_profile(compatible: tuple[str, ...], arch: str, profiles: tuple[BoardProfile, ...] | None = None) -> BoardProfile:
    profiles = load_profiles() if profiles is None else profiles
    for profile in profiles:
        if profile.name != GENERIC and profile.matches(compatible, arch):
            return profile
    return next(p for p in profiles if p.name == GENERIC)
