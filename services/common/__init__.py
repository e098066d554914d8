"""What the services share: settings, tokens, HTTP helpers, the orchestrator's client, run files."""
