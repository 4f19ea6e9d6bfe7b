"""Write a workload with (almost) nothing to reuse: one-turn sessions of unrelated prose.

    python bench/make_prose_workload.py [N] > /tmp/prose.jsonl
    suffixd bench generate /tmp/prose.jsonl --turns N

Each session asks for a short essay on a different topic: the one-line summary of a
Python standard-library module's docstring (so the file is reproducible offline and
needs no data beyond the interpreter). The prompts are short and share nothing but the
instruction, so drafts can only come from what the model itself writes within a turn.
The assistant message is a placeholder: `bench generate` only uses the prompts.
"""

from __future__ import annotations

import importlib
import json
import sys

MODULES = [
    "argparse",
    "asyncio",
    "base64",
    "bisect",
    "calendar",
    "cmd",
    "codecs",
    "collections",
    "colorsys",
    "contextlib",
    "copy",
    "csv",
    "dataclasses",
    "datetime",
    "decimal",
    "difflib",
    "email",
    "enum",
    "fnmatch",
    "fractions",
    "ftplib",
    "functools",
    "getopt",
    "gettext",
    "glob",
    "gzip",
    "hashlib",
    "heapq",
    "hmac",
    "html",
    "imaplib",
    "inspect",
    "ipaddress",
    "itertools",
    "json",
    "locale",
    "logging",
    "mailbox",
    "math",
    "mimetypes",
    "operator",
    "optparse",
    "pathlib",
    "pickle",
    "pprint",
    "queue",
    "random",
    "re",
    "sched",
    "secrets",
    "shelve",
    "shlex",
    "shutil",
    "smtplib",
    "socket",
    "sqlite3",
    "statistics",
    "string",
    "struct",
    "subprocess",
    "tarfile",
    "tempfile",
    "textwrap",
    "threading",
    "timeit",
    "tokenize",
    "traceback",
    "turtle",
    "typing",
    "unittest",
    "uuid",
    "warnings",
    "wave",
    "weakref",
    "zipfile",
    "zlib",
]


def topics() -> list[str]:
    out = []
    for name in MODULES:
        try:
            doc = importlib.import_module(name).__doc__ or ""
        except Exception:  # noqa: BLE001 - a module missing from this Python is skipped
            continue
        line = next((ln.strip() for ln in doc.splitlines() if len(ln.strip()) > 12), "")
        if line:
            out.append(line.rstrip("."))
    return out


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 60
    for i, topic in enumerate(topics()[:n]):
        msgs = [
            {"role": "user", "content": f"Write a short essay about this: {topic}."},
            {"role": "assistant", "content": "(generated)"},
        ]
        print(json.dumps({"session": f"prose-{i:03d}", "messages": msgs}))


if __name__ == "__main__":
    main()
