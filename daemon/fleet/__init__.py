"""``serve --fleet``: nodes share their global and corpus trees through one Redis Stream
per namespace. ``node`` (``Fleet``, with the protocol in its docstring) puts together
``outbox`` (the LMDB state and entry format), ``publish``, ``consume``, ``snapshot``
(trim and catch-up) and ``status`` (heartbeat, lag, metrics); ``config`` holds the options
and Redis key names.
"""
