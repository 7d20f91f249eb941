"""What every router shares: typed dependencies (deps.py)."""
