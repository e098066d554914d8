"""Thin services around the library: parse settings → connect adapters → run the library's loop.

ARCHITECTURE.md draws them as a top-level `services/` folder; they live inside the package so
that `pip install palomino` ships them and no generic top-level `services` name is claimed.
"""
