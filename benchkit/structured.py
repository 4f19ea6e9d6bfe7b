"""Constrained output through the endpoint, side by side with llama-server building its own
grammar for the same request (`suffixd bench structured`): the cases, the run, its table.

Each case is a chat (prompts of our own, none of them in the tests) with a
``response_format`` (``json_object`` or a ``json_schema``):

* suffixd: ``/v1/chat/completions`` (its chat renderer, its converter, its verifier,
  drafts), greedy, each case in a namespace of its own, asked twice (the second answer is
  drafted from the first and must equal it);
* llama-server (plain decoding): the very prompt tokens the daemon renders, on
  ``/completion`` with ``json_schema`` set to the request's schema, so that llama-server
  converts it with its own ``json_schema_to_grammar`` (the measure of record of issue 34:
  not the grammar suffixd built).

Reported per case: equal or where the texts part, and both texts' starts; where they
part, the gap in the target's own logits between the two sides' tokens (a fresh
evaluation of the same context): under ``certify.NEAR_TIE_GAP`` it is a near-tie that
batch-shape rounding decides, not a different grammar; and how many cases are equal.
Both texts are also checked as JSON (whether each parses and validates against the
schema).
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the openai package is a benchmark dependency, imported where it runs
    from openai.types.chat import ChatCompletionMessageParam
    from openai.types.chat.completion_create_params import ResponseFormat

# (name, user message, response_format schema or None for json_object)
CASES: list[tuple[str, str, dict[str, Any] | None]] = [
    ("json_object_concert", "Describe one concert at a stadium as a JSON object.", None),
    ("json_object_query", "Give the SQL query that lists singers older than 30, as JSON.",
     None),
    ("sql_and_tables", "Which SQL counts the stadiums, and which tables does it read?", {
        "type": "object", "properties": {"sql": {"type": "string"},
                                         "tables": {"type": "array", "items": {"type": "string"}}},
        "required": ["sql", "tables"]}),
    ("person_record", "Make up a record for a singer from France.", {
        "type": "object", "properties": {
            "name": {"type": "string"}, "age": {"type": "integer", "minimum": 16},
            "country": {"type": "string"}, "is_male": {"type": "boolean"}},
        "required": ["name", "age", "country", "is_male"]}),
    ("status_enum", "Is the query 'SELECT * FROM singer' valid? Answer with a status.", {
        "type": "object", "properties": {
            "status": {"enum": ["valid", "invalid", "unknown"]},
            "reason": {"type": "string"}}, "required": ["status", "reason"]}),
    ("steps_list", "Plan the steps to find the youngest singer.", {
        "type": "object", "properties": {"steps": {"type": "array", "items": {
            "type": "object", "properties": {"n": {"type": "integer"},
                                             "action": {"type": "string"}},
            "required": ["n", "action"]}}}, "required": ["steps"]}),
]


def run_structured(max_tokens: int, model: str | None, threads: int,
                   llama_server: str) -> dict[str, Any]:
    """Every case of ``CASES`` to suffixd's endpoint (twice: plain, then drafted) and to
    the ``llama_server`` binary (its own grammar from the schema); the figures as one JSON
    object."""
    import openai

    from ..daemon.generation.certify import NEAR_TIE_GAP
    from ..daemon.generation.chat import ChatRenderer
    from ..daemon.generation.verifier import Verifier
    from ..daemon.model import resolve_model_path
    from .daemons import start_daemon, wait_measured
    from .llama_server import LlamaServer

    model_path = resolve_model_path(model)
    renderer_v = Verifier(model_path, n_ctx=512, n_slots=1, n_threads=1)
    renderer = ChatRenderer(renderer_v)
    tmp = Path(tempfile.mkdtemp(prefix="suffixd-bench-structured-"))
    daemon = start_daemon(tmp / "data", model, threads, 4096)
    server = LlamaServer(llama_server, model_path, threads=threads, n_ctx=4096,
                         flash_attn="off")  # as suffixd's verifier: equal numerics
    rows: list[dict[str, Any]] = []
    try:
        wait_measured(daemon.proc, daemon.target)
        server.wait_ready()
        oai = openai.OpenAI(base_url=daemon.http, api_key="none", max_retries=0, timeout=600)
        pieces = [renderer_v.token_bytes(t) for t in range(renderer_v.vocab_size)]
        for name, question, schema in CASES:
            messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": question}]
            fmt: ResponseFormat = {"type": "json_object"} if schema is None else {
                "type": "json_schema", "json_schema": {"name": name, "schema": schema}}
            answers = []
            for attempt in ("plain", "drafted"):
                resp = oai.chat.completions.create(
                    model="default", messages=messages, max_tokens=max_tokens,
                    temperature=0, response_format=fmt,
                    extra_headers={"X-Suffixd-Namespace": f"structured-{name}",
                                   "X-Suffixd-Session": f"{name}-{attempt}"})
                answers.append((resp.choices[0].message.content or "",
                                (resp.model_extra or {}).get("suffixd", {})))
            prompt = renderer.tokens(messages)
            turn = server.complete(prompt, max_tokens,
                                   json_schema=schema if schema is not None else {})
            theirs = renderer_v.detokenize(turn.tokens)
            ours = answers[0][0]
            part = next((i for i, (a, b) in enumerate(zip(ours, theirs, strict=False))
                         if a != b), min(len(ours), len(theirs)))
            tie = None if ours == theirs else _parting_gap(
                renderer_v, pieces, prompt, turn.tokens, ours.encode())
            rows.append({
                "case": name, "equal": ours == theirs, "parting_gap": tie,
                "near_tie": tie is not None and abs(tie) < NEAR_TIE_GAP,
                "drafted_equal": answers[1][0] == ours,
                "drafted_accepted": int(answers[1][1].get("accepted", 0)),
                "parts_at_char": None if ours == theirs else part,
                "suffixd": ours, "llama_server": theirs,
                "suffixd_json": _json_state(ours, schema),
                "llama_server_json": _json_state(theirs, schema),
            })
    finally:
        server.close()
        daemon.stop(60)
        renderer_v.close()
        shutil.rmtree(tmp, ignore_errors=True)
    return {"cases": rows, "equal": sum(r["equal"] for r in rows),
            "near_ties": sum(r["near_tie"] for r in rows), "of": len(rows),
            "max_tokens": max_tokens}


def structured_lines(out: dict[str, Any]) -> list[str]:
    """``run_structured``'s figures as the text table."""
    from ..daemon.generation.certify import NEAR_TIE_GAP

    rows, max_tokens = out["cases"], out["max_tokens"]
    lines = [f"greedy response_format answers, {max_tokens} tokens: suffixd endpoint vs "
             f"llama-server's own grammar (/completion json_schema)"]
    for r in rows:
        verdict = "equal" if r["equal"] else (
            f"part at char {r['parts_at_char']}, "
            + (f"near-tie (gap {r['parting_gap']:.3f})" if r["near_tie"]
               else f"NOT a near-tie (gap {r['parting_gap']:.3f})"))
        lines.append(f"  {r['case']:<22} {verdict:<42} drafted repeat "
                     f"{'equal' if r['drafted_equal'] else 'DIFFERS'} "
                     f"({r['drafted_accepted']} accepted)")
        if not r["equal"]:
            lines.append(f"      suffixd:      {r['suffixd'][:100]!r} [{r['suffixd_json']}]")
            lines.append(f"      llama-server: {r['llama_server'][:100]!r} "
                         f"[{r['llama_server_json']}]")
    lines.append(f"equal: {out['equal']} of {len(rows)}; parted at a near-tie of llama.cpp's "
                 f"own logits (under {NEAR_TIE_GAP}): {out['near_ties']}")
    return lines


