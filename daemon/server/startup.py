"""What `suffixd serve` does around the server: checks that need no model (run before
the model loads and the trees rebuild, so a typo fails in a second, in one line), the
draft model's vocabulary check, and the verifier's background load once serving.

Interface: ``preflight(cfg)``, ``check_data_dir_writable(data_dir)`` and
``check_draft_vocabulary(engine, path)`` (each raises ``ServeError`` with one line);
``disk_error_line(data_dir, exc)``; ``preload_generator(engine)``."""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import threading
from pathlib import Path
from typing import Any

from .serve_config import ServeConfig, ServeError, parse_listen

log = logging.getLogger("suffixd.server")


def preflight(cfg: ServeConfig) -> None:
    """What can be checked before the model loads and the trees rebuild (seconds to
    minutes): the listeners, the TCP token rule, the metrics address, the model file, that
    the TCP ports are free, and that the data dir takes writes. Raises ServeError with one
    line."""
    check_data_dir_writable(cfg.data_dir)
    listeners = [parse_listen(s) for s in cfg.listen]
    if any(lst.kind == "tcp" for lst in listeners) and not cfg.auth_token and not cfg.insecure:
        raise ServeError(
            "a TCP listener needs a bearer token (--auth-token or SUFFIXD_AUTH_TOKEN), "
            "or --insecure to accept anyone who can reach the port"
        )
    ports = [(lst.address, "--listen") for lst in listeners if lst.kind == "tcp"]
    metrics_addr = cfg.extra.get("metrics_addr")
    if metrics_addr:
        from .metrics import parse_addr

        try:
            host, port = parse_addr(str(metrics_addr))
        except ValueError as exc:
            raise ServeError(str(exc)) from None
        ports.append((f"{host}:{port}", "--metrics-addr"))
    http = cfg.extra.get("http")
    if http:
        from ..http_api.app import _is_loopback, parse_http_addr

        try:
            host, port = parse_http_addr(str(http))
        except ValueError as exc:
            raise ServeError(str(exc)) from None
        if not _is_loopback(host) and not cfg.auth_token and not cfg.insecure:
            raise ServeError(
                f"--http {http}: an address other than loopback needs a bearer token "
                "(--auth-token or SUFFIXD_AUTH_TOKEN), or --insecure")
        ports.append((f"{host}:{port}", "--http"))
    for addr, option in ports:
        _check_port_free(addr, option)
    if cfg.model is not None and str(cfg.model) not in ("", "default", "embedded"):
        from ..model import PACKAGED_MODELS, packaged_model_path

        if str(cfg.model) in PACKAGED_MODELS:
            try:
                packaged_model_path(str(cfg.model))
            except FileNotFoundError as exc:
                raise ServeError(f"--model {cfg.model}: {exc}") from None
        else:
            _check_gguf(Path(cfg.model).expanduser(), "--model")
    if cfg.extra.get("draft_model"):
        _check_gguf(Path(cfg.extra["draft_model"]).expanduser(), "--draft-model")


# Below this much free space in the data dir's file system the daemon does not start: the
# store's first commits, the lock and daemon.json need room (and a daemon that starts on a
# full disk only answers "disk full").
MIN_FREE_BYTES = 1 << 20
_PROBE_BYTES = 64 << 10


def disk_error_line(data_dir: Path, exc: OSError) -> str:
    """One line for an OSError met writing the data dir (start-up or a command)."""
    where = f"the data dir {data_dir}"
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return f"disk full: {where} cannot take writes ({exc.strerror}); free some space " \
               "or pass another --data-dir"
    if exc.errno == errno.EROFS:
        return f"{where} is on a read-only file system; suffixd writes its store there " \
               "(remount it read-write or pass another --data-dir)"
    if exc.errno in (errno.EACCES, errno.EPERM):
        return f"cannot write in {where}: permission denied (its owner must run suffixd, " \
               "or pass another --data-dir)"
    name = f" ({exc.filename})" if exc.filename else ""
    return f"cannot write in {where}{name}: {exc.strerror or exc}"


