"""The README's figures are BENCHMARKS.md's: every link into BENCHMARKS.md names a section
that exists, and every figure the README's opening puts in bold appears in BENCHMARKS.md's
headline table as written (a figure re-measured there and not here, or rounded
differently, fails)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# a ratio or a time as the headlines write them: 1.82x, 0.84-0.88x, 6.23 s
FIGURE = re.compile(r"\d+(?:\.\d+)?(?:-\d+(?:\.\d+)?)?(?:x| s\b|%)")


def anchor(heading: str) -> str:
    """GitHub's anchor for a Markdown heading: lower case, punctuation dropped except
    hyphens and underscores, spaces as hyphens."""
    text = re.sub(r"[`*]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def benchmark_anchors() -> set[str]:
    lines = (ROOT / "BENCHMARKS.md").read_text().splitlines()
    return {anchor(line.lstrip("#")) for line in lines if re.match(r"#{1,6} ", line)}


def test_anchor_follows_github() -> None:
    assert anchor("Many agents at once (`suffixd bench agent --concurrency`)") \
        == "many-agents-at-once-suffixd-bench-agent---concurrency"
    assert anchor("Ready after a start (bench/ready_bench.py)") \
        == "ready-after-a-start-benchready_benchpy"


def test_every_link_into_benchmarks_names_a_section() -> None:
    anchors = benchmark_anchors()
    docs = [ROOT / "README.md", ROOT / "BENCHMARKS.md", *(ROOT / "docs").glob("*.md")]
    missing = []
    for doc in docs:
        for target in re.findall(r"BENCHMARKS\.md#([\w\-]+)", doc.read_text()):
            if target not in anchors:
                missing.append(f"{doc.name}: #{target}")
        if doc.name == "BENCHMARKS.md":
            missing += [f"BENCHMARKS.md: #{t}" for t in
                        re.findall(r"\]\(#([\w\-]+)\)", doc.read_text()) if t not in anchors]
    assert not missing, missing


def test_the_readme_headline_figures_are_benchmarks_figures() -> None:
    readme = (ROOT / "README.md").read_text()
    opening = readme.split("\n## ", 1)[0]
    bold = re.findall(r"\*\*(.+?)\*\*", opening, flags=re.S)
    figures = [f for b in bold for f in FIGURE.findall(b.replace("\n", " "))]
    assert len(figures) >= 6, figures  # the opening still states its figures
    benchmarks = (ROOT / "BENCHMARKS.md").read_text()
    headlines = benchmarks.split("\n## Headline figures\n", 1)[1].split("\n## ", 1)[0]
    absent = [f for f in figures if f not in headlines]
    assert not absent, f"README figures not in BENCHMARKS.md's headline table: {absent}"
