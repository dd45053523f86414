"""Shared vs Isolated on SmolLM2-135M on a 2-core CPU (README.md)."""
