"""Labelled stand-ins: a scripted agent and a scripted model endpoint (no model is called)."""
