"""The engines that run models. Which module and class drive which backend is devices.backends.BACKENDS."""

from __future__ import annotations

import importlib

from devices.backends import BACKENDS, BackendName


def backend_class(name: BackendName | str) -> type:
    """The class that drives backend ``name``; its module (and native library) is imported only now."""
    spec = BACKENDS[BackendName.parse(name)]
    return getattr(importlib.import_module(spec.module), spec.cls)
