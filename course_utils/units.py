"""Units the course measures in."""

MIB = 2**20
"""Bytes in a mebibyte (MiB)."""

GIB = 2**30
"""Bytes in a gibibyte (GiB)."""
