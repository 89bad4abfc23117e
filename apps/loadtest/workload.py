"""What the load generator sends: prompts (built in or from a file) and the priority mix.

A prompts file is text, one prompt per line (blank lines skipped), or JSON Lines whose
objects carry ``"prompt"`` (text) or ``"messages"`` (a chat). Its size and line count are
bounded, and every refusal is one line naming the file, the line and what would be valid.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass
from pathlib import Path

from runtime.errors import BadInput
from runtime.serving.scheduler import Priority

MAX_PROMPTS_BYTES = 16 * 2**20  # a load test needs variety, not a corpus
MAX_PROMPTS = 100_000
PRIORITIES = tuple(p.name.lower() for p in Priority)  # the server's X-Priority values, best first

BUILT_IN = (
    "Explain in a few sentences how a heat pump works.",
    "Write a short story about a robot that learns to garden.",
    "List five ways to save energy in a small workshop.",
    "Describe the water cycle to a ten year old.",
    "What should a checklist for a morning machine inspection contain?",
    "Summarise the rules of chess for a beginner.",
    "Write a polite email asking a colleague to review a report.",
    "Why does bread go stale, and how can it be slowed down?",
)


@dataclass(frozen=True)
class Prompt:
    text: str = ""
    messages: tuple[dict, ...] = ()

    def chat(self) -> list[dict]:
        return list(self.messages) if self.messages else [{"role": "user", "content": self.text}]

    def completion(self) -> str:
        return self.text if self.text else "\n".join(str(m.get("content", "")) for m in self.messages)


def _from_json(obj: object, where: str) -> Prompt:
    if isinstance(obj, dict) and isinstance(obj.get("prompt"), str) and obj["prompt"]:
        return Prompt(text=obj["prompt"])
    if isinstance(obj, dict) and isinstance(obj.get("messages"), list) and obj["messages"] and all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
            for m in obj["messages"]):
        return Prompt(messages=tuple(obj["messages"]))
    raise BadInput(f"{where}: a JSON line must be an object with a non-empty \"prompt\" string or a \"messages\" list "
                   "of {\"role\", \"content\"} strings")


def load_prompts(path: str | None) -> tuple[Prompt, ...]:
    """The prompts in ``path`` (None: the built-in set)."""
    if path is None:
        return tuple(Prompt(text=t) for t in BUILT_IN)
    p = Path(path)
    try:
        with p.open("rb") as f:
            data = f.read(MAX_PROMPTS_BYTES + 1)
    except OSError as exc:
        raise BadInput(f"--prompts {path}: cannot read it ({exc.strerror or exc}): give a text or JSON Lines file") from None
    if len(data) > MAX_PROMPTS_BYTES:
        raise BadInput(f"--prompts {path}: larger than {MAX_PROMPTS_BYTES // 2**20} MiB: give at most that")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadInput(f"--prompts {path}: not UTF-8 (byte {exc.start}): give UTF-8 text") from None
    prompts: list[Prompt] = []
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line:
            continue
        if len(prompts) == MAX_PROMPTS:
            raise BadInput(f"--prompts {path}: more than {MAX_PROMPTS} prompts: give at most that many")
        if line.startswith("{"):
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise BadInput(f"--prompts {path} line {number}: not valid JSON ({exc.msg}): give a JSON object or plain text") from None
            prompts.append(_from_json(obj, f"--prompts {path} line {number}"))
        else:
            prompts.append(Prompt(text=line))
    if not prompts:
        raise BadInput(f"--prompts {path}: no prompts in it: give one prompt per line")
    return tuple(prompts)


def parse_mix(text: str) -> tuple[tuple[str, float], ...]:
    """``urgent=0.1,interactive=0.6,batch=0.3`` as (name, weight) pairs, weights normalised to sum 1."""
    valid = f"NAME=WEIGHT pairs separated by commas, NAME one of {', '.join(PRIORITIES)}, weights >= 0 summing to > 0"
    pairs: dict[str, float] = {}
    for item in text.split(","):
        name, sep, value = item.strip().partition("=")
        name = name.strip().lower()
        if not sep or name not in PRIORITIES:
            raise BadInput(f"--priority-mix {text!r}: {item.strip()!r} is not a valid pair: use {valid}")
        if name in pairs:
            raise BadInput(f"--priority-mix {text!r}: {name} is given twice: use {valid}")
        try:
            weight = float(value)
        except ValueError:
            raise BadInput(f"--priority-mix {text!r}: {value.strip()!r} is not a number: use {valid}") from None
        if not (math.isfinite(weight) and 0 <= weight <= 1e6):
            raise BadInput(f"--priority-mix {text!r}: {value.strip()!r} is out of range: use {valid}")
        pairs[name] = weight
    total = sum(pairs.values())
    if total <= 0:
        raise BadInput(f"--priority-mix {text!r}: the weights sum to 0: use {valid}")
    return tuple((name, pairs[name] / total) for name in PRIORITIES if pairs.get(name, 0) > 0)


def pick_priority(mix: tuple[tuple[str, float], ...], rng: random.Random) -> str:
    names = [n for n, _ in mix]
    return rng.choices(names, weights=[w for _, w in mix])[0]
