"""The gRPC servicers, protobuf in and out, errors to status codes: ``suffixd_service``
(suffixd.v1.Suffixd: sessions, appends, drafts, stats), ``generate_service``
(suffixd.v1.Generator over ``generation``), ``corpus_service`` (suffixd.v1.Corpus: warm).
Each has ``register(server, engine)``; the server (``server``) hosts them.
"""
