"""``edgerun voice``: wake word -> VAD -> ASR -> LLM -> sentences -> TTS, offline, under one memory plan.

types.py (shared value types), pipeline.py (the stages and their bounded queues, barge-in, failures), sentences.py
(the sentence cutter), conversation.py (memory at URGENT priority), timing.py (per-turn events, p50/p95),
plan.py (the one memory plan), models.py (the resident models bound to the pipeline), wake.py (wake-word detection
on a stream, for the pipeline and the Wyoming server), audio_io.py (WAV/mic in, WAV/speaker out); the command is
apps/cli/voice_cmd.py, the Wyoming server wyoming_server.py.
"""
