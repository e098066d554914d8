"""The orchestrator: experiments, layout, liveness, results, and its HTTP API (no torch)."""
