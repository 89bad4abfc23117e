"""Serving many requests at once: the continuous-batching engine, priority scheduling, the classify batcher, the
result cache and content safety.
"""
