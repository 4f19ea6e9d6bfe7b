"""``suffixd serve`` put together: ``serve`` (``run``, ``build_server``), ``serve_config``
(``ServeConfig``, listeners), ``datadir`` (the data directory's lock and modes),
``startup`` (checks before the model loads, the preload), ``loop_server`` (one grpc.aio
server on its own thread) with ``auth`` (bearer tokens on TCP), and ``metrics``
(Prometheus).
"""
