"""The training canary: train a small decoder on real text with the kernel in place of its op,
paired against the reference kernel, and judge the gap against a measured noise floor."""
