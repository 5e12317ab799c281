"""asyncrl.controller (see DESIGN.md §2)."""
