"""Buggy implementations of lab-10 (the output processor).

Each mutant is one mistake a learner plausibly makes, written as an edit of the solution
(``grading.mutants.Mutant``). ``python -m grading check-suites lab-10`` and
``tests/test_buggy_implementations.py`` check that the graded suite catches every one of them.
"""

from __future__ import annotations

from grading.mutants import Mutant

FILE = "output_processor.py"

MUTANTS = [
    # -- incremental detokenization --------------------------------------------------------------
    Mutant(
        name="decode_each_token_alone",
        file=FILE,
        find="""
            prefix_text = self._decode(self.tokens[self.prefix_offset : self.read_offset])
            new_text = self._decode(self.tokens[self.prefix_offset :])
        """,
        replace="""
            prefix_text = ""
            new_text = self._decode(self.tokens[self.read_offset :])
        """,
        why="decodes only the new tokens: half a character becomes U+FFFD in the stream, and "
        "the completing token decodes to another U+FFFD instead of the character",
        caught_by="test_detokenize.py::test_tokens_decode_in_context",
    ),
    Mutant(
        name="no_hold_back_on_replacement_char",
        file=FILE,
        find="if len(new_text) > len(prefix_text) and (flush or not new_text.endswith(REPLACEMENT_CHAR)):",
        replace="if len(new_text) > len(prefix_text):",
        why="emits text that ends in U+FFFD: the head of a split character is streamed as '�' "
        "and can never be taken back",
        caught_by="test_detokenize.py::test_split_character_is_held_back",
    ),
    Mutant(
        name="offsets_not_slid",
        file=FILE,
        find="""
            self.prefix_offset = self.read_offset
            self.read_offset = len(self.tokens)
        """,
        replace="""
            self.read_offset = len(self.tokens)
        """,
        why="never moves prefix_offset: the window grows with the whole output (quadratic "
        "decode) and, worse, its leading text is decoded again each step",
        caught_by="test_detokenize.py::test_each_step_decodes_a_few_tokens",
    ),
    Mutant(
        name="window_slid_past_a_silent_token",
        file=FILE,
        find="if len(new_text) > len(prefix_text) and (flush or not new_text.endswith(REPLACEMENT_CHAR)):",
        replace="if len(new_text) >= len(prefix_text) and (flush or not new_text.endswith(REPLACEMENT_CHAR)):",
        why=">= instead of >: a token that adds no text (a skipped special token) slides the "
        "window, and the next token is decoded without its context (SentencePiece drops its "
        "leading space)",
        caught_by="test_detokenize.py::test_tokens_decode_in_context",
    ),
    Mutant(
        name="held_back_while_fffd_anywhere",
        file=FILE,
        find="(flush or not new_text.endswith(REPLACEMENT_CHAR))",
        replace="(flush or REPLACEMENT_CHAR not in new_text)",
        why="holds text back while U+FFFD is anywhere in the window, not only at its end: after "
        "a stray byte no token completes, the stream stalls until the finish (and a stop "
        "string after it is found only then)",
        caught_by="test_detokenize.py::test_split_character_is_held_back",
    ),
    Mutant(
        name="no_flush_at_finish",
        file=FILE,
        find="""
            if finished:
                self.output_text += self.flush()
        """,
        replace="",
        why="forgets the held-back tail when the request finishes: an output that ends inside "
        "a character loses its last bytes instead of ending in U+FFFD",
        caught_by="test_detokenize.py::test_flush_at_the_end",
    ),
    Mutant(
        name="no_flush_when_stop_terminated",
        file=FILE,
        find="""
            if finished:
                self.output_text += self.flush()
        """,
        replace="""
            if finished and not stop_terminated:
                self.output_text += self.flush()
        """,
        why="skips the flush when the core stopped on EOS or a stop token: half a character "
        "held back just before it is lost instead of ending the text as U+FFFD",
        caught_by="test_detokenize.py::test_flush_at_the_end",
    ),
    Mutant(
        name="flush_decodes_held_alone",
        file=FILE,
        find="""
                return ""
            return self._decode_next(flush=True)
        """,
        replace="""
                return ""
            text = self._decode(self.tokens[self.read_offset :])
            self.read_offset = len(self.tokens)
            return text
        """,
        why="flush decodes the held-back tokens alone, without the window before them: a "
        "SentencePiece tokenizer drops their leading space",
        caught_by="test_detokenize.py::test_flush_at_the_end",
    ),
    Mutant(
        name="stop_terminated_token_decoded",
        file=FILE,
        find="if stop_terminated and new_token_ids and not self.include_stop_str_in_output:",
        replace="if False:",
        why="decodes the token the core stopped on: with skip_special_tokens=False the EOS "
        "text ends up in the answer",
        caught_by="test_stop_strings.py::test_stop_terminated_token_left_out",
    ),
    Mutant(
        name="stop_token_dropped_despite_include",
        file=FILE,
        find="if stop_terminated and new_token_ids and not self.include_stop_str_in_output:",
        replace="if stop_terminated and new_token_ids:",
        why="leaves out the stop token's text even with include_stop_str_in_output, which asks "
        "for it to be kept",
        caught_by="test_stop_strings.py::test_stop_terminated_token_left_out",
    ),
    Mutant(
        name="deltas_resend_everything",
        file=FILE,
        find="text = self.output_text[self._num_sent_chars : length]",
        replace="text = self.output_text[:length]",
        why="a streamed delta repeats all the text so far instead of only what is new",
        caught_by="test_detokenize.py::test_ascii_one_token_a_step",
    ),
    Mutant(
        name="no_stop_prefix_hold_back",
        file=FILE,
        find="""
            length = (
                len(self.output_text)
                if finished
                else max(len(self.output_text) - self.stop_buffer_length, 0)
            )
        """,
        replace="""
            length = len(self.output_text)
        """,
        why="streams the characters that may begin a stop string: when the next token completes "
        "it, the client has already received part of the stop string",
        caught_by="test_stop_strings.py::test_stream_holds_back_a_possible_stop_prefix",
    ),
    Mutant(
        name="stop_prefix_hold_back_not_clamped",
        file=FILE,
        find="else max(len(self.output_text) - self.stop_buffer_length, 0)",
        replace="else len(self.output_text) - self.stop_buffer_length",
        why="no max(..., 0): while the text is shorter than the hold-back, the length is "
        "negative and output_text[:length] hands out its head ('H' of 'Hi' with stop 'STOP')",
        caught_by="test_stop_strings.py::test_stream_holds_back_a_possible_stop_prefix",
    ),
    # -- stop strings ---------------------------------------------------------------------------
    Mutant(
        name="stop_search_only_new_text",
        file=FILE,
        find="start = max(len(output_text) - new_char_count - len(stop_str) + 1, 0)",
        replace="start = max(len(output_text) - new_char_count, 0)",
        why="searches only the new characters: a stop string that began in an earlier step and "
        "ends in this one is missed",
        caught_by="test_stop_strings.py::test_stop_string_across_tokens",
    ),
    Mutant(
        name="stop_search_starts_one_early",
        file=FILE,
        find="start = max(len(output_text) - new_char_count - len(stop_str) + 1, 0)",
        replace="start = max(len(output_text) - new_char_count - len(stop_str), 0)",
        why="off by one: the search starts len(stop) characters before the new text, so a "
        "match that ended just before it (complete, and reported, a step ago) is reported again",
        caught_by="test_stop_strings.py::test_check_stop_strings_looks_only_at_the_tail",
    ),
    Mutant(
        name="stop_first_in_list_wins",
        file=FILE,
        find="if index != -1 and (best is None or index < best[0]):",
        replace="if index != -1 and best is None:",
        why="takes the first stop string of the list that occurs, not the one that starts first "
        "in the text",
        caught_by="test_stop_strings.py::test_first_occurrence_wins",
    ),
    Mutant(
        name="stop_longest_wins",
        file=FILE,
        find="if index != -1 and (best is None or index < best[0]):",
        replace="if index != -1 and (best is None or len(stop_str) > len(best[1])):",
        why="prefers the longest stop string found over the one that starts first: the text "
        "runs on past an earlier, shorter stop string",
        caught_by="test_stop_strings.py::test_first_occurrence_wins",
    ),
    Mutant(
        name="stop_returns_last_listed",
        file=FILE,
        find="index, stop_str = best",
        replace="index, _ = best",
        why="returns the loop variable, the last stop string of the list, with the index of "
        "the earliest match: stop_reason names the wrong string",
        caught_by="test_stop_strings.py::test_first_occurrence_wins",
    ),
    Mutant(
        name="stop_cut_after_string",
        file=FILE,
        find="""
            return stop_str, index
        """,
        replace="""
            return stop_str, index + len(stop_str)
        """,
        why="cuts after the stop string although include_stop_str_in_output is off: the stop "
        "string is part of the answer",
        caught_by="test_stop_strings.py::test_stop_string_inside_one_step",
    ),
    Mutant(
        name="cut_at_minus_one",
        file=FILE,
        find="""
            if truncate_to != -1:
                self.output_text = self.output_text[:truncate_to]
        """,
        replace="""
            self.output_text = self.output_text[:truncate_to]
        """,
        why="cuts at truncate_to without looking for -1 ('nothing to cut'): with "
        "include_stop_str_in_output, a stop string that ends the text loses its last "
        "character (output_text[:-1])",
        caught_by="test_stop_strings.py::test_include_stop_str_in_output",
    ),
    # -- the output processor -------------------------------------------------------------------
    Mutant(
        name="stop_string_no_abort",
        file=FILE,
        find="""
                if not out.finished:
                    result.reqs_to_abort.append(out.request_id)
        """,
        replace="",
        why="finishes the request in the front-end but never asks the core to abort it: it keeps "
        "generating into its KV blocks until max_tokens",
        caught_by="test_processor.py::test_stop_string_finishes_and_asks_the_core_to_abort",
    ),
    Mutant(
        name="abort_even_if_core_finished",
        file=FILE,
        find="""
                if not out.finished:
                    result.reqs_to_abort.append(out.request_id)
        """,
        replace="""
                result.reqs_to_abort.append(out.request_id)
        """,
        why="asks the core to abort a request it has already finished and freed",
        caught_by="test_processor.py::test_stop_string_in_the_last_step_needs_no_abort",
    ),
    Mutant(
        name="stop_string_keeps_core_reason",
        file=FILE,
        find='finish_reason, stop_reason = "stop", stop_str',
        replace="stop_reason = stop_str",
        why="records the stop string but leaves finish_reason None: the request never finishes "
        "in the front-end",
        caught_by="test_processor.py::test_stop_string_finishes_and_asks_the_core_to_abort",
    ),
    Mutant(
        name="state_kept_after_finish",
        file=FILE,
        find="""
            if finished:
                del self.request_states[out.request_id]
        """,
        replace="""
            if finished:
                pass
        """,
        why="never forgets finished requests: request_states grows forever and a late output "
        "for a finished id produces a second finished output",
        caught_by="test_processor.py::test_core_finish_reasons",
    ),
    Mutant(
        name="abort_unknown_raises",
        file=FILE,
        find="return [rid for rid in request_ids if self.request_states.pop(rid, None) is not None]",
        replace="return [rid for rid in request_ids if self.request_states.pop(rid)]",
        why="abort of an id already gone raises KeyError: a disconnect that crosses the last "
        "output kills the output handler",
        caught_by="test_processor.py::test_aborts",
    ),
    Mutant(
        name="abort_returns_all_ids",
        file=FILE,
        find="return [rid for rid in request_ids if self.request_states.pop(rid, None) is not None]",
        replace="""
            for rid in request_ids:
                self.request_states.pop(rid, None)
            return list(request_ids)
        """,
        why="returns every id asked for, also unknown ones: the caller sends the core aborts "
        "for requests that do not exist",
        caught_by="test_processor.py::test_aborts",
    ),
    Mutant(
        name="unknown_output_raises",
        file=FILE,
        find="""
            state = self.request_states.get(out.request_id)
            if state is None:
                continue  # aborted (or stopped by a stop string) while this step ran
        """,
        replace="""
            state = self.request_states[out.request_id]
        """,
        why="a step's output for a request aborted meanwhile raises KeyError instead of being "
        "ignored",
        caught_by="test_processor.py::test_stop_string_finishes_and_asks_the_core_to_abort",
    ),
    Mutant(
        name="core_stop_reason_dropped",
        file=FILE,
        find="stop_reason = out.stop_reason",
        replace="stop_reason = None",
        why="sets stop_reason only for a stop string: a request the core stopped on a stop "
        "token id reports stop_reason None instead of the token",
        caught_by="test_processor.py::test_core_finish_reasons",
    ),
    Mutant(
        name="update_not_told_finished",
        file=FILE,
        find="""
                finished=out.finished,
                stop_terminated=out.finish_reason == "stop",
        """,
        replace="""
                stop_terminated=out.finish_reason == "stop",
        """,
        why="calls update without finished: nothing is flushed, so a request the core cut "
        "by max_tokens in the middle of a character loses its last bytes",
        caught_by="test_processor.py::test_the_last_output_finishes_the_text",
    ),
    Mutant(
        name="output_without_tokens_skipped",
        file=FILE,
        find="if iteration_stats is not None and out.new_token_ids:",
        replace="""
            if not out.new_token_ids:
                continue
            if iteration_stats is not None and out.new_token_ids:
        """,
        why="skips an output that brings no token: the core's finishing output for a request "
        "it ended without a new token ('abort') is lost, and the client waits forever",
        caught_by="test_processor.py::test_the_last_output_finishes_the_text",
    ),
    Mutant(
        name="error_handled_before_lookup",
        file=FILE,
        find="""
            state = self.request_states.get(out.request_id)
            if state is None:
                continue  # aborted (or stopped by a stop string) while this step ran
            if out.error is not None:
                del self.request_states[out.request_id]
                state.queue.put_nowait(ValueError(out.error))
                continue
        """,
        replace="""
            if out.error is not None:
                state = self.request_states.pop(out.request_id)
                state.queue.put_nowait(ValueError(out.error))
                continue
            state = self.request_states.get(out.request_id)
            if state is None:
                continue
        """,
        why="handles the error before skipping ids no longer tracked: an error for a request "
        "the client aborted meanwhile raises KeyError and kills the output handler",
        caught_by="test_processor.py::test_error_output_fails_the_request",
    ),
    Mutant(
        name="stop_terminated_only_on_stop_token_id",
        file=FILE,
        find='stop_terminated=out.finish_reason == "stop",',
        replace="stop_terminated=out.stop_reason is not None,",
        why="takes only a stop token id (stop_reason set) for a stop-terminated finish: on EOS "
        "(stop_reason None) with skip_special_tokens=False the answer ends in '<|endoftext|>'",
        caught_by="test_processor.py::test_core_finish_reasons",
    ),
    Mutant(
        name="error_output_not_forgotten",
        file=FILE,
        find="""
            if out.error is not None:
                del self.request_states[out.request_id]
        """,
        replace="""
            if out.error is not None:
        """,
        why="fails the request on its queue but keeps tracking it: request_states leaks, and "
        "a later output for it is processed as if it still ran",
        caught_by="test_processor.py::test_error_output_fails_the_request",
    ),
    Mutant(
        name="error_output_ignored",
        file=FILE,
        find="""
            if out.error is not None:
                del self.request_states[out.request_id]
                state.queue.put_nowait(ValueError(out.error))
                continue
        """,
        replace="",
        why="treats an error output as an ordinary one: the client gets an empty unfinished "
        "output and waits forever for a request the core has failed",
        caught_by="test_processor.py::test_error_output_fails_the_request",
    ),
    Mutant(
        name="error_output_wrong_exception",
        file=FILE,
        find="state.queue.put_nowait(ValueError(out.error))",
        replace="state.queue.put_nowait(RuntimeError(out.error))",
        why="puts a RuntimeError on the queue instead of the ValueError the contract names: "
        "a caller that catches ValueError for a failed request misses it",
        caught_by="test_processor.py::test_error_output_fails_the_request",
    ),
    # -- logprobs ------------------------------------------------------------------------------
    Mutant(
        name="logprobs_not_recorded",
        file=FILE,
        find="state.logprobs_processor.update_from_output(out)",
        replace="pass",
        why="never hands the rows on: a request that asked for logprobs gets an empty list and "
        "a cumulative logprob of 0",
        caught_by="test_processor.py::test_logprobs_reach_the_outputs",
    ),
    Mutant(
        name="logprobs_only_while_running",
        file=FILE,
        find="state.logprobs_processor.update_from_output(out)",
        replace="""
            if not out.finished:
                state.logprobs_processor.update_from_output(out)
        """,
        why="drops the last step's rows: the finished output has one logprob fewer than tokens",
        caught_by="test_processor.py::test_logprobs_reach_the_outputs",
    ),
    Mutant(
        name="prompt_logprobs_only_with_sample_logprobs",
        file=FILE,
        find="state.logprobs_processor.update_from_output(out)",
        replace="""
            if out.new_logprobs is not None:
                state.logprobs_processor.update_from_output(out)
        """,
        why="hands an output on only when it has sample logprobs: a request that asked for "
        "prompt logprobs alone never gets them",
        caught_by="test_processor.py::test_prompt_logprobs_reach_the_outputs",
    ),
    Mutant(
        name="only_the_sample_rows_handed_on",
        file=FILE,
        find="state.logprobs_processor.update_from_output(out)",
        replace="state.logprobs_processor.update_from_output(out.new_logprobs)",
        why="hands on the sample rows, the older contract: the processor takes the whole "
        "output (sample and prompt logprobs), so every request crashes",
        caught_by="test_processor.py::test_logprobs_reach_the_outputs",
    ),
    Mutant(
        name="cut_only_two_characters_before_the_end",
        file=FILE,
        find="return stop_str, (end if end < len(output_text) else -1)",
        replace="return stop_str, (end if end < len(output_text) - 1 else -1)",
        why="'nothing to cut' (-1) also when one character follows the stop string: with "
        "include_stop_str_in_output, 'the!' keeps its '!' past the stop string",
        caught_by="test_stop_strings.py::test_include_stop_str_in_output",
    ),
    Mutant(
        name="stop_strings_checked_before_the_flush",
        file=FILE,
        find="""
            if finished:
                self.output_text += self.flush()
                if len(self.output_token_ids) - (skipped is not None) <= self.min_tokens:
                    # The flush adds the last decoded token's held-back text: exempt with it.
                    stop_check_offset = len(self.output_text)
            if not self.stop or len(self.output_token_ids) <= self.min_tokens:
                return None
            new_char_count = len(self.output_text) - stop_check_offset
            match = check_stop_strings(
                self.output_text, new_char_count, self.stop, self.include_stop_str_in_output
            )
            if match is None:
                return None
        """,
        replace="""
            if not self.stop or len(self.output_token_ids) <= self.min_tokens:
                if finished:
                    self.output_text += self.flush()
                return None
            new_char_count = len(self.output_text) - stop_check_offset
            match = check_stop_strings(
                self.output_text, new_char_count, self.stop, self.include_stop_str_in_output
            )
            if match is None:
                if finished:
                    self.output_text += self.flush()
                return None
        """,
        why="the stop strings are looked for before the finish's flush: a stop string that only "
        "the flushed text completes is never seen, and the request ends on length showing it",
        caught_by="test_stop_strings.py::test_stop_string_inside_one_step",
    ),
    Mutant(
        name="error_tested_for_truth",
        file=FILE,
        find="if out.error is not None:",
        replace="if out.error:",
        why="an error is tested for truth: the core's failure of an exception with no message "
        "(error '') is streamed as a normal output with finish_reason 'error'",
        caught_by="test_processor.py::test_error_output_fails_the_request",
    ),
    Mutant(
        name="abort_returns_the_ids_as_asked",
        file=FILE,
        find="        return [rid for rid in request_ids if self.request_states.pop(rid, None) is not None]",
        replace="""        found = [rid for rid in request_ids if rid in self.request_states]
        for rid in found:
            self.request_states.pop(rid, None)
        return found""",
        why="filters the ids by membership before forgetting any: an id listed twice is "
        "returned twice, and the core is asked to abort it twice",
        caught_by="test_processor.py::test_aborts",
    ),
    Mutant(
        name="no_stop_strings_when_the_core_stopped",
        file=FILE,
        find="""
                if not self.stop or len(self.output_token_ids) <= self.min_tokens:
                    return None
        """,
        replace="""
                if not self.stop or len(self.output_token_ids) <= self.min_tokens or stop_terminated:
                    return None
        """,
        why="skips the stop strings when the core stopped on EOS or a stop token: a stop "
        "string completed in that same step is left in the text",
        caught_by="test_processor.py::test_stop_string_in_the_last_step_needs_no_abort",
    ),
    Mutant(
        name="core_stop_reason_kept_over_the_stop_string",
        file=FILE,
        find="            if stop_str is not None:\n                finish_reason, stop_reason",
        replace='            if stop_str is not None and finish_reason != "stop":\n'
        "                finish_reason, stop_reason",
        why="keeps the core's stop_reason (None for EOS, the token id) when a stop string "
        "completes in the step the core stopped: the client is told the wrong reason",
        caught_by="test_processor.py::test_stop_string_in_the_last_step_needs_no_abort",
    ),
    Mutant(
        name="abort_asked_unless_the_core_hit_the_length",
        file=FILE,
        find="""
                        if not out.finished:
                            result.reqs_to_abort.append(out.request_id)
        """,
        replace="""
                        if out.finish_reason != "length":
                            result.reqs_to_abort.append(out.request_id)
        """,
        why="asks the core to abort a request stopped by a stop string unless the core ended "
        "it by length: a request the core already stopped on EOS is aborted too",
        caught_by="test_processor.py::test_stop_string_in_the_last_step_needs_no_abort",
    ),
    Mutant(
        name="stop_strings_checked_after_each_token",
        file=FILE,
        find="""
                    self.output_text += self._decode_next()
                    if len(self.output_token_ids) <= self.min_tokens:
                        stop_check_offset = len(self.output_text)
                if skipped is not None:
        """,
        replace="""
                    before = len(self.output_text)
                    self.output_text += self._decode_next()
                    if len(self.output_token_ids) <= self.min_tokens:
                        stop_check_offset = len(self.output_text)
                    if self.stop:
                        match = check_stop_strings(
                            self.output_text,
                            len(self.output_text) - before,
                            self.stop,
                            self.include_stop_str_in_output,
                        )
                        if match is not None:
                            if match[1] != -1:
                                self.output_text = self.output_text[: match[1]]
                            return match[0]
                if skipped is not None:
        """,
        why="looks for stop strings after each token and returns at the first match: the "
        "step's later tokens never become output tokens (the RequestOutput has fewer token "
        "ids than logprob rows)",
        caught_by="test_stop_strings.py::test_stop_string_inside_one_step",
    ),
    Mutant(
        name="abort_requests_as_a_generator",
        file=FILE,
        find="        return [rid for rid in request_ids if self.request_states.pop(rid, None) is "
        "not None]\n",
        replace="""
                for rid in request_ids:
                    if self.request_states.pop(rid, None) is not None:
                        yield rid
        """,
        why="abort_requests yields the ids: nothing is forgotten until a caller walks the "
        "answer, and a caller that ignores it (AsyncLLM's error path) leaks the request",
        caught_by="test_processor.py::test_aborts",
    ),
    Mutant(
        name="stop_token_popped_from_the_callers_list",
        file=FILE,
        find="        new_token_ids = [int(t) for t in new_token_ids]\n",
        replace="",
        why="pops the stop token from the caller's own list of new token ids (a tuple, which "
        "the signature allows, raises AttributeError)",
        caught_by="test_stop_strings.py::test_stop_terminated_token_left_out",
    ),
    Mutant(
        name="every_search_starts_at_the_longest_string",
        file=FILE,
        find="            start = max(len(output_text) - new_char_count - len(stop_str) + 1, 0)\n",
        replace="            start = max(\n"
        "                len(output_text) - new_char_count - max(len(s) for s in stop) + 1, 0\n"
        "            )\n",
        why="starts every string's search len(longest) - 1 characters back: a short string "
        "that ended before the new text is reported again",
        caught_by="test_stop_strings.py::test_check_stop_strings_looks_only_at_the_tail",
    ),
    Mutant(
        name="stop_string_tie_to_the_last_listed",
        file=FILE,
        find="best is None or index < best[0]",
        replace="best is None or index <= best[0]",
        why="of two stop strings starting at the same place, keeps the one listed last "
        "(upstream and the README: the first)",
        caught_by="test_stop_strings.py::test_first_occurrence_wins",
    ),
    Mutant(
        name="never_streams_until_the_finish",
        file=FILE,
        find="else max(len(self.output_text) - self.stop_buffer_length, 0)",
        replace="else 0",
        why="hands out nothing until the finish, then everything at once: the deltas still add "
        "up to the full text and no step ends in U+FFFD, but the client sees no stream (each "
        "step must hand out the text that is final then)",
        caught_by="test_detokenize.py::test_deltas_add_up_to_the_full_decode",
    ),
    Mutant(
        name="holds_back_one_character_too_many",
        file=FILE,
        find="else max(len(self.output_text) - self.stop_buffer_length, 0)",
        replace="else max(len(self.output_text) - self.stop_buffer_length - 1, 0)",
        why="holds back len(longest stop) characters instead of len(longest stop) - 1: the "
        "last character of a text that cannot begin a stop string waits a step for nothing "
        "(the deltas still add up)",
        caught_by="test_stop_strings.py::test_stop_string_across_tokens",
    ),
    # -- helper probe, 2026-11-28 (round 1) -----------------------------------------------------
    Mutant(
        name="stream_holds_back_despite_include",
        file=FILE,
        find="else max(len(self.output_text) - self.stop_buffer_length, 0)",
        replace="else max(len(self.output_text) - (max((len(s) for s in self.stop), default=1) - 1), 0)",
        why="holds back len(longest stop) - 1 characters also with include_stop_str_in_output, "
        "where stop_buffer_length is 0 (the stop string is shown anyway): the stream lags for "
        "nothing (the deltas still add up)",
        caught_by="test_stop_strings.py::test_stream_holds_back_a_possible_stop_prefix",
    ),
    Mutant(
        name="stream_holds_back_for_the_first_stop_only",
        file=FILE,
        find="else max(len(self.output_text) - self.stop_buffer_length, 0)",
        replace="else max(len(self.output_text) - (len(self.stop[0]) - 1 if self.stop and not "
        "self.include_stop_str_in_output else 0), 0)",
        why="sizes the hold-back by the first stop string, not the longest: with stops ['!', "
        "'STOP'] nothing waits, and the start of 'STOP' is streamed before it is known to be one",
        caught_by="test_stop_strings.py::test_stream_holds_back_a_possible_stop_prefix",
    ),
    Mutant(
        name="update_returns_early_without_tokens",
        file=FILE,
        find="        new_token_ids = [int(t) for t in new_token_ids]\n",
        replace="        new_token_ids = [int(t) for t in new_token_ids]\n"
        "        if not new_token_ids:\n"
        "            return None\n",
        why="a step with no token returns at once: a finishing step that brings none (the core "
        "aborted the request) neither flushes a held-back half character nor finds the stop "
        "string that the flush shows",
        caught_by="test_detokenize.py::test_flush_at_the_end",
    ),
    Mutant(
        name="empty_finishing_output_not_detokenized",
        file=FILE,
        find="""
            stop_str = state.detokenizer.update(
                out.new_token_ids,
                finished=out.finished,
                stop_terminated=out.finish_reason == "stop",
            )
        """,
        replace="""
            stop_str = None
            if out.new_token_ids:
                stop_str = state.detokenizer.update(
                    out.new_token_ids,
                    finished=out.finished,
                    stop_terminated=out.finish_reason == "stop",
                )
        """,
        why="calls update only for an output with tokens: a request the core finishes in a step "
        "that brings it none ('abort') never flushes its held-back half character",
        caught_by="test_processor.py::test_the_last_output_finishes_the_text",
    ),
    Mutant(
        name="stop_match_that_ends_first_with_include",
        file=FILE,
        find="if index != -1 and (best is None or index < best[0]):",
        replace="if index != -1 and (best is None or (index + len(stop_str) if include_in_output "
        "else index) < (best[0] + len(best[1]) if include_in_output else best[0])):",
        why="with include_in_output picks the match that ends first (where the cut goes), not "
        "the one that starts first: stops ['bc', 'abcd'] over 'xabcdy' keep 'xabc'",
        caught_by="test_stop_strings.py::test_first_occurrence_wins",
    ),
    Mutant(
        name="stop_tie_to_the_shortest",
        file=FILE,
        find="    for stop_str in stop:\n        start",
        replace="    for stop_str in sorted(stop, key=len):\n        start",
        why="searches the stop strings shortest first: of two that start at the same place the "
        "shorter wins, not the one listed first",
        caught_by="test_stop_strings.py::test_first_occurrence_wins",
    ),
    Mutant(
        name="flush_when_a_stop_string_ends_the_request",
        file=FILE,
        find="        stop_str, truncate_to = match\n",
        replace="        stop_str, truncate_to = match\n"
        "        if not finished:\n"
        "            self.output_text += self.flush()\n",
        why="flushes when a stop string ends the request: with include_stop_str_in_output and the "
        "stop string at the end of the text, a half character held back after it is added as "
        "U+FFFD (upstream flushes only when the core finished the request)",
        caught_by="test_stop_strings.py::test_include_stop_str_in_output",
    ),
    Mutant(
        name="abort_filters_the_callers_list",
        file=FILE,
        find="        return [rid for rid in request_ids if self.request_states.pop(rid, None) is "
        "not None]\n",
        replace="""
            for rid in list(request_ids):
                if self.request_states.pop(rid, None) is None:
                    request_ids.remove(rid)  # type: ignore[attr-defined]
            return request_ids  # type: ignore[return-value]
        """,
        why="removes the untracked ids from the caller's own list and returns it: the answer is "
        "right, but the caller's list has changed under it (and a tuple, which the signature "
        "allows, raises AttributeError)",
        caught_by="test_processor.py::test_aborts",
    ),
    Mutant(
        name="stop_search_start_of_the_first_string",
        file=FILE,
        find="""
            best: tuple[int, str] | None = None
            for stop_str in stop:
                start = max(len(output_text) - new_char_count - len(stop_str) + 1, 0)
        """,
        replace="""
            best: tuple[int, str] | None = None
            start = max(len(output_text) - new_char_count - len(stop[0]) + 1, 0)
            for stop_str in stop:
        """,
        why="computes the search's start once, from the first stop string: a longer one listed "
        "after it that began before the new text is never found (stops ['!', 'STOP'], 'ST' "
        "then 'OP')",
        caught_by="test_stop_strings.py::test_check_stop_strings_looks_only_at_the_tail",
    ),
    Mutant(
        name="stop_token_decoded_then_cut_off_by_its_text",
        file=FILE,
        find="""
            if stop_terminated and new_token_ids and not self.include_stop_str_in_output:
                skipped = new_token_ids.pop()
            for token_id in new_token_ids:
                self.tokens.append(token_id)
                self.output_token_ids.append(token_id)
                self.output_text += self._decode_next()
                if len(self.output_token_ids) <= self.min_tokens:
                    stop_check_offset = len(self.output_text)
            if skipped is not None:
                self.output_token_ids.append(skipped)  # counted as output, never decoded
        """,
        replace="""
            for token_id in new_token_ids:
                self.tokens.append(token_id)
                self.output_token_ids.append(token_id)
                self.output_text += self._decode_next()
                if len(self.output_token_ids) <= self.min_tokens:
                    stop_check_offset = len(self.output_text)
            if stop_terminated and new_token_ids and not self.include_stop_str_in_output:
                last = self._decode([new_token_ids[-1]])
                if last and self.output_text.endswith(last):
                    self.output_text = self.output_text[: -len(last)]
        """,
        why="decodes the stop token with the others, then cuts its text decoded alone off the "
        "end: a token whose text depends on its context (SentencePiece's ' world' alone is "
        "'world') leaves a trace, a space here",
        caught_by="test_stop_strings.py::test_stop_terminated_token_left_out",
    ),
    Mutant(
        name="delta_false_marks_the_text_sent",
        file=FILE,
        find="        if not delta:\n            return self.output_text[:length]\n",
        replace="        if not delta:\n"
        "            self._num_sent_chars = max(self._num_sent_chars, length)\n"
        "            return self.output_text[:length]\n",
        why="a delta=False call counted as handing the text out: a stream asked for the whole "
        "text first gets only empty deltas (found by a blind implementation, which read "
        "'what earlier calls handed out' as any call)",
        caught_by="test_detokenize.py::test_ascii_one_token_a_step",
    ),
    Mutant(
        name="error_message_reworded",
        file=FILE,
        find="state.queue.put_nowait(ValueError(out.error))",
        replace='state.queue.put_nowait(ValueError(f"request {out.request_id} failed: {out.error}"))',
        why="the core's message wrapped in words of the processor's own: the client's error "
        "no longer is the core's, which the README's task row now fixes",
        caught_by="test_processor.py::test_error_output_fails_the_request",
    ),
    # -- min_tokens and stop strings ------------------------------------------------------------
    Mutant(
        name="stop_strings_ignore_min_tokens",
        file=FILE,
        find="""
                if len(self.output_token_ids) <= self.min_tokens:
                    stop_check_offset = len(self.output_text)
        """,
        replace="",
        more=(
            (
                "if not self.stop or len(self.output_token_ids) <= self.min_tokens:",
                "if not self.stop:",
            ),
        ),
        why="looks for stop strings from the first output token: a stop string inside the "
        "min_tokens the request must produce ends it early",
        caught_by="test_stop_strings.py::test_no_stop_string_within_min_tokens",
    ),
    Mutant(
        name="min_tokens_gates_the_step_not_the_text",
        file=FILE,
        find="""
                if len(self.output_token_ids) <= self.min_tokens:
                    stop_check_offset = len(self.output_text)
        """,
        replace="",
        why="skips the search while min_tokens are not out, but then searches the whole step's "
        "new text, the exempt tokens' text included, when min_tokens is reached inside a step",
        caught_by="test_stop_strings.py::test_no_stop_string_within_min_tokens",
    ),
    # -- helper probe, 2026-11-29 (min_tokens, logprobs) ----------------------------------------
    Mutant(
        name="min_tokens_counted_over_the_window",
        file=FILE,
        find="""
                if len(self.output_token_ids) <= self.min_tokens:
                    stop_check_offset = len(self.output_text)
        """,
        replace="""
                if len(self.tokens) <= self.min_tokens:
                    stop_check_offset = len(self.output_text)
        """,
        more=(
            (
                "if not self.stop or len(self.output_token_ids) <= self.min_tokens:",
                "if not self.stop or len(self.tokens) <= self.min_tokens:",
            ),
        ),
        why="counts min_tokens over the window's tokens, which begin with up to 5 of the "
        "prompt's: after a prompt the exemption ends early (or never starts), and a stop string "
        "inside the first min_tokens output tokens' text ends the request",
        caught_by="test_stop_strings.py::test_no_stop_string_within_min_tokens",
    ),
    Mutant(
        name="logprobs_skipped_on_a_stop_string",
        file=FILE,
        find="            state.logprobs_processor.update_from_output(out)\n",
        replace="""
                if stop_str is None:
                    state.logprobs_processor.update_from_output(out)
        """,
        why="adds a step's logprob rows only when no stop string ended it: the finished output "
        "of a request stopped by a stop string lacks its last step's rows (fewer rows than "
        "token ids, a wrong cumulative_logprob)",
        caught_by="test_processor.py::test_logprobs_reach_the_outputs",
    ),
    Mutant(
        name="min_tokens_exempt_text_decoded_apart",
        file=FILE,
        find="""
                if len(self.output_token_ids) <= self.min_tokens:
                    stop_check_offset = len(self.output_text)
        """,
        replace="",
        more=(
            (
                """
                if not self.stop or len(self.output_token_ids) <= self.min_tokens:
                    return None
                """,
                """
                if not self.stop or len(self.output_token_ids) <= self.min_tokens:
                    return None
                if self.min_tokens:
                    exempt = self._decode(self.output_token_ids[: self.min_tokens])
                    stop_check_offset = max(stop_check_offset, len(exempt))
                """,
            ),
        ),
        why="measures the exempt text by decoding the first min_tokens output tokens apart: when "
        "the min_tokens-th token only begins a character, that decode ends in U+FFFD, one "
        "character too long, and the stop string the next token completes is never found",
        caught_by="test_stop_strings.py::test_no_stop_string_within_min_tokens",
    ),
    Mutant(
        name="flush_of_an_exempt_token_searched",
        file=FILE,
        find="""
                if len(self.output_token_ids) - (skipped is not None) <= self.min_tokens:
                    # The flush adds the last decoded token's held-back text: exempt with it.
                    stop_check_offset = len(self.output_text)
        """,
        replace="",
        why="the finish's flush is searched when a stop-terminated token makes one output token "
        "more than min_tokens: the held-back text of the min_tokens-th token, exempt, stops it",
        caught_by="test_stop_strings.py::test_no_stop_string_within_min_tokens",
    ),
    # -- probe of 2026-11-29 (2) ------------------------------------------------------------------
    Mutant(
        name="last_character_indexed_before_the_length_check",
        file=FILE,
        find="        if len(new_text) > len(prefix_text) and (flush or not new_text.endswith(REPLACEMENT_CHAR)):",
        replace="""
            if not flush and new_text[-1] == REPLACEMENT_CHAR:
                return ""
            if len(new_text) > len(prefix_text):
        """,
        why="looks at the window's last character before asking whether the text grew: with no "
        "prompt, a skipped special token first decodes to '' and new_text[-1] raises IndexError "
        "(the only skipped-first case came after a prompt)",
        caught_by="test_detokenize.py::test_tokens_decode_in_context",
    ),
    Mutant(
        name="flush_exempt_whenever_min_tokens",
        file=FILE,
        find="            if len(self.output_token_ids) - (skipped is not None) <= self.min_tokens:",
        replace="            if self.min_tokens:",
        why="never searches what the finish's flush adds when min_tokens is set, even when the "
        "last token decoded is past the first min_tokens: only the exempt side of that boundary "
        "was tried",
        caught_by="test_stop_strings.py::test_no_stop_string_within_min_tokens",
    ),
    Mutant(
        name="skipped_token_subtracted_after_counting_it_late",
        file=FILE,
        find="""
            if skipped is not None:
                self.output_token_ids.append(skipped)  # counted as output, never decoded
            if finished:
        """,
        replace="""
            if finished:
        """,
        more=(
            (
                "        if not self.stop or len(self.output_token_ids) <= self.min_tokens:",
                """
                if skipped is not None:
                    self.output_token_ids.append(skipped)  # counted as output, never decoded
                if not self.stop or len(self.output_token_ids) <= self.min_tokens:
                """,
            ),
        ),
        why="the stop token counted after the flush, but the flush's exemption still subtracts "
        "it: the flush of the (min_tokens + 1)-th output token is exempted and a stop string "
        "it completes is missed",
        caught_by="test_stop_strings.py::test_no_stop_string_within_min_tokens",
    ),
    Mutant(
        name="stop_search_scans_the_whole_text",
        file=FILE,
        find="""
            start = max(len(output_text) - new_char_count - len(stop_str) + 1, 0)
            index = output_text.find(stop_str, start)
        """,
        replace="""
            start = max(len(output_text) - new_char_count - len(stop_str) + 1, 0)
            index = output_text.find(stop_str)
            while index != -1 and index < start:
                index = output_text.find(stop_str, index + 1)
        """,
        why="each stop string is searched from the start of the text and old matches skipped: "
        "the right answer, but every step reads the whole output, O(n^2) over a request "
        "(README task 5: find from len(stop) - 1 characters before the new text; a complexity "
        "probe, 2026-11-29)",
        caught_by="test_stop_strings.py::test_stop_search_reads_only_the_tail",
    ),
    Mutant(
        name="outputs_matched_by_walking_the_states",
        file=FILE,
        find="state = self.request_states.get(out.request_id)",
        replace="state = next(\n"
        "    (s for rid, s in list(self.request_states.items()) if rid == out.request_id), None\n"
        ")",
        why="each output's request is found by walking request_states: right, but a step costs "
        "O(outputs x tracked requests), and a server tracks thousands (README: a step's work "
        "grows with its outputs; a complexity probe, 2026-11-29)",
        caught_by="test_processor.py::test_a_step_costs_its_outputs",
    ),
    Mutant(
        name="abort_rebuilds_the_states",
        file=FILE,
        find="return [rid for rid in request_ids if self.request_states.pop(rid, None) is not None]",
        replace="ids = list(request_ids)\n"
        "found = [rid for rid in ids if rid in self.request_states]\n"
        "self.request_states = {k: v for k, v in self.request_states.items() if k not in ids}\n"
        "return [rid for i, rid in enumerate(ids) if rid in found and rid not in ids[:i]]",
        why="abort_requests rebuilds request_states without the aborted ids: the same answer, "
        "but each abort costs O(tracked requests) (README task 6: pop each id; a complexity "
        "probe, 2026-11-29)",
        caught_by="test_processor.py::test_a_step_costs_its_outputs",
    ),
    # -- helper probe, 2026-11-29 (9): caught by the random workloads only -----------------------
    Mutant(
        name="stop_found_with_rfind",
        file=FILE,
        find="index = output_text.find(stop_str, start)",
        replace="index = output_text.rfind(stop_str, start)",
        why="looks for each stop string with rfind: when the new text holds the same stop "
        "string twice, the text is cut at the second one and the first is handed out (README "
        "task 5: find it from len(stop) - 1 characters before the new text)",
        caught_by="test_stop_strings.py::test_first_occurrence_wins",
    ),
    Mutant(
        name="stop_string_ends_the_step",
        file=FILE,
        find="""
            if iteration_stats is not None:
                self._record_finished(state, finish_reason, now, iteration_stats)
        """,
        replace="""
            if iteration_stats is not None:
                self._record_finished(state, finish_reason, now, iteration_stats)
            if stop_str is not None:
                break
        """,
        why="leaves the loop once a stop string has finished a request: the step's later "
        "outputs are never applied, their text and finishes lost (README task 7: for each "
        "output)",
        caught_by="test_processor.py::test_stop_string_finishes_and_asks_the_core_to_abort",
    ),
]
