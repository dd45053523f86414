"""The one config: its schema (jobs/config/schema.py), loading and validation (loading.py), each policy's own
view (policies.py), and the rules a value must keep (field_rules.py, precision.py, colocation.py); the sweep
file's spec (sweep_spec.py). `from jobs.config import load_config` is the loading API."""

from jobs.config.loading import ConfigError, load_config, to_yaml

__all__ = ["ConfigError", "load_config", "to_yaml"]
