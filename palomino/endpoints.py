"""Where the services are by default: one machine, the stock ports. Defined once, here, for the
command line (kept free of pydantic and torch), the services' settings and their messages."""

from __future__ import annotations

BROKER_URL = "amqp://guest:guest@127.0.0.1:5672/"
REDIS_URL = "redis://127.0.0.1:6379/0"
# Seconds a service keeps trying a broker that times out or refuses (starting, or a thousand
# workers connecting at once) before it gives up: PALOMINO_CONNECT_DEADLINE.
CONNECT_DEADLINE = 120.0
ORCHESTRATOR_PORT = 8000
ORCHESTRATOR_URL = f"http://127.0.0.1:{ORCHESTRATOR_PORT}"
DASHBOARD_PORT = 8080
