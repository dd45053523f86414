"""Model resolution (a folder or `builtin:<name>`, resolve.py), the built-in offline models (builtin.py) and
the shapes the planner sizes them by (shape.py)."""
