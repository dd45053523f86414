"""Workflow semantics: types, policy maps, workflows, tasks and reward assignment (pure Python)."""
