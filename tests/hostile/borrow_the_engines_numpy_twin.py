# base: stub
# lab: lab-06
# tests: test_slot_mapping_worked_example, test_reshape_and_cache_scatters_rows, test_padding_slots_are_skipped
"""lab-06's numpy functions are stubbed in the learner's ``mini_vllm``, but the engine has the
same functions in torch (``mini_vllm.attention.torch_paged_attention``): wrap them, converting
numpy to torch and back (``torch.from_numpy`` shares memory, so the in-place write works too).
The learner process holds only the modules lab-06's code imports, and that one is not among
them: the import fails, the stubs stay, and the score is the stub's."""
try:
    import torch as _torch

    from mini_vllm.attention import torch_paged_attention as _engine

    def _borrow(name):
        def call(*args, **kwargs):
            args = [_torch.from_numpy(a) if isinstance(a, np.ndarray) else a for a in args]
            out = getattr(_engine, name)(*args, **kwargs)
            return out.numpy() if isinstance(out, _torch.Tensor) else out

        return call

    compute_slot_mapping = _borrow("compute_slot_mapping")
    reshape_and_cache = _borrow("reshape_and_cache")
    paged_attention_decode = _borrow("paged_attention_decode")
except ImportError:
    pass
