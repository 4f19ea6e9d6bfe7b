"""suffixd daemon: gRPC servicers, engine, llama.cpp verifier, corpus watcher, metrics."""
