"""Give the C heap's free memory back to the system after a model's large transient work.

glibc keeps freed memory in its heaps: the main one, and one arena per thread that allocated (ONNX Runtime's and
CTranslate2's worker threads each get one). What a speech model keeps resident after working then depends on which
threads freed what, and in which order: Piper's voice kept 16-84 MiB after the same rounds of sentences, over runs of
scripts/speech_memory.py --assistant. ``malloc_trim(0)`` returns the free pages of every arena (the middle of a heap
too, by madvise), so what is kept is what is in use, run after run: a bound the memory plan can count.

It costs a walk over the free chunks and a madvise of the free pages: about 9 ms when 60 MiB go back, under 1 ms when
nothing does (x86_64, glibc 2.36). Piper's voice trims after handing each sentence's audio on, so it is not in the
first audio's latency. On a C library without it (musl, macOS) ``trim`` does nothing and says so."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import threading

_lock = threading.Lock()  # one trim at a time: two threads walking the arenas gain nothing


@functools.cache
def _malloc_trim():  # -> the C function, or None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        fn = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    fn.argtypes, fn.restype = [ctypes.c_size_t], ctypes.c_int
    return fn


def available() -> bool:
    return _malloc_trim() is not None


def trim() -> bool:
    """Return the free memory of the C heap's arenas to the system; False where the C library cannot."""
    fn = _malloc_trim()
    if fn is None:
        return False
    with _lock:
        fn(0)
    return True
