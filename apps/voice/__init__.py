"""``edgerun voice``: wake word -> VAD -> ASR -> LLM -> sentences -> TTS, offline, under one memory plan.

Shared value types are in :mod:`apps.voice.types`; the stage pipeline in :mod:`apps.voice.pipeline`.
"""
