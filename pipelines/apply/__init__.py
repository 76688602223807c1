"""The apply job: Spark reads a cut's changes from the log and hands each follower its net changes."""
