"""Which models are loaded under one memory plan (manager), what is asked for (spec: ModelSpec, ResidentKind), and
the loader of each model kind (loaders: one table, LOADERS).
"""
