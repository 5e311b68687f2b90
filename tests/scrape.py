"""Scraping a `/metrics` listener in tests: real HTTP, parsed by Prometheus' own text parser."""

from __future__ import annotations

import socket
import ssl
import urllib.request
from collections.abc import Mapping

from prometheus_client.parser import text_string_to_metric_families

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(url: str, token: str | None = None, context: ssl.SSLContext | None = None) -> Samples:
    """Every sample `url` serves, by (name, labels)."""
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    with urllib.request.urlopen(req, timeout=10, context=context) as r:
        text = r.read().decode()
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(samples: Samples, name: str, **labels: str) -> float | None:
    """The sample `name` with exactly these labels, None if the scrape had none."""
    return samples.get((name, frozenset(labels.items())))


def label_values(samples: Samples) -> set[str]:
    """Every label value of every sample."""
    return {v for _, labels in samples for _, v in labels}


def total(samples: Samples, name: str, **labels: str) -> float:
    """The sum of `name` over the samples whose labels include `labels`."""
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and want <= ls)


def labelled(samples: Samples, name: str) -> list[Mapping[str, str]]:
    return [dict(ls) for (n, ls) in samples if n == name]


def closed_by_server(s: socket.socket) -> bool:
    """Whether the server has closed `s` (EOF or reset); False while it stays open."""
    s.settimeout(0.05)
    try:
        return s.recv(1) == b""
    except TimeoutError:
        return False
    except OSError:
        return True
