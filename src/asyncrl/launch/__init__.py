"""asyncrl.launch (see DESIGN.md §2)."""
