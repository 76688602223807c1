"""The parts of bench/chaos.py: a random workload, fault injectors with a supervisor that keeps
`cdc run` running, and an independent comparison of every follower with the source."""
