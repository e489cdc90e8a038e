"""Couler's monitor service."""
