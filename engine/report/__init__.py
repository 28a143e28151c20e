"""What a run shows and records: per-step progress, timing and metrics (progress), what bounds
its speed (bounds) and what to change (advice)."""
