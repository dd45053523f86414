"""The run's plan from the config alone: memory per GPU and step-time estimates (planner.py,
rollout_estimate.py), its printout (report.py) and a sweep's scaling tables (scaling.py)."""
