"""The generic audit path for definitions nobody curated: fp64 oracle by promotion, probes derived from the definition."""
