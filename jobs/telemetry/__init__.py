"""What a run reports as it goes: the run directory's metric sinks (tracking.py) and the Ray dashboard's
metric table (dashboard.py)."""
