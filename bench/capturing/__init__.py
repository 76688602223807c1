"""The parts of bench/capture.py, one job each: `stream` (part 1), `snapshot` (part 2), `bigtxn`
(part 3), `profile` (cdc stream under cProfile), `summary` (the side-by-side table and lines)."""
