"""What a forward pass costs and computes: the log-prob head, padding-free packing and the memory estimate."""
