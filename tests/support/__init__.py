"""Helpers several test folders share (importable as ``support.*``: tests/ is on the path through conftest.py)."""
