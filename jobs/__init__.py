"""Entry points and the one config schema: train, evaluate, sweep, report, model resolution."""
