# base: solution
# lab: lab-10
# tests: test_each_step_decodes_a_few_tokens, test_ascii_one_token_a_step
# honest: _d = IncrementalDetokenizer._decode_next; IncrementalDetokenizer._decode_next = lambda self, flush=False: (setattr(self, "prefix_offset", 0), _d(self, flush), setattr(self, "prefix_offset", 0))[1]
"""The cost test counts the tokens the detokenizer passes to ``tokenizer.decode``; the counter
was an attribute of the tokenizer the learner's object holds. A detokenizer that decodes the
whole output again at every step (quadratic, a bug) sets it back to 0 after each call and the
count says a few tokens a step."""
_decode_next = IncrementalDetokenizer._decode_next


def _quadratic(self, flush=False):
    self.prefix_offset = 0
    delta = _decode_next(self, flush)
    self.prefix_offset = 0
    self.tokenizer.decoded_tokens = 0
    return delta


IncrementalDetokenizer._decode_next = _quadratic
