"""`warpdecode serve`: an OpenAI-compatible HTTP server over the decoding engine.

protocol.py reads and checks request bodies (and writes OpenAI's error shape), scheduler.py owns the
model in one thread and decodes queued requests, metrics.py holds the Prometheus metrics, app.py is
the ASGI application and server.py runs it under uvicorn. See docs/serve.md.
"""
