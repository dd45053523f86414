"""Entry points: train, sweep, report, prepare_data (and the generators of docs/: config_reference, fidelity,
dashboard). The code they run lives by concern in jobs/config/, jobs/driver/, jobs/models/, jobs/plan/ and
jobs/telemetry/."""
