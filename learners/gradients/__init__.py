"""Gradient backends: the registry, plain torch (data-parallel), DeepSpeed ZeRO and the colocated one."""
