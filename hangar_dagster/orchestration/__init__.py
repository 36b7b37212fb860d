"""The Dagster layer, and the only package that imports dagster."""
