"""One trial attempt: the clone, the agent in its sandbox, verify, the patch and its record."""
