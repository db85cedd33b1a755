"""Upstream fidelity: vLLM v0.22.1's own core tests and a differential test against mini_vllm.

A package so that the shim's modules import each other by relative name.
"""
