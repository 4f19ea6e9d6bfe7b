"""Soak: a fleet of two real daemons under gRPC and OpenAI clients for N minutes, nodes
stopped (SIGTERM) and killed (kill -9) at random moments, then kill -9 of both.

Starts a ``redis-server`` (loopback, no persistence) and two ``suffixd serve --fleet``
nodes, a and b (embedded gemma model, LMDB with fsync, ``--http`` on a free port, data
dirs of their own); ``--no-fleet`` starts node a alone. For ``--minutes`` it runs:

* ``--clients`` gRPC threads, split between the nodes, each with its own connection,
  mixing append (unary, prompt/tool/generated/response kinds) to its sessions, speculate
  (with and without a context), streams (a SpeculateStream of a few durable steps ending
  a response), generate (short, greedy), stats (all namespaces, all pages) and bad inputs
  (~5%: token ids out of range, empty or over-long names, unknown sessions, draft sizes
  over the limit, a tail over the limit, a corrupt page token, ...);
* ``--http-clients`` threads on the nodes' OpenAI fronts (plain HTTP, httpx), alternating
  nodes: chat completions streamed or not (8-16 tokens, greedy or seeded at 0.8), short
  conversations under the session header (closed after a few turns) and requests without
  it (the daemon finds the conversation), function tools with ``tool_choice`` auto /
  required / named, ``response_format`` json_object / json_schema, text completions,
  /v1/models, /health, a stream the client hangs up on after two chunks, and ~5% bad
  requests (invalid or too deeply nested JSON, an unknown model, max_tokens < 1, no
  messages, a prompt past the context window, ...) that must get their documented 4xx;
* among those, ``--schema-share`` of the requests carry a JSON schema drawn like the
  property test's (tests/schema_strategies.py: its ORDINARY and PATHOLOGICAL leaves,
  nested the way its ``schemas`` strategy nests them) as ``response_format`` json_schema
  (streamed or not) or as a required tool's ``parameters``: each answer must be a 200
  whose finished output (finish_reason stop / tool_calls) is valid against the schema
  (``jsonschema``), or a 400 within ``--refusal-bound`` seconds;
* with the fleet, a probe thread: every ``--probe-interval`` seconds a unique random
  token sequence is appended as a response on one node (alternating a -> b and b -> a) and
  the other node is asked to draft it from its first 12 tokens until it does: the
  replication lag, end to end (p50/p99); a probe never drafted within 60 s is a failure
  (unless a node was stopped meanwhile: counted apart);
* every ``--events-every`` seconds on average (at random moments, after the warm-up),
  one node, picked at random, is stopped: SIGTERM (``--sigterm-share`` of the events; it
  must exit 0) or kill -9 (it must die of the signal). It is restarted on its data dir at
  once and, while the load goes on: every session of that node's clients must still hold
  every token a reply acknowledged before the stop (a session absent is only excused if
  its client tried to close it), and once its rebuild is done it must still draft every
  probe it had acknowledged. Calls in flight at a stop, or sent while the node is down,
  are counted apart. ``--early-share`` of the restarts are hit again, by SIGTERM or kill -9,
  at a random moment of their first ``--early-window`` seconds (start-up: the store
  opening, the trees loading, the model loading for the first requests); the checks of
  the restart after that cover both. Any other exit of a node, a non-zero exit after
  SIGTERM or a stop that hangs is a crash (the node is restarted and checked the same way).

Sessions rotate (a session is closed, its responses kept, once it holds
``--session-tokens``; an automatic session of the OpenAI front is closed once its
namespace holds ``--auto-sessions``) so the global trees fill and their budget
(``--global-budget``, small so it is reached within minutes) evicts, and the daemons'
prompt caches have a small budget too (``--prompt-cache-mb``): each node's RSS should
then be flat. Every ``--memory-interval`` seconds each node's RSS and its parts (Stats'
process memory: model weights, store, libraries, llama.cpp's context, prompt cache,
trees, malloc in use, malloc's free memory held, stacks, unattributed) are sampled
(bench/rss_watch.py), and RSS must be flat over the run's last ``--flat-window`` minutes
(at most a third of the run): its least-squares trend over them at most the larger of
``--flat-mib`` (16) and ``--flat-pct`` (2) percent of its mean there (a failure with
``--require-flat``); the trend of each part says which one grew. ``--memory-report``
writes the samples and the verdicts as markdown. The HTTP clients need httpx and
jsonschema (the ``test`` extra).

Every reply that acknowledged an append records the session's acknowledged length. At
the end both nodes are killed with SIGKILL while the clients are still running, restarted
on their data dirs, and every open session's stored length is compared with the
acknowledged one (tokens lost must be 0 on each node); once each node's rebuild is done
(Info.rebuilding false), it must still draft every probe sequence it had acknowledged
(written there, or seen replicated there); then both are stopped with SIGTERM (exit 0).

Reports requests served, errors by kind (expected for bad inputs, and unexpected: a 5xx,
a wrong status, a timeout or a broken connection on a valid request, a schema answer
that breaks its schema, a slow refusal), the schema answers (valid, unfinished, refused),
the stops and kills with what each one checked, the crashes, each node's RSS at start
(after warm-up), every minute and at the end, its peak (VmHWM of each process) against
``--rss-budget-mib``, each namespace's global tree against its budget, p50/p99 per call,
the replication lag and the load average of the machine. Exits 1 when anything failed.
Not part of CI (minutes of two cores):

    python bench/soak [--minutes 10] [--clients 12] [--http-clients 4] [--no-fleet]
                      [--no-generate] [--schema-share 0.15] [--schema-in both]
                      [--refusal-bound 5] [--events-every 120]
                      [--sigterm-share 0.5] [--early-share 0.3] [--early-window 4]
                      [--rss-budget-mib 1536] [--prompt-cache-mb 64]
                      [--memory-interval 30] [--flat-window 20] [--flat-mib 16]
                      [--flat-pct 2] [--require-flat] [--memory-report memory.md]
                      [--seed 0] [--data-dir DIR] [--json out.json]

(or ``python -m soak ...`` from bench/). The package, by what each module holds:
``nodes`` (a daemon of the soak, started with suffixd.client.launch, and its readiness),
``books`` (the tallies of calls and the acknowledged lengths), ``grpc_workers``,
``schemas`` (the property test's schemas, drawn), ``http_workers`` (the OpenAI-front
clients and their answers' checks), ``probes`` (replication probes, the trees' budgets,
the checks after a restart), ``chaos`` (the schedule of stops and kills, and the
restarts), ``run`` (the phases of a run), ``report`` and ``cli``; the memory sampling is
bench/rss_watch.py.
"""
