"""Metrics: the stats snapshots (``stats.py``) and the Prometheus logger (``loggers.py``)."""
