"""The run: building its handles, the step and the loop, updates, weight sync, placement, the run's
checkpoints, its data and evals."""
