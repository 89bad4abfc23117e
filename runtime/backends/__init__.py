"""The engines that run models. Which module and class drive which backend is devices.backends.BACKENDS."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

from devices.backends import BACKENDS, BackendName
from runtime.backends.base import Backend, Placed


def backend_class(name: BackendName | str) -> type:
    """The class that drives backend ``name``; its module (and native library) is imported only now."""
    spec = BACKENDS[BackendName.parse(name)]
    return getattr(importlib.import_module(spec.module), spec.cls)


def open_backend(name: BackendName | str, path: Path, plan: Any, placement: Placed) -> Backend:
    """Backend ``name`` on the model file ``path``, built the one way every backend is: with its memory plan (None
    where it sizes nothing by one) and the resolved placement that tells it where to run."""
    return backend_class(name)(path, plan, placement)
