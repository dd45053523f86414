"""Ray plumbing only (knows nothing of LLMs): connect, groups of actors, collectives, weight transport."""
