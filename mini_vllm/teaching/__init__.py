"""Code that teaches the engine but is never part of it: the engine imports nothing from here.

* ``fragmentation``: contiguous (max-length reservation) versus paged allocation replayed on a
  request trace, the reference of lab-02;
* ``paged_attention_numpy``: paged attention in float64 numpy, the reference of lab-06 and the
  oracle the torch and Triton kernels are tested against;
* ``invariants``: the block pool's invariants I1-I4, stated once as code, for the reference's
  tests, the simulator and the graded suites;
* ``sim``: a deterministic simulator of the scheduler and the KV cache with a fake model
  (``python -m mini_vllm.teaching.sim``).

Importing this package imports none of them, so that each stays as cheap as its own imports.
"""
