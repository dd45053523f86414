"""Turning prompts into Episodes: engines, engine groups per role, the Collector, Episode storage."""
