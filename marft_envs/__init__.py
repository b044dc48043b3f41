"""marft environments (being built)."""
