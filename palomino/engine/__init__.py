"""The engine: what drives training over the ports — one cell's loop (loop.py), a tile's
(tile_loop.py), the cells one process hosts (hosting.py) and the embedded trainer of a whole grid
(embedded.py). The algorithm is palomino/coevolution; the run directory is palomino/runs."""
