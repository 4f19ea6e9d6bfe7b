"""`suffixd generate`: stream a generation from the daemon's verifier.

Chat memory: with ``--chat --session S`` the conversation continues from one call to
the next. The history (the user's messages and the model's answers) is kept by this
command in ``<data dir>/chats/<namespace>/<session>.json`` (the data dir of
``--data-dir``, else the default one), and sent whole with each turn; the daemon's
session reuses its KV cache for the part it has seen, so only the new turn is
evaluated. ``--new`` starts the conversation over; without ``--session`` a prompt is a
one-off (nothing remembered).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import urllib.parse
from pathlib import Path
from typing import Any

import click
from suffixd.cli.common import connect, connection_options, fail


def history_path(data_dir: str | None, namespace: str, session: str) -> Path:
    from suffixd.daemon.common.config import default_data_dir

    base = Path(data_dir).absolute() if data_dir else default_data_dir()
    # Any session id is a safe file name once quoted ("/" included).
    name = urllib.parse.quote(session, safe="") + ".json"
    return base / "chats" / urllib.parse.quote(namespace, safe="") / name


def load_history(path: Path) -> list[dict[str, str]]:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return []
    except (OSError, ValueError) as exc:
        raise click.ClickException(f"cannot read the chat history {path}: {exc} "
                                   "(--new starts over)") from None
    msgs = data.get("messages") if isinstance(data, dict) else None
    if not isinstance(msgs, list):
        raise click.ClickException(f"{path} is not a chat history (--new starts over)")
    return msgs


def save_history(path: Path, messages: list[dict[str, str]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"messages": messages}, ensure_ascii=False, indent=1))
    os.replace(tmp, path)


class LoadProgress:
    """Says what the daemon is doing while the first generate waits for the model to load
    (polls GeneratorStatus until the first chunk arrives)."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.done = threading.Event()
        self.thread: threading.Thread | None = None
        self.tty = sys.stderr.isatty()
        self.shown = False
        self._last = ""

    def start(self) -> None:
        try:
            st = self.client.generator_status(timeout=5)
        except Exception:  # an older daemon, or none: Generate itself will say
            return
        if st["loaded"] or not st["model"] or st["phase"].startswith("failed"):
            return  # ready, no model, or a failed load that Generate itself reports
        self._show(st, first=True)
        self.thread = threading.Thread(target=self._poll, daemon=True)
        self.thread.start()

    def _show(self, st: dict[str, Any], first: bool = False) -> None:
        phase = st["phase"] or "loading model"
        line = (f"suffixd: {phase}, {st['phase_seconds']:.0f} s ... "
                "(first use after start-up: the model load, seconds)")
        if self.tty:
            sys.stderr.write("\r\x1b[K" + line)
        elif first or phase != self._last:
            sys.stderr.write(line + "\n")
        self._last = phase
        sys.stderr.flush()
        self.shown = True

    def _poll(self) -> None:
        while not self.done.wait(0.5):
            try:
                st = self.client.generator_status(timeout=5)
            except Exception:
                return
            if st["loaded"] or st["phase"].startswith("failed"):
                return
            self._show(st)

    def stop(self) -> None:
        self.done.set()
        if self.thread is not None:
            self.thread.join(2)
        if self.shown:
            sys.stderr.write("\r\x1b[K" if self.tty else "suffixd: model ready\n")
            sys.stderr.flush()
            self.shown = False


def format_totals(t: dict[str, Any], finish_reason: str | None) -> str:
    """The --stats line: speed and time to first token, not raw seconds."""
    n = int(t.get("completion_tokens", 0))
    total = float(t.get("total_seconds", 0.0))
    ttft = float(t.get("first_token_seconds", 0.0))
    decode = float(t.get("decode_seconds", 0.0))
    drafted, accepted = int(t.get("drafted_tokens", 0)), int(t.get("accepted_tokens", 0))
    speed = f"{n / total:.1f} tok/s" if total > 0 else "- tok/s"
    after = f", {(n - 1) / decode:.1f} tok/s after the first" if n > 1 and decode > 0 else ""
    rate = f" ({accepted / drafted:.0%})" if drafted else ""
    return (
        f"{n} tokens in {total:.2f} s: {speed}{after}; first token {ttft * 1000:.0f} ms; "
        f"prompt {int(t.get('prompt_tokens', 0))} tokens "
        f"({int(t.get('cached_prompt_tokens', 0))} cached); drafts {accepted}/{drafted} "
        f"accepted{rate} over {int(t.get('steps', 0))} steps; finish: {finish_reason}"
    )


