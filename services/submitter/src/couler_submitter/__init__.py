"""Couler's submitter service."""
