"""``edgerun serve``: an OpenAI-compatible HTTP server over the runtime (HTTP only; the models, the scheduler and
the caches are runtime's). Build a :class:`apps.server.state.ServerState` from a
:class:`apps.server.config.ServeConfig`, then :func:`apps.server.app.create_app` and run it with uvicorn."""
