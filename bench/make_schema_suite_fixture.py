"""Vendor the JSON-Schema-Test-Suite's schemas for tests/test_schema_suite.py.

    python bench/make_schema_suite_fixture.py GIT_DIR [--commit REV]

GIT_DIR is a clone (or bare git directory) of
https://github.com/json-schema-org/JSON-Schema-Test-Suite. For each of draft2020-12 and
draft7 (the required tests, not ``optional/``) it writes
``tests/fixtures/json_schema_test_suite/<draft>.json``: every distinct schema once, with
the instances the suite tests against it and whether each is valid, and no descriptions
(the suite's files are ~10x larger). The README there names the commit.
"""

from __future__ import annotations

import argparse
import json
import subprocess
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "json_schema_test_suite"
DRAFTS = ("draft2020-12", "draft7")


def _git(git_dir: str, *args: str) -> str:
    return subprocess.run(["git", "--git-dir", git_dir, *args], check=True,
                          capture_output=True, text=True).stdout


def collect(git_dir: str, commit: str, draft: str) -> list[dict[str, Any]]:
    """The distinct schemas of one draft, in the suite's order, each with its instances."""
    files = [f for f in _git(git_dir, "ls-tree", "--name-only", commit,
                             f"tests/{draft}/").split()
             if f.endswith(".json")]
    by_schema: dict[str, dict[str, Any]] = {}
    for path in files:
        for group in json.loads(_git(git_dir, "show", f"{commit}:{path}")):
            key = json.dumps(group["schema"], sort_keys=True)
            entry = by_schema.setdefault(key, {"file": Path(path).name,
                                               "schema": group["schema"], "tests": []})
            for case in group["tests"]:
                item = [case["data"], case["valid"]]
                if item not in entry["tests"]:
                    entry["tests"].append(item)
    return list(by_schema.values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("git_dir")
    parser.add_argument("--commit", default="HEAD")
    args = parser.parse_args()
    commit = _git(args.git_dir, "rev-parse", args.commit).strip()
    OUT.mkdir(parents=True, exist_ok=True)
    for draft in DRAFTS:
        entries = collect(args.git_dir, commit, draft)
        text = "[\n" + ",\n".join(json.dumps(e, ensure_ascii=False, separators=(",", ":"))
                                  for e in entries) + "\n]\n"
        (OUT / f"{draft}.json").write_text(text, encoding="utf-8")
        print(f"{draft}: {len(entries)} schemas, "
              f"{sum(len(e['tests']) for e in entries)} instances, {len(text)} bytes")
    print(f"commit {commit}")


if __name__ == "__main__":
    main()
