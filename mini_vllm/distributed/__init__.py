"""Tensor parallelism's plumbing: process groups, collectives, and the sharding arithmetic."""
