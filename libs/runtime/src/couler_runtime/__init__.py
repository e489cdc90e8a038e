"""Couler runtime: adapters at the edge of the core (protobuf codec, and later I/O)."""
