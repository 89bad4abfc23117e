"""WAV files: a bounded RIFF/WAVE reader that hands out samples a block at a time.

Our own parser, not the standard library's ``wave``: that module raises a bare
RuntimeError, EOFError or struct.error on a damaged chunk header, and reads the
samples whole. Here:

* only a regular file is read: the file is opened non-blocking and checked with
  ``fstat`` (the check and the read are on one open file), so a FIFO, device,
  socket or directory is refused instead of blocking for ever;
* every chunk is bounded by the file's size, an odd-sized chunk is followed by
  its pad byte (RIFF aligns chunks to 2 bytes; a writer that left it out is
  recognised), and at most MAX_CHUNKS chunks are walked before the samples;
* the format is integer PCM (``WAVE_FORMAT_PCM``, or ``WAVE_FORMAT_EXTENSIBLE``
  with a PCM sub-format) of 8, 16, 24 or 32 bits, any channel count, at
  MIN_RATE..MAX_RATE Hz, at most MAX_SECONDS long;
* a data chunk that claims more than the file holds (an interrupted recording,
  or a streaming writer's 0xFFFFFFFF) is read up to the last whole frame present;
* samples come out as float32 mono in -1..1, mixed down, BLOCK_BYTES of the
  file at a time, so reading needs memory for one block, not for the file.

Every refusal is one :class:`BadInput` line that names the file.
"""

from __future__ import annotations

import os
import stat
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np

from runtime.errors import BadInput

MAX_SECONDS = 600
MIN_RATE, MAX_RATE = 1000, 384_000
MAX_CHUNKS = 1024  # chunks walked before the samples (real files have 2-6)
BLOCK_BYTES = 1 << 20  # of the file's samples, decoded at once
WAVE_FORMAT_PCM, WAVE_FORMAT_EXTENSIBLE = 0x0001, 0xFFFE
_FORMAT_NAMES = {0x0003: "IEEE float", 0x0006: "A-law", 0x0007: "mu-law", 0x0002: "ADPCM", 0x0011: "IMA ADPCM", 0x0055: "MP3"}
# The file's bytes, a float32 conversion and its scaled copy; 24-bit adds a 3 x int32 byte view and two int32 shifts.
_DECODE_BYTES_PER_SAMPLE = {1: 1 + 8, 2: 2 + 8, 3: 3 + 12 + 8 + 8, 4: 4 + 8}
_PCM_HINT = "give 8/16/24/32-bit integer PCM .wav files"
_KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


