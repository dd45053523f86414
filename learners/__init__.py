"""Turning Episodes into updates: batch building, advantages and losses as pure functions, learners."""
