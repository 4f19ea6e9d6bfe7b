"""Daemon benchmarks: RPC throughput, restart time, durable ingest rate, kill -9 crash test.

    python bench/daemon_bench.py rpc --clients 16 --seconds 30 [--procs 4]
    python bench/daemon_bench.py rpc --mode unary --mode stream --mode stream-deferred
    python bench/daemon_bench.py loop --clients 8 --steps 500 --mode stream
    python bench/daemon_bench.py loop --clients 16 --seconds 30 --procs 2 --async --mode stream
    python bench/daemon_bench.py loop --clients 16 --seconds 30 --procs 2 --async --rate 3000
    python bench/daemon_bench.py restart --tokens 5000000
    python bench/daemon_bench.py crash --rounds 3

Each starts a real `suffixd serve` subprocess on a temporary data dir (Unix socket, real
LMDB with fsync, embedded gemma tokenizer) and prints one JSON object per result.

rpc: each client replays spider_dev agent turns (tokenized with the daemon's vocabulary) as
an external verifier would: open a session, append the prompt, then per step Speculate on
the session's tail and Append (kind generated) the accepted tokens plus one bonus token, so
every Append is durable. Reported: speculate RPC/s, all RPC/s, p50/p99 latency per method,
and the daemon's CPU time per speculate (from /proc). Modes (one fresh daemon each, run one
after the other so they compare side by side):

* ``unary``: Speculate + Append RPCs per step;
* ``step``: one Speculate RPC carrying the append per step;
* ``stream``: one SpeculateStream per session (Client.stepper), one message per step, each
  step's append committed before its reply;
* ``stream-deferred``: the same with defer_commit (replies do not wait for the fsync; the
  final response append still does).

loop: the per-step cost alone. Each client opens one session with 64 tokens and runs
``--steps`` steps (or ``--seconds``) of one token (cycling through those 64, so drafts
match), all starting together: steps/s, step latency (p50/p99/mean: a step is one stream
message, one Speculate carrying the append, or Speculate + Append), and the client's and
the daemon's CPU time per step. No prompts, no session churn. Clients are threads in
``--procs`` processes (default 1), or with ``--async`` AsyncClient tasks on one event loop
per process (the client side of a 2-core machine shares the cores with the daemon).

That is a closed loop: 16 clients with no think time keep 16 steps in flight, so at X
steps/s their mean latency is 16/X (Little's law): it measures capacity, and its latency
is tied to it. ``--rate R`` runs an open loop instead: the aggregate R steps/s spread
evenly over the clients (``--poisson``: Poisson arrivals), each client sending its steps
when they are due whatever the daemon does, one at a time on its stream (a verifier
cannot send a step before the previous draft came back), so a client whose previous reply
is late sends at once. Latency counts from the due time, so a stalled daemon shows in the
percentiles instead of in fewer samples (no coordinated omission); also reported: the
achieved rate, the service time (send to reply), how late the sends were against their
schedule, and the steps still unsent when the schedule ended plus a grace period.

``--keep-session``: each client keeps one session for the whole run (an agent's
conversation: per turn append the prompt, decode the response) instead of opening and
closing a session per turn. ``--prompt-tokens N``: prompts of at most N tokens (default
2,048), so the per-step loop rather than ingesting prompts dominates.
"""

from __future__ import annotations

# The command line only: the benchmarks live beside it (daemon_rpc, daemon_loop,
# daemon_durability, on daemon_harness). Run as a script, this folder is sys.path[0],
# so they import by their plain names (spawned client processes get the same sys.path).
from daemon_durability import bench_crash, bench_restart
from daemon_loop import bench_loop
from daemon_rpc import bench_rpc


def main() -> None:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("rpc")
    r.add_argument("--clients", type=int, default=16)
    r.add_argument("--seconds", type=float, default=30)
    r.add_argument("--procs", type=int, default=4, help="client processes sharing the clients")
    r.add_argument("--turns", type=int, default=400)
    r.add_argument("--serve-arg", action="append", default=[], help="extra `serve` argument")
    r.add_argument("--step", action="store_true",
                   help="one Speculate-with-append RPC per step (same as --mode step)")
    r.add_argument("--stream", action="store_true",
                   help="one SpeculateStream per session (same as --mode stream)")
    r.add_argument("--prompt-tokens", type=int, default=2048,
                   help="prompt per turn: the last N tokens of the turn's context (max 2048)")
    r.add_argument("--keep-session", action="store_true",
                   help="one session per client for the whole run (per turn: append the "
                   "prompt, decode the response) instead of one session per turn")
    r.add_argument("--mode", action="append", default=[],
                   choices=["unary", "step", "stream", "stream-deferred"],
                   help="repeatable; each mode on a fresh daemon, one after the other")
    lp = sub.add_parser("loop")
    lp.add_argument("--clients", type=int, default=8)
    lp.add_argument("--steps", type=int, default=500, help="steps per client")
    lp.add_argument("--seconds", type=float, default=0.0,
                    help="run each mode this long instead of a number of steps")
    lp.add_argument("--procs", type=int, default=1, help="client processes sharing the clients")
    lp.add_argument("--async", dest="use_async", action="store_true",
                    help="AsyncClient: each process runs its clients as tasks on one loop")
    lp.add_argument("--mode", action="append", default=[],
                    choices=["unary", "step", "stream", "stream-deferred"])
    lp.add_argument("--serve-arg", action="append", default=[], help="extra `serve` argument")
    lp.add_argument("--rate", type=float, default=0.0,
                    help="open loop: aggregate steps/s, spread over the clients, each sending "
                    "on its own schedule; latency counts from each step's due time "
                    "(needs --seconds)")
    lp.add_argument("--poisson", action="store_true",
                    help="with --rate: Poisson arrivals per client instead of evenly spaced")
    lp.add_argument("--samples-out", metavar="PREFIX",
                    help="with --rate: write every step (client, due s, latency s, service s) "
                    "to PREFIX.MODE.jsonl, to see when the slow steps happened")
    s = sub.add_parser("restart")
    s.add_argument("--tokens", type=int, default=5_000_000)
    s.add_argument("--batch-tokens", type=int, default=65536)
    c = sub.add_parser("crash")
    c.add_argument("--rounds", type=int, default=3)
    c.add_argument("--writers", type=int, default=8)
    a = ap.parse_args()
    if a.cmd == "rpc":
        modes = a.mode + ["step"] * a.step + ["stream"] * a.stream
        modes = [m + "+keep" * a.keep_session for m in modes or ["unary"]]
        bench_rpc(a.clients, a.seconds, a.procs, a.turns, a.serve_arg, modes, a.prompt_tokens)
    elif a.cmd == "loop":
        bench_loop(a.clients, a.steps, a.mode or ["unary", "step", "stream", "stream-deferred"],
                   a.serve_arg, a.seconds, a.procs, a.use_async, a.rate, a.poisson,
                   a.samples_out)
    elif a.cmd == "restart":
        bench_restart(a.tokens, a.batch_tokens)
    else:
        bench_crash(a.rounds, a.writers)


if __name__ == "__main__":
    main()
