"""The Iceberg follower kind (docs/follower-iceberg.md): one Iceberg table per source table,
written by the Spark apply job through an Iceberg catalog (catalog.py), exactly once per cut
(commit.py), schema changes by Iceberg's own evolution (schema.py)."""
