"""Small helpers several rooms share, with no domain rules of their own."""
