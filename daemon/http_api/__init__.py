"""The OpenAI-compatible HTTP front (``serve --http``): ``app`` (the Starlette app and
its uvicorn thread, ``start_http``), ``requests`` (parsing, OpenAI-style errors),
``streams`` (answers and server-sent events of a running generation) and
``session_finder`` (which session a chat request continues).
"""
