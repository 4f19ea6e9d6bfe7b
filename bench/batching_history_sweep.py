"""How far a drafted step's logits move with how its history was batched, over every split:
the sweep behind tests/test_verifier_batch_invariance.py's bounds, with and without flash
attention.

    python bench/batching_history_sweep.py [--flash off,on]
    PYTHONPATH=build/llama-cpp-avx2 python bench/batching_history_sweep.py

On the test's fixture (a spider_dev conversation as the verifier held it), the history's
last 1-63, 64, 80 and 96 tokens are evaluated as a batch of their own, then the drafted
step; each step's logits are compared with those after the history in one chunk. Prints,
per setting, the largest move of a row's top logit and of any logit, how many rows' best
token flipped, and the worst splits. ``on`` needs the build of scripts/install_llama_cpp.sh
(the verifier refuses flash attention elsewhere).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SPLITS = [*range(1, 64), 64, 80, 96]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--flash", default="off,on", help="settings of SUFFIXD_FLASH_ATTN")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))  # the test's fixture and its helper
    from suffixd.daemon.generation.verifier import Verifier
    from suffixd.daemon.model import embedded_model_path

    # the test's own fixture and helper (imported by name: the tests are not type-checked)
    test = importlib.import_module("tests.test_verifier_batch_invariance")
    _step_rows = test._step_rows
    case = json.loads(test.FIXTURE.read_text())
    history, batch, outputs = case["history"], case["batch"], case["outputs"]
    chunks = len(history) // 512
    kept, rest = chunks * 512, len(history) % 512
    for flash in args.flash.split(","):
        os.environ["SUFFIXD_FLASH_ATTN"] = flash
        v = Verifier(embedded_model_path(), n_threads=args.threads,
                     n_ctx=len(history) + 64, n_slots=1)
        try:
            v._llama_cpp.llama_memory_seq_rm(v._mem, 0, -1, -1)
            for i in range(chunks):
                v._decode(0, history[i * 512 : (i + 1) * 512], i * 512, all_logits=False)
            ref = _step_rows(v, history, kept, [rest], batch, outputs)
            worst: list[tuple[float, int, int]] = []
            any_logit, flips = 0.0, 0
            for last in SPLITS:
                got = _step_rows(v, history, kept, [rest - last, last], batch, outputs)
                for row in range(outputs):
                    top = int(np.argmax(ref[row]))
                    flips += int(np.argmax(got[row])) != top
                    worst.append((abs(float(got[row][top] - ref[row][top])), last, row))
                    any_logit = max(any_logit, float(np.abs(got[row] - ref[row]).max()))
            worst.sort(reverse=True)
            print(f"flash attention {'on' if v.flash_attention else 'off'}: top logit "
                  f"{worst[0][0]:.2f}, any logit {any_logit:.2f}, {flips} argmax flipped; "
                  "worst (drift, tokens apart, row): "
                  + ", ".join(f"({d:.2f}, {n}, {r})" for d, n, r in worst[:4]), flush=True)
        finally:
            v.close()


if __name__ == "__main__":
    main()
