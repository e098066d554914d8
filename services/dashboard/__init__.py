"""The dashboard: live heat maps of the grid in the browser (FastAPI, Server-Sent Events, no torch).

settings.py  where history and live events come from; the token; allowed origins
runfiles.py  a read-only view of a run directory (also used by the orchestrator's read endpoints)
history.py   the past: the orchestrator's HTTP API, run directories, or both
events.py    validated events, fanned out to the browsers' streams in batches
feeds.py     live events: RabbitMQ `palomino.events`, run directories as they are written
app.py       the FastAPI app: one page, /api, /api/events (SSE), /healthz
server.py    `palomino dashboard`, and the background server of `palomino train --dashboard`
static/      the page; static/vendor/ holds the npm libraries (see frontend/)
"""
