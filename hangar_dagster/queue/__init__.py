"""The eval queue's rules (window, starts, budget, retries, drain, restarts); no Dagster here."""
