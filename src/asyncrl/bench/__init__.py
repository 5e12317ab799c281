"""asyncrl.bench (see DESIGN.md §2)."""
