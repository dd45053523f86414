"""`python -m jobs.dashboard [PATH]`: writes the Grafana dashboard of the run's Ray metrics (default
cluster/grafana/marl_train.json), built from the metric table in jobs/telemetry/dashboard.py."""

from __future__ import annotations

import sys

from jobs.telemetry.dashboard import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
