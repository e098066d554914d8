"""The engine: what drives training over the ports — the loop of a tile or of one cell alone
(loop.py), the cells one process hosts (hosting.py) and the embedded trainer of a whole grid
(embedded.py). The algorithm is palomino/coevolution; the run directory is palomino/runs."""
