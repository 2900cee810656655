"""triskele.train.tools.claims: the founding claims' table, regenerated and compared with docs/performance.md's."""

from pathlib import Path

import pytest
from triskele.train.tools import claims

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def rows():
    return claims.claims_rows()


def test_the_performance_pages_claims_table_is_the_generated_one(rows):
    assert claims.page_claims((ROOT / claims.PERFORMANCE).read_text()) == claims.claims_table(rows), \
        "regenerate: python -m triskele.train.tools.claims --write-page"


def test_every_founding_claim_has_a_row_with_a_figure(rows):
    claimed = ["up to 6x", "another 2-3x", "43% more bandwidth", "NVLink domains of 8, 72 and 576",
               "15-30%", "beyond 64 GPUs"]
    assert len(rows) == len(claimed)
    for row, words in zip(rows, claimed, strict=True):
        assert words in row["claim"] and any(ch.isdigit() for ch in row["figure"]), row
        assert row["agrees"] in ("yes", "no", "partly") and row["term"], row


def test_the_bandwidth_claim_holds_where_the_roofline_is_memory_bound(rows):
    """H200 / H100 at batch 1 with fp8 weights is the bandwidth ratio 4.8 / 3.35 = 1.43 (memory-bound);
    at batch 256 in bfloat16 both are compute-bound on the same tensor cores: 1.00."""
    figure = rows[2]["figure"]
    assert "fp8 batch 1: 1.43x" in figure and f"bfloat16 batch {256}: 1.00x" in figure, figure
