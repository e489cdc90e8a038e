"""Couler's cache service."""
