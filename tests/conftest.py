"""Puts tests/ on sys.path (pytest's prepend import mode), so helpers shared by several test
folders live once, in tests/ itself (loopback.py)."""
