"""The OpenAI-compatible HTTP front (``serve --http``): ``app`` (the Starlette app and
its uvicorn thread, ``start_http``), ``requests`` (parsing, OpenAI-style errors),
``streams`` (answers and server-sent events of a running generation),
``session_finder`` (which session a chat request continues), ``guard`` (what a request
must be before any route: its Host, a JSON content type, the bearer token),
``structured`` (tools, tool_choice and response_format: the prompt, the grammar, the
parsed reply) and ``tool_calls`` (the call formats of the model families: parse and
render).
"""
