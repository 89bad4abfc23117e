"""Speech: recognition (Whisper), voice activity (Silero), synthesis (Piper), resampling, and the files and
sessions of speech models.
"""
