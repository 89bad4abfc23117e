"""Which models are loaded under one memory plan, and the loader of each model kind.
"""
