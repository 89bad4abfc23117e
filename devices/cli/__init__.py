"""Subcommands owned by devices/: ``edgerun doctor`` and ``edgerun serial-peer`` (dispatched by runtime.cli)."""