@click.command("generate")
@click.argument("prompt", required=False)
@click.option("--session", "session", default=None,
              help="Session id (opened if new). With --chat the conversation continues "
                   "from one call to the next.")
@click.option("--namespace", default="default", show_default=True)
@click.option("--messages", "messages_file", type=click.File("r"), default=None,
              help="JSON file (or - for stdin) with a list of {role, content} chat messages.")
@click.option("--chat", is_flag=True,
              help="Send PROMPT as a user message (the model's chat template); with "
                   "--session, after the earlier turns of that session.")
@click.option("--new", "new_chat", is_flag=True,
              help="With --chat --session: forget the earlier turns, start over.")
@click.option("--max-tokens", default=256, show_default=True, type=click.IntRange(1, 8192))
@click.option("--temperature", default=0.0, show_default=True, type=click.FloatRange(0))
@click.option("--top-p", default=1.0, show_default=True, type=click.FloatRange(0, 1))
@click.option("--top-k", default=0, show_default=True, type=click.IntRange(0))
@click.option("--seed", default=None, type=int)
@click.option("--stop", multiple=True, help="Stop string (repeatable).")
@click.option("--stats", "show_stats", is_flag=True,
              help="Print speed, time to first token and drafting to stderr at the end "
                   "(with --json: the totals as JSON).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per chunk.")
@connection_options
def generate(
    prompt: str | None, session: str | None, namespace: str, messages_file: Any, chat: bool,
    new_chat: bool, max_tokens: int, temperature: float, top_p: float, top_k: int,
    seed: int | None, stop: tuple[str, ...], show_stats: bool, as_json: bool,
    address: str | None, socket_path: str | None, data_dir: str | None,
    auth_token: str | None,
) -> None:
    """Generate a continuation of PROMPT (text) and stream it to stdout.

    \b
    The embedded model (gemma-3-270m) is a base model: it continues text, e.g.
      suffixd generate "SELECT name, country FROM singer WHERE"
    For chat (--chat), serve a chat model: suffixd serve --model chat-model.gguf
    """
    from suffixd.client import SuffixdError

    kwargs: dict[str, Any] = {}
    history: list[dict[str, str]] | None = None
    hist_path: Path | None = None
    if messages_file is not None:
        if prompt is not None:
            raise click.UsageError("give PROMPT or --messages, not both")
        try:
            kwargs["messages"] = json.load(messages_file)
        except json.JSONDecodeError as exc:
            raise click.UsageError(f"--messages: not JSON: {exc}") from None
        if not isinstance(kwargs["messages"], list):
            raise click.UsageError("--messages: expected a JSON list of {role, content}")
    elif prompt is None:
        raise click.UsageError("give PROMPT or --messages")
    elif chat:
        turn = {"role": "user", "content": prompt}
        if session:
            hist_path = history_path(data_dir, namespace, session)
            history = [] if new_chat else load_history(hist_path)
        kwargs["messages"] = [*(history or []), turn]
    else:
        kwargs["prompt"] = prompt
    if new_chat and not (chat and session):
        raise click.UsageError("--new goes with --chat --session")
    last = None
    text: list[str] = []
    client = connect(address, socket_path, data_dir, auth_token, retries=2, timeout=None)
    progress = LoadProgress(client)
    try:
        progress.start()
        for chunk in client.generate(
            session, namespace=namespace, max_tokens=max_tokens, temperature=temperature,
            top_p=top_p, top_k=top_k, seed=seed, stop=stop, **kwargs,
        ):
            progress.stop()
            last = chunk
            text.append(chunk.text)
            if as_json:
                click.echo(json.dumps(chunk.__dict__))
            else:
                sys.stdout.write(chunk.text)
                sys.stdout.flush()
    except SuffixdError as exc:
        progress.stop()
        if text and not as_json:
            sys.stdout.write("\n")
        fail(exc, client.target)
    except ValueError as exc:
        progress.stop()
        raise click.UsageError(str(exc)) from None
    finally:
        progress.stop()
        client.close()
    if not as_json:
        sys.stdout.write("\n")
    if hist_path is not None and last is not None:
        with contextlib.suppress(OSError):  # the answer was printed; memory is a bonus
            save_history(hist_path, [*kwargs["messages"],
                                     {"role": "assistant", "content": "".join(text)}])
    if show_stats and last is not None:
        if as_json:
            click.echo(json.dumps({"finish_reason": last.finish_reason, **last.totals}),
                       err=True)
        else:
            click.echo(format_totals(last.totals, last.finish_reason), err=True)
