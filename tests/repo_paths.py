"""Where the tests find the repository's own files (scripts, configs, sources, committed results): one root,
computed once."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
"""The repository's root (the clone, wherever it sits)."""
CONFIGS = REPO / "configs"
SCRIPTS = REPO / "scripts"
RESULTS = REPO / "docs" / "results"
