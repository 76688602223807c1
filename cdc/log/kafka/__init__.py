"""The Kafka log: publishing the staging log to topics, and reading ours or Debezium's back (plain Python)."""
