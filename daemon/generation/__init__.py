"""Generation with the colocated llama.cpp verifier:

* ``pipeline``: ``Generation`` and ``GenerationRequest``, the one path under both fronts
  (render, append the prompt, verify drafts step by step, store the response);
* ``verifier``: ``Verifier``, the model, ``llama_decode`` and the step loop, with
  ``kv_slots`` (a KV slot per session, prefix reuse, rollback), ``sampling`` (lossless
  speculative sampling), ``cost_measure`` (the batch cost profile), ``certify``
  (greedy equality up to near-ties) and ``grammar`` (constrained decoding; a JSON
  schema becomes GBNF in ``schema_grammar``, measured against ``GrammarLimits`` by
  ``schema_limits``);
* ``cost_store`` (the measured profile kept in the data dir, reused at the next start);
* ``draft_model`` (the fallback drafter), ``chat`` (chat templates).

It calls the engine through the object it is handed, never importing it.
"""
