"""Prompt sources: synthetic tasks and real datasets."""
