"""Couler's optimizer service."""
