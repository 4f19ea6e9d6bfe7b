"""SuffixDraftModel inside llama_cpp.Llama on a repetitive prompt: draft-model calls, tokens
drafted and wall time, for the draft model as it was (no session, the daemon's own
drafter) and as it is (a session of its own, drafts sized for a flat or a CPU verifier).

    suffixd serve --data-dir /tmp/sd &   # the model loaded (wait for its cost measurement)
    python bench/suffix_draft_model.py --address unix:/tmp/sd/suffixd.sock
"""

from __future__ import annotations

import argparse
import time
import uuid
from typing import Any

import llama_cpp
import numpy as np
import numpy.typing as npt
from suffixd.client import Client, SuffixDraftModel
from suffixd.daemon.model import embedded_model_path, llama_defaults

PROMPT = "red, green, blue, yellow. " * 6 + "red, green,"


class Counted(SuffixDraftModel):
    calls = 0
    drafted = 0

    def __call__(self, input_ids: npt.NDArray[np.intc], /, **kwargs: Any) -> npt.NDArray[np.intc]:
        out = super().__call__(input_ids, **kwargs)
        self.calls += 1
        self.drafted += len(out)
        return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--address", default=None)
    ap.add_argument("--max-tokens", type=int, default=64)
    args = ap.parse_args()
    variants: list[tuple[str, dict[str, Any]]] = [
        ("before: no session, the daemon's drafter", {"session_id": False,
                                                      "cost_profile": "daemon"}),
        ("now: defaults (own session, flat profile)", {}),
        ("now: cost_profile='cpu'", {"cost_profile": "cpu"}),
    ]
    for name, kw in variants:
        client = Client(args.address)
        dm = Counted(client, namespace=f"bench-dm-{uuid.uuid4().hex[:6]}", max_tokens=16, **kw)
        with llama_defaults():
            llm = llama_cpp.Llama(model_path=str(embedded_model_path()), n_ctx=512,
                                  verbose=False, seed=1, draft_model=dm)
        t0 = time.perf_counter()
        llm(PROMPT, max_tokens=args.max_tokens, temperature=0.0)
        dt = time.perf_counter() - t0
        print(f"{name}: {dm.calls} draft calls, {dm.drafted} tokens drafted, "
              f"{dt:.2f} s for {args.max_tokens} tokens")
        dm.close()
        client.close()


if __name__ == "__main__":
    main()
