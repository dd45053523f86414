"""The generators of the site's pages that are computed from the code, each a `python -m` command whose page a
test compares with what it renders: config_reference (docs/config.md, from the schema), fidelity
(docs/paper_fidelity.md, from docs/paper_fidelity.yaml and the paper matrix), scaling with baselines
(docs/scaling.md, from the planner; written by `python -m jobs.sweep ... --dry-run --markdown`)."""