def check_data_dir_writable(data_dir: Path) -> None:
    """Write, fsync and remove a small probe file in the data dir, and check that its file
    system has MIN_FREE_BYTES free: a full or read-only disk is reported in one line
    before anything else starts (the daemon does not serve read-only)."""
    # Named after the process: two daemons starting on one data dir (the lock comes after)
    # do not remove each other's probe. A leftover goes first; O_EXCL | O_NOFOLLOW then
    # creates the file itself, never writing through a link planted under its name.
    probe = Path(data_dir) / f".suffixd-write-probe.{os.getpid()}"
    try:
        with contextlib.suppress(FileNotFoundError):
            probe.unlink()
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                     | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, bytes(_PROBE_BYTES))
            os.fsync(fd)
        finally:
            os.close(fd)
            with contextlib.suppress(FileNotFoundError):
                probe.unlink()
        st = os.statvfs(data_dir)
    except OSError as exc:
        raise ServeError(disk_error_line(Path(data_dir), exc)) from None
    free = st.f_bavail * st.f_frsize
    if free < MIN_FREE_BYTES:
        raise ServeError(f"disk full: the data dir {data_dir} has {free} bytes free (suffixd "
                         f"needs at least {MIN_FREE_BYTES}); free some space or pass another "
                         "--data-dir")


def _check_gguf(path: Path, option: str) -> None:
    try:
        with path.open("rb") as f:
            magic = f.read(4)
    except OSError as exc:
        raise ServeError(f"{option} {path}: {exc.strerror or exc}") from None
    if magic != b"GGUF":
        raise ServeError(f"{option} {path}: not a GGUF model file (llama.cpp's format)")


def _check_port_free(addr: str, option: str) -> None:
    """Bind and release the port: a taken one is reported in one line here, rather than
    by gRPC's C core (a raw log line) after the model has loaded."""
    import socket

    host, _, port = addr.rpartition(":")
    host = host.strip("[]")
    if not port.isdigit() or int(port) == 0:
        return
    try:
        infos = socket.getaddrinfo(host or None, int(port), type=socket.SOCK_STREAM,
                                   flags=socket.AI_PASSIVE)
    except OSError as exc:
        raise ServeError(f"{option} {addr}: cannot resolve {host!r}: {exc}") from None
    family, kind, proto, _, sockaddr = infos[0]
    with socket.socket(family, kind, proto) as sock:
        # As the servers bind: SO_REUSEADDR set, so a port in TIME_WAIT is not "taken".
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(sockaddr)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise ServeError(f"{option} {addr}: the port is in use (another suffixd, "
                                 "or another program); pick another port") from None
            raise ServeError(f"{option} {addr}: cannot listen there: "
                             f"{exc.strerror or exc}") from None


def check_draft_vocabulary(engine: Any, path: Path) -> None:
    """Refuses a draft model whose vocabulary differs from the target's (its drafts
    would be token ids of another tokenizer)."""
    from ..model import Tokenizer

    target = getattr(engine, "tokenizer", None)
    if target is None:
        raise ServeError("--draft-model needs a target model (not --model none)")
    try:
        draft = Tokenizer(path)
    except (OSError, ValueError, RuntimeError) as exc:
        raise ServeError(f"cannot load the draft model {path}: {exc}") from None
    if draft.fingerprint != target.fingerprint:
        raise ServeError(
            f"the draft model {path} does not share the target's vocabulary "
            f"({draft.vocab_size} tokens, fingerprint {draft.fingerprint} vs "
            f"{target.vocab_size} tokens, {target.fingerprint})"
        )


def preload_generator(engine: Any) -> threading.Thread | None:
    """Load the verifier in the background (first use would otherwise wait for it);
    generation is ready once it is loaded (its costs come from the data dir, or are
    measured while serving: daemon/generation/pipeline.py); ``suffixd generate`` shows
    the progress."""
    generator = getattr(engine, "generator", None)
    if generator is None or getattr(engine, "model_path", None) is None:
        return None

    def load() -> None:
        try:
            generator.runtime()
        except Exception as exc:  # reported by GeneratorStatus and the next Generate
            log.warning("verifier preload failed", extra={"error": repr(exc)})

    t = threading.Thread(target=load, name="suffixd-preload", daemon=True)
    t.start()
    return t
