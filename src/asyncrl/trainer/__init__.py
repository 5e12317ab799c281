"""asyncrl.trainer (see DESIGN.md §2)."""