@dataclass(frozen=True)
class WavInfo:
    path: Path
    channels: int
    width: int  # bytes per sample
    rate: int
    frames: int  # whole frames present: the header's count, or fewer when the file is cut short
    data_offset: int  # where the samples start in the file

    @property
    def seconds(self) -> float:
        return self.frames / self.rate

    @property
    def block_frames(self) -> int:
        return max(1, BLOCK_BYTES // (self.channels * self.width))

    @property
    def block_working_bytes(self) -> int:
        """Peak memory of decoding one block: per sample its bytes and the temporaries of :func:`_decode`, per frame
        the mono mix and its float32 copy."""
        return self.block_frames * (self.channels * _DECODE_BYTES_PER_SAMPLE[self.width] + 8)


def open_regular(path: Path) -> BinaryIO:
    """``path`` opened for reading, refused unless it is a regular file (without blocking on a FIFO)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as exc:
        raise BadInput(f"{path}: cannot read the audio file ({exc.strerror or exc})") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        kind = next((name for test, name in _KINDS if test(mode)), "not a regular file")
        raise BadInput(f"{path}: is {kind}, not a WAV file; give a regular .wav file")
    return os.fdopen(fd, "rb")


class WavReader:
    """An open, checked WAV file: ``info``, then ``blocks()`` of float32 mono samples. A context manager."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self._f = open_regular(self.path)
        try:
            self.info = _parse(self._f, self.path, os.fstat(self._f.fileno()).st_size)
        except BaseException:
            self._f.close()
            raise

    def blocks(self) -> Iterator[np.ndarray]:
        """Float32 mono samples in -1..1, ``info.block_frames`` at a time, every whole frame of the file."""
        info = self.info
        frame = info.channels * info.width
        self._f.seek(info.data_offset)
        left = info.frames
        while left:
            n = min(left, info.block_frames)
            raw = self._f.read(n * frame)
            if len(raw) < n * frame:  # the file shrank after it was checked
                raise BadInput(f"{self.path}: the WAV file is truncated (it changed while being read)")
            yield _decode(raw, info.width, info.channels)
            left -= n

    def close(self) -> None:
        self._f.close()

    def __enter__(self) -> WavReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def wav_info(path: Path | str) -> WavInfo:
    """The header, checked, without reading the samples."""
    with WavReader(path) as wav:
        return wav.info


def _decode(raw: bytes, width: int, channels: int) -> np.ndarray:
    if width == 1:
        x = (np.frombuffer(raw, np.uint8).astype(np.float32) - 128.0) / 128.0
    elif width == 2:
        x = np.frombuffer(raw, "<i2").astype(np.float32) / 32768.0
    elif width == 3:
        b = np.frombuffer(raw, np.uint8).reshape(-1, 3).astype(np.int32)
        x = (((b[:, 0] | (b[:, 1] << 8) | (b[:, 2] << 16)) << 8) >> 8).astype(np.float32) / 8388608.0
    else:
        x = np.frombuffer(raw, "<i4").astype(np.float32) / 2147483648.0
    return x if channels == 1 else x.reshape(-1, channels).mean(axis=1).astype(np.float32)


def _parse(f: BinaryIO, path: Path, size: int) -> WavInfo:
    head = f.read(12)
    if len(head) < 12 or head[:4] != b"RIFF" or head[8:12] != b"WAVE":
        raise BadInput(f"{path}: not a WAV file (expected a RIFF/WAVE header); {_PCM_HINT}")
    pos, fmt = 12, None
    for _ in range(MAX_CHUNKS):
        f.seek(pos)
        header = f.read(8)
        if len(header) < 8:
            missing = "'fmt ' chunk (the sample format)" if fmt is None else "'data' chunk (the samples)"
            raise BadInput(f"{path}: not a PCM WAV file this can read (no {missing}; the file may be truncated)")
        cid, csize = header[:4], struct.unpack("<I", header[4:])[0]
        body = pos + 8
        if cid == b"data":
            if fmt is None:
                raise BadInput(f"{path}: not a PCM WAV file this can read (the samples come before their 'fmt ' chunk)")
            return _info(path, fmt, body, min(csize, size - body))
        if body + csize > size:
            raise BadInput(f"{path}: not a PCM WAV file this can read (chunk {cid!r} claims {csize} bytes at byte {body},"
                           f" past the end of the {size}-byte file)")
        if cid == b"fmt ":
            if csize < 16:
                raise BadInput(f"{path}: not a PCM WAV file this can read ('fmt ' chunk of {csize} bytes; at least 16)")
            fmt = f.read(min(csize, 40))
        pos = _next_chunk(f, body + csize, csize)
    raise BadInput(f"{path}: not a PCM WAV file this can read (more than {MAX_CHUNKS} chunks before the samples)")


def _is_chunk_id(raw: bytes) -> bool:
    return len(raw) == 4 and all(0x20 <= b < 0x7F for b in raw)


def _next_chunk(f: BinaryIO, end: int, csize: int) -> int:
    """Where the next chunk starts: after the pad byte of an odd-sized chunk, unless the writer left the pad out
    (some do) and a chunk id sits right at the end instead."""
    if not csize & 1:
        return end
    f.seek(end)
    around = f.read(5)
    return end if _is_chunk_id(around[:4]) and not _is_chunk_id(around[1:5]) else end + 1


def _info(path: Path, fmt: bytes, data_offset: int, data_bytes: int) -> WavInfo:
    tag, channels, rate, _, _, bits = struct.unpack("<HHIIHH", fmt[:16])
    if tag == WAVE_FORMAT_EXTENSIBLE and len(fmt) >= 26:
        tag = struct.unpack("<H", fmt[24:26])[0]  # the sub-format GUID starts with the format tag
    if tag != WAVE_FORMAT_PCM:
        name = _FORMAT_NAMES.get(tag, f"format tag {tag:#06x}")
        raise BadInput(f"{path}: not a PCM WAV file this can read ({name}); {_PCM_HINT}")
    width = (bits + 7) // 8
    if width not in (1, 2, 3, 4):
        raise BadInput(f"{path}: {bits}-bit samples are not supported; {_PCM_HINT}")
    if channels < 1:
        raise BadInput(f"{path}: the WAV header says {channels} channels (at least 1)")
    if not MIN_RATE <= rate <= MAX_RATE:
        raise BadInput(f"{path}: sample rate {rate} Hz is not valid ({MIN_RATE}..{MAX_RATE})")
    frames = data_bytes // (channels * width)
    if frames == 0:
        what = "is truncated (no whole sample frames)" if data_bytes > 0 else "holds no samples"
        raise BadInput(f"{path}: the WAV file {what}")
    if frames > MAX_SECONDS * rate:
        raise BadInput(f"{path}: {frames / rate:.0f} s of audio is longer than the {MAX_SECONDS} s this reads at once")
    return WavInfo(path, channels, width, rate, frames, data_offset)


def write_wav(path: Path, x: np.ndarray, rate: int) -> None:
    """16-bit mono PCM (tests, tools)."""
    data = (np.clip(x, -1.0, 1.0) * 32767).astype("<i2").tobytes()
    fmt = struct.pack("<HHIIHH", WAVE_FORMAT_PCM, 1, rate, rate * 2, 2, 16)
    body = b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt + b"data" + struct.pack("<I", len(data)) + data
    Path(path).write_bytes(b"RIFF" + struct.pack("<I", len(body)) + body)
