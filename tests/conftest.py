"""Puts tests/ on sys.path (pytest's prepend import mode), so helpers shared by several test
folders live once, in tests/ itself (support/, loopback.py).
"""

from __future__ import annotations

from support.rings import label_prefix, ring_name

#: Fixtures for every folder (support/): each test folder used to define its own.
__all__ = ["label_prefix", "ring_name"]
