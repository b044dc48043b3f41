"""Helpers shared by the test modules (tests never import each other).

``tests/conftest.py`` puts this package on the import path (pytest inserts ``tests/``) and
wraps its functions as fixtures; module-level constants (env kwargs, sampling settings)
are imported from here directly, since a fixture cannot be used at module level.
"""
