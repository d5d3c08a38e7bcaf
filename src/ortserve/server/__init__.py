"""The HTTP server: the seed's API and an OpenAI-compatible API on FastAPI/uvicorn."""

from ortserve.server.app import create_app

__all__ = ["create_app"]
