"""asyncrl.rollout (see DESIGN.md §2)."""
