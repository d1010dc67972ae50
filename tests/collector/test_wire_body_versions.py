"""Which wire body versions carry native histograms, as the decoder takes them and as the docs say:
api.md and metrics.md said "version 2 or 3" after versions 4 and 5 came, and the encoder's error
said "2, 3 or 4"."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kernel_insight.collector import wire

DOCS = Path(__file__).resolve().parents[2] / "docs"
FIRST, LAST = wire.BODY_VERSION_HISTOGRAMS, max(wire.BODY_VERSIONS)


def test_a_histograms_section_in_a_body_too_old_for_it_names_every_version_that_carries_one() -> None:
    with pytest.raises(ValueError, match=rf"^a HISTOGRAMS section needs body_version {FIRST} to {LAST}$"):
        wire.encode_body(np.zeros(0, dtype=wire.RECORD_DTYPE), histograms=b"\x01", body_version=1)


def test_the_docs_name_the_body_versions_the_decoder_takes() -> None:
    wire_md = (DOCS / "wire.md").read_text()
    assert wire_md.splitlines()[0].endswith(f"(header version 1, body versions 1 to {LAST})")
    assert f"`body_version` is 1 to {LAST}; native histograms come in versions {FIRST} to {LAST}." in wire_md
    assert (
        f"| 0x04 | HISTOGRAMS: native histograms (below); body versions {FIRST} to {LAST} only |" in wire_md
    )
    assert f"### HISTOGRAMS (0x04, body versions {FIRST} to {LAST};" in wire_md
    assert f"(wire body versions {FIRST} to {LAST}," in (DOCS / "api.md").read_text()
    metrics_md = (DOCS / "metrics.md").read_text()
    assert (
        f"## Native histograms (from the HISTOGRAMS sections of wire body versions {FIRST} to {LAST})"
        in metrics_md
    )
