"""The collector's public surface: everything in ``__all__`` is importable and documented."""

from __future__ import annotations

import kernel_insight.collector as collector


def test_all_names_exist_and_have_docstrings():
    assert len(set(collector.__all__)) == len(collector.__all__)
    for name in collector.__all__:
        obj = getattr(collector, name)
        if callable(obj) and not isinstance(obj, type(collector)):
            assert (obj.__doc__ or "").strip() or name.isupper(), f"{name} has no docstring"


def test_storage_names_are_exported():
    for name in (
        "EmbeddedStore",
        "ServerStore",
        "StorageUnavailable",
        "ClickHouseStorage",
        "Deriver",
        "StoreSink",
    ):
        assert name in collector.__all__
