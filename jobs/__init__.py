"""Entry points: train, sweep, report, compare, prepare_data. The code they run lives by concern in
jobs/config/, jobs/driver/, jobs/models/, jobs/plan/ and jobs/telemetry/; the generators of the site's
computed pages in jobs/pages/."""
