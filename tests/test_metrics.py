"""Prometheus endpoint of a real daemon (`suffixd serve --metrics-addr`), scraped over HTTP."""

from __future__ import annotations

import urllib.request
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from suffixd.daemon.server.metrics import parse_addr


def scrape(addr: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"http://{addr}/metrics", timeout=10) as resp:
        assert resp.status == 200
        text = resp.read().decode()
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_metrics_endpoint_reports_what_happened(daemon_factory: Any, tmp_path: Path) -> None:
    proc = daemon_factory(args=["--metrics-addr", "127.0.0.1:0", "--metrics-namespaces"])
    addr = (proc.data_dir / "metrics.addr").read_text().strip()
    client = proc.client()
    ns = "metricsns"
    text = "SELECT name FROM singer WHERE age > 30 ; " * 3
    steps = accepted_total = proposed_total = 0
    with client.session(namespace=ns) as sess:
        sess.append(text=text, kind="prompt")
        ids = client.tokenize("SELECT name FROM singer WHERE age > 30 ;")
        for _ in range(3):
            draft = sess.speculate(max_tokens=8)
            res = sess.append(tokens=ids[:4], kind="generated")
            steps += 1
            proposed_total += len(draft)
            accepted_total += res.accepted
        sess.append(tokens=ids[4:6], kind="response")  # not after a speculate: no step
    st = client.stats(ns)["namespaces"][0]["counters"]
    assert st["steps"] == steps

    m = scrape(addr)
    lbl = (("namespace", ns),)
    assert m[("suffixd_requests_total", lbl)] == 1
    assert m[("suffixd_speculate_calls_total", lbl)] == 3
    prop = sum(v for (n, lab), v in m.items()
               if n == "suffixd_draft_tokens_proposed_total" and dict(lab)["namespace"] == ns)
    acc = sum(v for (n, lab), v in m.items()
              if n == "suffixd_draft_tokens_accepted_total" and dict(lab)["namespace"] == ns)
    assert (prop, acc) == (proposed_total, accepted_total)
    assert acc > 0  # the session repeats itself: something was accepted
    global_tokens = m[("suffixd_cache_tokens", (("namespace", ns), ("tree", "global")))]
    assert global_tokens == 3 * 4 + 2  # the response: three generated pieces plus the last one
    # Histograms saw every speculate and every verified step.
    spec_count = sum(v for (n, _), v in m.items() if n == "suffixd_speculate_seconds_count")
    assert spec_count == 3
    acc_count = sum(v for (n, _), v in m.items() if n == "suffixd_accepted_tokens_count")
    acc_sum = sum(v for (n, _), v in m.items() if n == "suffixd_accepted_tokens_sum")
    assert (acc_count, acc_sum) == (steps, accepted_total)
    client.close()


def test_metrics_do_not_name_namespaces_unless_asked(daemon_factory: Any) -> None:
    """By default the figures are summed over namespaces under namespace="all": whoever
    reaches the endpoint learns no tenant's name. It binds loopback given a bare port."""
    proc = daemon_factory(args=["--metrics-addr", ":0"])
    addr = (proc.data_dir / "metrics.addr").read_text().strip()
    assert addr.startswith("127.0.0.1:")
    client = proc.client()
    for ns in ("tenant-alpha", "tenant-bravo"):
        with client.session(namespace=ns) as sess:
            sess.append(tokens=[5, 6, 7, 8], kind="prompt")
            sess.speculate(max_tokens=4)
            sess.append(tokens=[9, 10, 11], kind="response")
    with urllib.request.urlopen(f"http://{addr}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    assert "tenant-" not in text
    m = scrape(addr)
    assert {dict(lab)["namespace"] for (_, lab) in m if "namespace" in dict(lab)} == {"all"}
    assert m[("suffixd_requests_total", (("namespace", "all"),))] == 2
    assert m[("suffixd_speculate_calls_total", (("namespace", "all"),))] == 2
    assert m[("suffixd_cache_tokens", (("namespace", "all"), ("tree", "global")))] == 6
    client.close()


def test_metrics_addr_parsing() -> None:
    assert parse_addr("127.0.0.1:9464") == ("127.0.0.1", 9464)
    assert parse_addr(":9464") == ("127.0.0.1", 9464)
    assert parse_addr("9464") == ("127.0.0.1", 9464)
    assert parse_addr("[::1]:0") == ("::1", 0)
    for bad in ("host:", "host:port", "1:99999"):
        with pytest.raises(ValueError):
            parse_addr(bad)


def test_bad_metrics_addr_refuses_to_start(daemon_factory: Any) -> None:
    proc = daemon_factory(args=["--metrics-addr", "nonsense:port"], expect_ready=False)
    assert proc.wait(60) != 0
    # Refused before the model loads (daemon/server/startup.py), in one line.
    assert "--metrics-addr 'nonsense:port': expected HOST:PORT" in proc.log()
