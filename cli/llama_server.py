"""The options of the benches that run llama-server beside suffixd (--llama-server and its
settings; the draft models of a verifier/draft pair); the process itself, its start-up and
its requests are benchkit/llama_server.py's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from ..benchkit.llama_server import DRAFT_SPEC_TYPE


def llama_server_options(fn: Any) -> Any:
    """--llama-server, --spec-types, --ls-flash-attn and --ls-plain, shared by the benches."""
    fn = click.option("--ls-plain/--no-ls-plain", "ls_plain", default=True, show_default=True,
                      help="Also llama-server's plain decoding (off: only its speculative "
                           "types, to save an hour on a whole-workload run).")(fn)
    fn = click.option("--ls-flash-attn", "ls_flash_attn", default="auto", show_default=True,
                      type=click.Choice(["auto", "off", "both"]),
                      help="llama-server's -fa: its default (auto), off, or both side by "
                           "side.")(fn)
    fn = click.option("--spec-types", default=None, metavar="T1,T2",
                      help="llama-server speculative types [default: every ngram-* type].")(fn)
    fn = click.option("--llama-server", "llama_server", default=None, metavar="PATH",
                      help="Also run llama-server (plain and its n-gram speculation) side "
                           "by side.")(fn)
    return fn


def draft_model_options(fn: Any) -> Any:
    """--draft-model (suffixd's daemons), --ls-draft-model and --ls-draft-max (llama-server
    with a draft model), shared by the benches that run a verifier/draft pair."""
    fn = click.option("--ls-draft-max", "ls_draft_max", type=click.IntRange(min=1),
                      default=None, metavar="N",
                      help="With --ls-draft-model: llama-server's --spec-draft-n-max "
                           "[its default].")(fn)
    fn = click.option("--ls-draft-model", "ls_draft_model", default=None, metavar="PATH",
                      type=click.Path(exists=True, dir_okay=False, path_type=Path),
                      help="Also llama-server with this draft model (-md PATH --spec-type "
                           f"{DRAFT_SPEC_TYPE}, its own draft settings), as system "
                           "ls-draft.")(fn)
    fn = click.option("--draft-model", "draft_model", default=None, metavar="PATH",
                      type=click.Path(exists=True, dir_okay=False, path_type=Path),
                      help="The suffixd daemons' fallback draft model (serve "
                           "--draft-model PATH).")(fn)
    return fn
