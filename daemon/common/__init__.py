"""What every part of the daemon shares, importing nothing of it:

* ``config``: the limits enforced on every request (``Limits``), the cache's settings
  (``CacheConfig``), the default data directory and socket;
* ``errors``: ``EngineError`` and its kinds, each tied to the gRPC status code the
  servicers answer with;
* ``logs``: one line per event (``event``), ``key=value`` or JSON (``configure``).
"""
