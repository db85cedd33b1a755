"""Executors: how the engine reaches its workers (in-process for one rank, processes for more)."""
