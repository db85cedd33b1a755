# base: solution
# lab: lab-09
# tests: test_block_tables_of_the_mixed_batch, test_make_block_tables_pads_with_the_null_block
# honest: _p = prepare_inputs; prepare_inputs = lambda token_ids, computed, scheduled, block_ids, block_size, max_num_blocks_per_req=None: _p(token_ids, computed, scheduled, block_ids, block_size, max(max_num_blocks_per_req or 0, *map(len, block_ids), 0) or None)
"""``prepare_inputs`` widens block_tables past a ``max_num_blocks_per_req`` too small for the
step instead of refusing it (the honest bug), and returns an object whose ``block_tables``
raises ValueError when read. The suite read the result inside the same ``try`` as the call
(``as_list(prepare_inputs(...).block_tables)`` under ``except ValueError``), so the attribute
read passed for prepare_inputs' refusal: 3 points (lab-09's mixed-batch test) for a function
that never refuses. A refusal now counts only when the call itself raises; the result is read
after it, and a read that raises fails the test."""
_p = prepare_inputs


class _RefusesWhenRead(ModelInputs):
    _too_narrow = False

    def __getattribute__(self, name):
        if name == "block_tables" and object.__getattribute__(self, "_too_narrow"):
            raise ValueError("the block tables do not fit max_num_blocks_per_req")
        return object.__getattribute__(self, name)


def _widening(token_ids, computed, scheduled, block_ids, block_size, max_num_blocks_per_req=None):
    widest = max([0, *map(len, block_ids)])
    got = _p(
        token_ids,
        computed,
        scheduled,
        block_ids,
        block_size,
        max(max_num_blocks_per_req or 0, widest) or None,
    )
    out = _RefusesWhenRead(**{f: getattr(got, f) for f in got.__dataclass_fields__})
    out._too_narrow = bool(max_num_blocks_per_req) and widest > max_num_blocks_per_req
    return out


prepare_inputs = _widening
