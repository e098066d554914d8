"""The cell worker: registers, heartbeats, trains the cell it is assigned (torch)."""
