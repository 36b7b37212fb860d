"""Shadows: a candidate harness run on a repository's real merges (docs/architecture.md, "Shadows")."""
