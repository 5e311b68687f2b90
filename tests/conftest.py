from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

VECTORS = Path(__file__).parent / "vectors"


def load_vectors(name: str) -> Any:
    return json.loads((VECTORS / name).read_text())


@pytest.fixture
def hypercore_vectors() -> Any:
    return load_vectors("hypercore-11.37.1.json")


@pytest.fixture
def hyperdb_vectors() -> Any:
    return load_vectors("hyperdb-3.5.0.json")


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """The one real local Spark session of a test run (starting one costs ~8 s)."""
    from feedlog.lake import spark_session

    s = spark_session("local[2]", "feedlog-tests")
    s.sparkContext.setLogLevel("ERROR")
    yield s
    s.stop()