def _parting_gap(verifier: Any, pieces: list[bytes], prompt: list[int], theirs: list[int],
                 ours: bytes) -> float:
    """Where suffixd's text ``ours`` leaves llama-server's tokens ``theirs``: the smallest
    gap, in the target's own logits (a fresh evaluation of the same context), between
    llama-server's token and a token that writes suffixd's text past the point where the
    two agree. suffixd's token ids are not in the answer, so every position whose rivals
    reach past the agreement is looked at (tokens rarely span more than a few of them):
    where suffixd left, the gap is at most the one reported."""
    theirs_text = b"".join(pieces[t] for t in theirs)
    agree = next((i for i, (a, b) in enumerate(zip(ours, theirs_text, strict=False))
                  if a != b), min(len(ours), len(theirs_text)))
    best = float("inf")
    done = b""
    for k, tok in enumerate(theirs):
        if len(done) > agree:
            break
        rest = ours[len(done):]
        here = not rest.startswith(pieces[tok])  # the texts part inside this token
        # a rival writes suffixd's text; before the token where the texts part, only a
        # longer one that reaches past the agreement can be where suffixd left
        rivals = [t for t, p in enumerate(pieces) if t != tok and p and rest.startswith(p)
                  and (here or len(done) + len(p) > agree)]
        if rivals:
            row = verifier.next_logits(list(prompt) + list(theirs[:k]))
            rival = max(rivals, key=lambda t: float(row[t]))
            gap = float(row[tok] - row[rival])
            best = gap if abs(gap) < abs(best) else best
        if here:
            break
        done += pieces[tok]
    return best


def _json_state(text: str, schema: dict[str, Any] | None) -> str:
    try:
        value = json.loads(text)
    except ValueError:
        return "not closed (max tokens) or not JSON"
    try:
        import jsonschema
    except ImportError:  # the test extra: without it, parsing is what is reported
        return "parses"
    try:
        jsonschema.validate(value, schema or {"type": "object"})
    except jsonschema.ValidationError as exc:
        return f"breaks the schema: {exc.message}"
    return "valid"
