"""A learner's weights and state: LoRA and snapshots, the weight server, checkpoint save and load."""
