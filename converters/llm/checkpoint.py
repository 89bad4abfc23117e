"""A Hugging Face checkpoint directory, checked before anything is converted.

Reads ``config.json``, finds the weights (``model.safetensors`` or the shards
listed in ``model.safetensors.index.json``), and checks that the tensors are
exactly those the architecture needs, with the shapes config.json implies.
Tensors are then streamed one at a time (:meth:`HFCheckpoint.tensors`).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from converters.llm.architectures import Arch, HParams, expected_shapes, find_arch, transform
from converters.llm.safetensors_file import SafetensorsFile, TensorRef
from converters.llm.vocab import Vocab, load_vocab
from runtime.errors import BadInput

IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)  # buffers some exporters save; recomputed by llama.cpp


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BadInput(f"{path}: not readable JSON ({exc})"[:300]) from None


@dataclass
class HFCheckpoint:
    directory: Path
    config: dict[str, Any]
    arch: Arch
    hp: HParams
    files: list[SafetensorsFile] = field(default_factory=list)
    refs: dict[str, tuple[int, TensorRef]] = field(default_factory=dict)  # HF name -> (file index, ref)

    @classmethod
    def open(cls, directory: Path) -> HFCheckpoint:
        directory = Path(directory)
        if not directory.is_dir():
            raise BadInput(f"{directory}: not a directory (expected a Hugging Face checkpoint folder)")
        cfg_path = directory / "config.json"
        if not cfg_path.is_file():
            raise BadInput(f"{directory}: config.json is missing")
        config = _read_json(cfg_path)
        if not isinstance(config, dict):
            raise BadInput(f"{cfg_path}: top level is not a JSON object")
        arch = find_arch(config, str(cfg_path))
        ckpt = cls(directory, config, arch, HParams.from_config(config, str(cfg_path)))
        try:
            ckpt._open_weights()
            ckpt._check()
        except BaseException:
            ckpt.close()
            raise
        return ckpt

    def _weight_files(self) -> list[Path]:
        index = self.directory / "model.safetensors.index.json"
        if index.is_file():
            data = _read_json(index)
            try:
                names = sorted(set(data["weight_map"].values()))
            except (KeyError, TypeError, AttributeError):
                raise BadInput(f"{index}: no weight_map") from None
            paths = [self.directory / n for n in names]
            for p in paths:
                if p.parent != self.directory or p.name in ("", ".", ".."):
                    raise BadInput(f"{index}: shard name {p.name!r} is not a plain file name")
                if not p.is_file():
                    raise BadInput(f"{index}: shard {p.name} is missing")
            return paths
        single = self.directory / "model.safetensors"
        if single.is_file():
            return [single]
        others = [p.name for p in self.directory.glob("*.bin")] + [p.name for p in self.directory.glob("*.pt*")]
        hint = f" (found {', '.join(others)}: re-save it with safe_serialization=True)" if others else ""
        raise BadInput(f"{self.directory}: no weights: model.safetensors or model.safetensors.index.json is missing{hint}")

    def _open_weights(self) -> None:
        for path in self._weight_files():
            f = SafetensorsFile(path)
            self.files.append(f)
            for name, ref in f.tensors.items():
                if name in self.refs:
                    raise BadInput(f"{path}: tensor {name!r} appears in two weight files")
                self.refs[name] = (len(self.files) - 1, ref)

    def _check(self) -> None:
        want = expected_shapes(self.arch, self.hp)
        have = {n for n in self.refs if not n.endswith(IGNORED_SUFFIXES)}
        if self.hp.tie_embeddings:
            have.discard("lm_head.weight")  # some exporters save the tied copy too; llama.cpp reuses token_embd
        missing = sorted(set(want) - have)
        if missing:
            raise BadInput(f"{self.directory}: weights lack {len(missing)} tensor(s) that config.json implies, e.g. {missing[0]!r}")
        extra = sorted(have - set(want))
        if extra:
            raise BadInput(f"{self.directory}: unexpected tensor {extra[0]!r} ({len(extra)} in all) for {self.arch.hf_class}")
        for name, shape in want.items():
            got = self.refs[name][1].shape
            if got != shape:
                raise BadInput(f"{self.directory}: tensor {name} has shape {list(got)}, config.json implies {list(shape)}")

    def vocab(self) -> Vocab:
        """The checkpoint's tokenizer, padded to the embedding's rows."""
        return load_vocab(self.directory, self.hp.vocab_size, space_prefix=self.arch.spm_space_prefix)

    def names(self) -> list[str]:
        """HF names of the tensors to convert, in file order."""
        want = expected_shapes(self.arch, self.hp)
        return [n for n in self.refs if n in want]

    def tensors(self) -> Iterator[tuple[str, np.ndarray]]:
        """(HF name, float32 array in llama.cpp's layout), one at a time; refuses NaN/Inf."""
        for name in self.names():
            i, _ = self.refs[name]
            w = transform(self.arch, self.hp, name, self.files[i].read(name))
            if not np.isfinite(w).all():
                bad = int(np.size(w) - np.isfinite(w).sum())
                raise BadInput(f"{self.files[i].path}: tensor {name} has {bad} NaN/Inf value(s)")
            yield name, w

    def close(self) -> None:
        for f in self.files:
            with contextlib.suppress(Exception):
                f.close()
        self.files.clear()

    def __enter__(self) -> HFCheckpoint:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
