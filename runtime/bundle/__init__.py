"""Bundles: the manifest and its fields, strict JSON, each kind's spec, the store, stamps, resolving names,
recipes, and opening the verified files.
"""
