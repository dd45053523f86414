"""The update rule: advantages, losses, the PPO plan of minibatches and micro-batches, and its mitigations."""
