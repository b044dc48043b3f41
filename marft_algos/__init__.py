"""marft algorithms (being built)."""
