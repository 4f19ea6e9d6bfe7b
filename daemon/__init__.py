"""The suffixd daemon, one folder per part; each depends only on the parts listed below it
(tests/test_import_layers.py keeps it so):

* ``server``: ``suffixd serve`` put together: configuration, data directory, start-up
  checks, the gRPC server and its auth, Prometheus metrics, shutdown;
* ``grpc_api``, ``http_api``, ``fleet``: the gRPC servicers, the OpenAI-compatible HTTP
  front, and the nodes' shared trees through Redis Streams;
* ``generation``: the colocated llama.cpp verifier and the one generation path under both
  fronts (KV slots, sampling, cost measurement, certification, draft model, chat);
* ``engine``: the daemon's state without gRPC or a model: sessions, ingest, drafting,
  counters, budgets, trees, corpus documents;
* ``model``: the GGUF file, how llama.cpp loads it, its tokenizer;
* ``common``: limits and defaults, the engine's errors, structured log lines.
"""
