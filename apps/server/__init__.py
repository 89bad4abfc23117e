"""edgerun serve: the HTTP layer (Starlette on uvicorn) over the runtime's scheduler, engine and residency manager."""
