"""The benchmark library behind `suffixd bench` and the scripts in bench/, with no click in
it (cli/bench*.py are the command line over it; tests/test_import_layers.py keeps it so):

* ``workloads``: workload files read and tokenized, an agent's turns, what fits a context;
* ``replay``: the model-free benches, a workload replayed through draft sources and the
  native tree alone;
* ``generate``: end-to-end generation through the real model, every mode turn by turn
  (plain, suffixd, prompt lookup, llama-server), its figures and verdicts;
* ``agent``: whole agent sessions in this process, over ``generate``;
* ``concurrency``: N agent sessions at once through the OpenAI endpoint, against
  llama-server ``-np N``; ``certify``: their answers judged against plain decoding;
* ``fronts``: the OpenAI endpoint against gRPC Generate on one daemon;
* ``tools``: a tool-calling agent through the endpoint, against llama-server with the
  same grammar and with its own;
* ``structured``: response_format answers against llama-server's own grammar;
* ``prefix``: new conversations sharing a system prompt (time to first token);
* ``llama_server``: llama-server as the reference (start, ask, stop; a busy machine);
* ``daemons``: a suffixd daemon for a benchmark (started, its costs measured);
* ``errors``: ``BenchError``, why a benchmark cannot run, which the command line prints.
"""
