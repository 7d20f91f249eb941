"""The stage's name.

It also salts every seed the stage draws (AuditContext.derive_seed): renaming it would
change every probe's inputs, axes and permutation.
"""

NAME = "probes"
