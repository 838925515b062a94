"""Fixtures for the Ascend ingest tests: real samples and generated clusters (in tmp dirs only)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.ascend import gen_cluster

REPO = Path(__file__).resolve().parents[2]
SAMPLES = REPO / "sample_profiles"
# the uncompressed timeline and the format doc (provenance: tests/data/ascend/README.md)
ASCEND_DATA = REPO / "tests" / "data" / "ascend"
FORMAT_DOC = ASCEND_DATA / "ascend-formats.md"


@pytest.fixture(scope="session")
def ascend_samples() -> Path:
    assert (SAMPLES / "ascend_pt_timeline").is_dir(), f"{SAMPLES} is missing"
    return SAMPLES


@pytest.fixture(scope="session")
def faults8_text(tmp_path_factory: pytest.TempPathFactory) -> gen_cluster.Facts:
    return gen_cluster.generate("faults8", tmp_path_factory.mktemp("faults8_text"), "text")


@pytest.fixture(scope="session")
def faults8_db(tmp_path_factory: pytest.TempPathFactory) -> gen_cluster.Facts:
    return gen_cluster.generate("faults8", tmp_path_factory.mktemp("faults8_db"), "db")


@pytest.fixture(scope="session")
def cluster64_text(tmp_path_factory: pytest.TempPathFactory) -> gen_cluster.Facts:
    return gen_cluster.generate("cluster64", tmp_path_factory.mktemp("cluster64_text"), "text")


@pytest.fixture(scope="session")
def cluster64_db(tmp_path_factory: pytest.TempPathFactory) -> gen_cluster.Facts:
    return gen_cluster.generate("cluster64", tmp_path_factory.mktemp("cluster64_db"), "db")


@pytest.fixture(scope="session")
def loaded_faults8_text(faults8_text):
    from advisor.engine.context import load_profile

    return load_profile(faults8_text.root)


@pytest.fixture(scope="session")
def loaded_faults8_db(faults8_db):
    from advisor.engine.context import load_profile

    return load_profile(faults8_db.root)
