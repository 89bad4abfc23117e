"""The LLM: load within a budget, chat templates and tokens, generation, KV and prefix cache, speculation, the
memory plan.
"""
