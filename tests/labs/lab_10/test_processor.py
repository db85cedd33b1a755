"""lab-10, part 3: ``OutputProcessor`` — finish reasons, stop strings that finish a request the
core still runs (``reqs_to_abort``), aborts, and per-request state freed exactly once."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from grading.suite import graded
from tests.labs.common import (
    GRADED_SETTINGS,
    assert_cost_does_not_grow,
    best_time,
    same_data,
    timed_call,
)
from tests.labs.lab_10.support import FINISH, LOGPROBS, STOPS, TOK, side, split, texts

PROMPT = TOK.encode("Question:")


def run(ops: list) -> list[dict]:
    return side().run_processor(ops)


def add(rid: str, **options) -> list:
    return ["add", rid, PROMPT, options]


@graded(
    2,
    "Finish reasons: the core's finish_reason and stop_reason reach the RequestOutput, "
    "which is marked finished, and the request is forgotten",
    FINISH,
)
def test_core_finish_reasons():
    """'a' ends on length, 'b' on EOS (finish_reason 'stop', stop_reason None; it keeps special
    tokens, so EOS has a text to leave out), 'c' on a stop token id ('!' as stop_reason)."""
    hello = TOK.encode("Hello")
    bang = TOK.token_id(b"!")
    recs = run(
        [
            add("a"),
            add("b", skip_special_tokens=False),
            add("c"),
            [
                "step",
                [["a", hello, None, None], ["b", hello, None, None], ["c", hello, None, None]],
            ],
            [
                "step",
                [
                    ["a", TOK.encode(" world"), "length", None],
                    ["b", [TOK.eos_token_id], "stop", None],
                    ["c", [bang], "stop", bang],
                ],
            ],
        ]
    )
    first, last = recs[3], recs[4]
    assert first["tracked"] == ["a", "b", "c"], (
        f"unfinished requests stay in request_states: expected ['a', 'b', 'c'], got "
        f"{first['tracked']}"
    )
    a, b = last["outputs"].get("a", [])[-1:], last["outputs"].get("b", [])[-1:]
    assert a and a[0]["finished"] and a[0]["finish_reason"] == "length", (
        f"'a' finished on length: its last RequestOutput must be finished with finish_reason "
        f"'length', got {a}"
    )
    assert a[0]["text"] == "Hello world", (
        f"not streaming, the output carries the whole text: expected 'Hello world', got "
        f"{a[0]['text']!r}"
    )
    assert b and b[0]["finished"] and b[0]["finish_reason"] == "stop" and b[0]["text"] == "Hello", (
        f"'b' finished on EOS: finished, finish_reason 'stop', text 'Hello' (EOS's text left "
        f"out: finish_reason 'stop' means the core stopped on the last token, EOS (stop_reason "
        f"None) or a stop token id, so update gets stop_terminated=True), got {b}"
    )
    c = last["outputs"].get("c", [])[-1:]
    assert (
        c
        and c[0]["finish_reason"] == "stop"
        and c[0]["stop_reason"] == bang
        and c[0]["text"] == "Hello"
    ), (
        f"'c' finished on the stop token {bang} ('!'): finish_reason 'stop' and the core's "
        f"stop_reason {bang} reach the output, the token's text is left out ('Hello'), got {c}"
    )
    assert last["tracked"] == [], (
        f"finished requests must be removed from request_states, still there: {last['tracked']}"
    )
    assert last["returned"] == [], (
        f"the core finished all three itself: reqs_to_abort must be empty, got {last['returned']}"
    )


@graded(
    2,
    "Finishing: every output of a tracked request is applied, also one that brings no "
    "token, and update is told the request finished (finished=out.finished) so that what is "
    "still held back, a character cut by max_tokens, is flushed as U+FFFD",
    FINISH,
)
def test_the_last_output_finishes_the_text():
    """'a' is cut by max_tokens after half of 😀; the core ends 'b', whose text also ends in
    half of 😀, ('abort') in a step that brings it no token; streamed and not."""
    head = TOK.token_id("😀".encode()[:2])
    for stream in (False, True):
        recs = run(
            [
                add("a", stream=stream),
                add("b", stream=stream),
                [
                    "step",
                    [
                        ["a", TOK.encode("Hi "), None, None],
                        ["b", [*TOK.encode("Hello"), head], None, None],
                    ],
                ],
                ["step", [["a", [head], "length", None], ["b", [], "abort", None]]],
            ]
        )
        for rid, reason, want in (("a", "length", "Hi \ufffd"), ("b", "abort", "Hello\ufffd")):
            outs = [o for r in recs for o in r["outputs"].get(rid, [])]
            text = (
                "".join(o["text"] for o in outs) if stream else (outs[-1]["text"] if outs else "")
            )
            last = outs[-1] if outs else None
            assert last and last["finished"] and last["finish_reason"] == reason, (
                f"stream={stream}: the core finished {rid!r} ({reason!r}) in the last step; its "
                f"last output must be finished with finish_reason {reason!r}, got {last}"
            )
            assert text == want, (
                f"stream={stream}: {rid!r}'s finished text must be {want!r} (the decode of all its "
                f"tokens, a held-back half character flushed as U+FFFD, also by a finishing "
                f"output that brings no token: update it with finished=True all the same), got "
                f"{text!r}"
            )
        assert recs[-1]["tracked"] == [], (
            f"stream={stream}: both requests finished, still tracked: {recs[-1]['tracked']}"
        )


@graded(
    3,
    "Stop string: finish_reason 'stop', stop_reason the string, and since the core is "
    "still running the request its id goes into reqs_to_abort (once)",
    STOPS,
)
def test_stop_string_finishes_and_asks_the_core_to_abort():
    """Stop ' world': found in the second step, the core did not finish the request."""
    recs = run(
        [
            add("a", stop=[" world"], stream=True),
            ["step", [["a", TOK.encode("Hello"), None, None]]],
            ["step", [["a", TOK.encode(" world!"), None, None]]],
            ["step", [["a", TOK.encode(" more"), None, None]]],
        ]
    )
    step2 = recs[2]
    outs = step2["outputs"].get("a", [])
    assert step2["returned"] == ["a"], (
        f"the stop string finished 'a' while the core still runs it: reqs_to_abort must be "
        f"['a'], got {step2['returned']}"
    )
    assert (
        outs
        and outs[-1]["finished"]
        and outs[-1]["finish_reason"] == "stop"
        and (outs[-1]["stop_reason"] == " world")
    ), (
        f"the last output must be finished with finish_reason 'stop' and stop_reason ' world', "
        f"got {outs}"
    )
    streamed = "".join(o["text"] for r in recs for o in r["outputs"].get("a", []))
    assert streamed == "Hello", f"the streamed text must stop before ' world': got {streamed!r}"
    assert step2["tracked"] == [] and recs[3]["returned"] == [] and not recs[3]["outputs"], (
        f"after the stop string 'a' is forgotten: a late output for it is ignored; tracked "
        f"{step2['tracked']}, then reqs_to_abort {recs[3]['returned']}, outputs "
        f"{recs[3]['outputs']}"
    )
    # A stop string ends one request, not the step: the step's later outputs are applied too.
    recs = run(
        [
            add("a", stop=[" world"]),
            add("b"),
            add("c", stop=["!"]),
            [
                "step",
                [
                    ["a", TOK.encode("Hello world"), None, None],
                    ["b", TOK.encode("Hi"), None, None],
                    ["c", TOK.encode("Yes!"), None, None],
                ],
            ],
        ]
    )
    got = {rid: [o["text"] for o in outs] for rid, outs in recs[-1]["outputs"].items()}
    assert (got, recs[-1]["returned"], recs[-1]["tracked"]) == (
        {"a": ["Hello"], "b": ["Hi"], "c": ["Yes"]},
        ["a", "c"],
        ["b"],
    ), (
        f"one step's outputs for 'a' (stop ' world' found), 'b' and 'c' (stop '!' found): each "
        f"output of the step is applied, the ones after a stop string too, so expected the "
        f"texts {{'a': ['Hello'], 'b': ['Hi'], 'c': ['Yes']}}, reqs_to_abort ['a', 'c'] and "
        f"'b' still tracked; got {got}, {recs[-1]['returned']} and {recs[-1]['tracked']} "
        f"(README task 7: for each output)"
    )


@graded(
    1,
    "Stop string in the core's last step: the core has finished the request itself, so "
    "it is not in reqs_to_abort; the finish reason is still the stop string's",
    STOPS,
)
def test_stop_string_in_the_last_step_needs_no_abort():
    """The stop string arrives in the step the core ends with 'length'."""
    recs = run([add("a", stop=["!!"]), ["step", [["a", TOK.encode("Hello!!"), "length", None]]]])
    outs = recs[1]["outputs"].get("a", [])
    assert recs[1]["returned"] == [], (
        f"the core already finished 'a': reqs_to_abort must be empty, got {recs[1]['returned']}"
    )
    assert outs and outs[-1]["finish_reason"] == "stop" and outs[-1]["stop_reason"] == "!!", (
        f"the stop string decides the finish reason: expected 'stop' / '!!', got {outs}"
    )
    # The core stopped on EOS, or on a stop token id, in the step that completes '!!'.
    for last, core_reason, what in (
        (TOK.eos_token_id, None, "EOS"),
        (TOK.encode("?")[0], TOK.encode("?")[0], "a stop token id"),
    ):
        recs = run(
            [
                add("a", stop=["!!"]),
                ["step", [["a", [*TOK.encode("Hello!!"), last], "stop", core_reason]]],
            ]
        )
        outs = recs[1]["outputs"].get("a", [])
        got = [(o["text"], o["finish_reason"], o["stop_reason"]) for o in outs[-1:]]
        assert got == [("Hello", "stop", "!!")] and recs[1]["returned"] == [], (
            f"the core stopped 'a' on {what} (finish_reason 'stop') in the step whose text "
            f"completes the stop string '!!': the text is still cut before it, stop_reason is "
            f"'!!' (the stop string is found first), and the core, done with 'a', is asked to "
            f"abort nothing: expected [('Hello', 'stop', '!!')] and [], got {got} and "
            f"{recs[1]['returned']}"
        )


@graded(
    2,
    "Aborts: abort_requests forgets tracked ids, returns only those, ignores unknown "
    "ones; outputs still on the wire for a forgotten id are ignored",
    FINISH,
)
def test_aborts():
    """Abort 'a' and an unknown id; 'a''s late output is dropped; abort 'a' again; abort 'b'
    twice in one call."""
    recs = run(
        [
            add("a"),
            add("b"),
            ["abort", ["a", "nobody"]],
            [
                "step",
                [["a", TOK.encode("late"), None, None], ["b", TOK.encode("Hello"), None, None]],
            ],
            ["abort", ["a"]],
            ["abort", ["b", "b"]],
            ["step", [["b", TOK.encode("late"), None, None]]],
        ]
    )
    assert recs[2]["returned"] == ["a"], (
        f"abort_requests(['a', 'nobody']) must return the list of ids it was tracking, ['a'], "
        f"got {recs[2]['returned']}"
    )
    assert recs[2]["tracked"] == ["b"], (
        f"after aborting 'a' only 'b' is tracked, got {recs[2]['tracked']} (forget the ids "
        f"when abort_requests is called, not when its answer is read)"
    )
    assert "a" not in recs[3]["outputs"], (
        f"an output for the aborted 'a' must be ignored, got {recs[3]['outputs'].get('a')}"
    )
    assert recs[3]["outputs"].get("b"), "'b' is still running: its output must be queued"
    assert recs[4]["returned"] == [], (
        f"'a' is gone: aborting it again returns [], got {recs[4]['returned']}"
    )
    changed = [i + 1 for i, r in enumerate(recs) if r["input_changed"]]
    assert not changed, (
        f"abort_requests changed the list of ids it was given (ops {changed}): the caller's "
        f"list is the caller's (it may send the same list on to the core); build a new list of "
        f"the ids that were tracked"
    )
    assert recs[5]["returned"] == ["b"] and recs[5]["tracked"] == [], (
        f"abort_requests(['b', 'b']): 'b' was tracked once, so it is returned once (the core "
        f"is asked to abort it once), got {recs[5]['returned']}"
    )
    assert recs[6]["outputs"] == {} and recs[6]["tracked"] == [], (
        f"'b' was aborted: a later step's output for it must be ignored and nothing is tracked "
        f"(an abort changes nothing later either); got outputs {recs[6]['outputs']}, tracked "
        f"{recs[6]['tracked']}"
    )


@graded(
    2,
    "Errors: an output with an error fails its request: a ValueError with the core's "
    "message goes on its queue instead of a RequestOutput, and the request is forgotten "
    "(a later output for it, error or not, is ignored like any output for an id no longer "
    "tracked)",
    FINISH,
)
def test_error_output_fails_the_request():
    """'a' fails in the first step while 'b' runs on, and so does 'd', as the core reports a
    failure (finish_reason 'error', an empty message); a late output for 'a' is ignored, and
    so is an error for 'c', aborted before the step (skip ids no longer tracked first)."""
    hello = TOK.encode("Hello")
    recs = run(
        [
            add("a"),
            add("b", stream=True),
            add("d"),
            [
                "step",
                [
                    ["a", [], None, None, "boom"],
                    ["b", hello, None, None],
                    ["d", [], "error", None, ""],
                ],
            ],
            ["step", [["a", hello, "length", None], ["b", TOK.encode("!"), "length", None]]],
            add("c"),
            ["abort", ["c"]],
            ["step", [["a", [], None, None, "again"], ["c", [], None, None, "gone"]]],
        ]
    )
    failed, later, late_errors = recs[3], recs[4], recs[7]
    a = failed["outputs"].get("a", [])
    assert a == [{"error": "ValueError: boom"}], (
        f"the core reported error 'boom' for 'a': its queue must get exactly one "
        f"ValueError('boom') (no RequestOutput), got {a}"
    )
    d = failed["outputs"].get("d", [])
    assert d == [{"error": "ValueError: "}], (
        f"the core reported 'd' failed as it sends a failure, finish_reason 'error' and an "
        f"error whose message is empty (str() of ValueError()): an error is any error that is "
        f"not None, even '' and even with a finish reason; its queue must get ValueError(''), "
        f"got {d}"
    )
    assert failed["tracked"] == ["b"], (
        f"a failed request is forgotten at once: request_states must hold ['b'], holds "
        f"{failed['tracked']}"
    )
    assert "a" not in later["outputs"] and later["tracked"] == [], (
        f"'a' failed a step ago: its late output must be ignored (got "
        f"{later['outputs'].get('a')}), and 'b' finishes normally (tracked after: "
        f"{later['tracked']})"
    )
    b = [o for r in recs for o in r["outputs"].get("b", [])]
    assert "".join(o.get("text", "") for o in b) == "Hello!" and b and b[-1].get("finished"), (
        f"'b' is not affected by 'a''s error: it streams 'Hello!' and finishes, got {b}"
    )
    assert late_errors["outputs"] == {} and late_errors["tracked"] == [], (
        f"error outputs for 'a' (failed a step ago) and 'c' (aborted) must be ignored: they are "
        f"no longer tracked; got outputs {late_errors['outputs']}, tracked "
        f"{late_errors['tracked']}"
    )


@graded(
    2,
    "Logprobs: each step's rows go to the request's LogprobsProcessor, so a finished "
    "output carries one logprob per token and their sum; a stream sends the new ones, "
    "including those of a step whose text was held back",
    LOGPROBS,
)
def test_logprobs_reach_the_outputs():
    """'a' (whole text) and 'b' (streamed, its first step only half a character) ask for them;
    so does 'd', which a stop string ends in a step the core did not finish."""
    euro = TOK.encode("\u20ac")  # three byte tokens: no text until the last one
    hi = TOK.encode("hi")
    recs = run(
        [
            add("a", logprobs=0),
            add("b", logprobs=0, stream=True),
            add("c"),
            add("d", logprobs=0, stop=["!"]),
            [
                "step",
                [
                    ["a", hi, None, None, None, [-0.5, -1.0]],
                    ["b", euro[:2], None, None, None, [-0.25, -0.5]],
                    ["c", hi, None, None],
                    ["d", hi, None, None, None, [-0.5, -1.0]],
                ],
            ],
            [
                "step",
                [
                    ["a", TOK.encode("!"), "length", None, None, [-2.0]],
                    ["b", euro[2:], "length", None, None, [-1.0]],
                    ["c", TOK.encode("!"), "length", None],
                    ["d", TOK.encode("!"), None, None, None, [-2.0]],
                ],
            ],
        ]
    )
    a = recs[5]["outputs"].get("a", [])
    expected_a = [[[t, v]] for t, v in zip([*hi, *TOK.encode("!")], [-0.5, -1.0, -2.0])]
    assert a and a[-1]["logprobs"] == expected_a, (
        f"not streaming, the finished output carries every token's logprob dict, expected "
        f"{expected_a}, got {a[-1]['logprobs'] if a else a}: hand each output to "
        f"state.logprobs_processor.update_from_output"
    )
    assert a[-1]["cumulative_logprob"] == -3.5, (
        f"cumulative_logprob sums the sampled tokens' logprobs: expected -3.5, got "
        f"{a[-1]['cumulative_logprob']}"
    )
    b = [o for r in recs for o in r["outputs"].get("b", [])]
    streamed = [pos for o in b for pos in (o["logprobs"] or [])]
    assert [p[0][1] for p in streamed] == [-0.25, -0.5, -1.0], (
        f"streaming, every token's logprob is sent exactly once, those of the held-back first "
        f"step with the step that completes the character: got {[o['logprobs'] for o in b]}"
    )
    c = recs[5]["outputs"].get("c", [])
    assert c and c[-1]["logprobs"] is None and c[-1]["cumulative_logprob"] is None, (
        f"'c' asked for no logprobs: its output has logprobs None, got {c}"
    )
    d = recs[5]["outputs"].get("d", [])
    got_d = (d[-1]["logprobs"], d[-1]["cumulative_logprob"]) if d else None
    assert got_d == (expected_a, -3.5), (
        f"'d' (tokens 'hi' then '!', stop '!') ends on the stop string in the second step, which "
        f"the core did not finish: that step's row is added all the same (every output goes "
        f"to update_from_output, before its RequestOutput is made), so the "
        f"finished output carries {expected_a} and -3.5, got {got_d}"
    )


@graded(
    4,
    "Bookkeeping: a request is tracked from add_request until exactly one of (the core "
    "finished it, a stop string finished it, an abort); it gets exactly one finished "
    "output unless aborted, and nothing after",
    FINISH,
)
@GRADED_SETTINGS
@given(data=st.data())
def test_every_request_finishes_exactly_once(data):
    """Three requests, random steps: the core ends some, a stop string ends some, aborts."""
    ops: list = []
    plans = {}
    for rid in ("r0", "r1", "r2"):
        stream = data.draw(st.booleans(), label=f"{rid} stream")
        text = data.draw(texts, label=f"{rid} text") + data.draw(
            st.sampled_from(["", "!!", "a!!b"]), label=f"{rid} tail"
        )
        ids = data.draw(split(text), label=f"{rid} ids")
        plans[rid] = {"ids": ids, "sent": 0, "stream": stream}
        ops.append(add(rid, stop=["!!"], stream=stream))
    # model of the expected state, in the judge
    tracked = {"r0", "r1", "r2"}
    expect_abort: list[list[str]] = []
    expect_tracked: list[list[str]] = [["r0"], ["r0", "r1"], ["r0", "r1", "r2"]]
    finished_by: dict[str, str] = {}
    for _ in range(data.draw(st.integers(1, 8), label="steps")):
        if data.draw(st.booleans(), label="abort?") and tracked:
            victim = data.draw(st.sampled_from([*sorted(tracked), "ghost"]), label="abort id")
            ops.append(["abort", [victim]])
            expect_abort.append([victim] if victim in tracked else [])
            if victim in tracked:
                tracked.discard(victim)
                finished_by[victim] = "abort"
            expect_tracked.append(sorted(tracked))
            continue
        entries, to_abort = [], []
        for rid, plan in plans.items():
            if plan["sent"] >= len(plan["ids"]):
                continue  # the core finished it (a late output after an abort or a stop
                # string is still sent once or more: the processor must ignore it)
            n = data.draw(st.integers(0, 3), label=f"{rid} tokens")
            new = plan["ids"][plan["sent"] : plan["sent"] + n]
            plan["sent"] += len(new)
            core_done = plan["sent"] >= len(plan["ids"])
            entries.append([rid, new, "length" if core_done else None, None])
            if rid in tracked:
                # available text: up to the last token boundary on a character boundary
                k = plan["sent"]
                while not core_done and k and TOK.decode(plan["ids"][:k]).endswith("\ufffd"):
                    k -= 1
                if "!!" in TOK.decode(plan["ids"][:k]):
                    tracked.discard(rid)
                    finished_by[rid] = "stop-string"
                    if not core_done:
                        to_abort.append(rid)
                elif core_done:
                    tracked.discard(rid)
                    finished_by[rid] = "length"
        ops.append(["step", entries])
        expect_abort.append(to_abort)
        expect_tracked.append(sorted(tracked))
    recs = run(ops)
    script = "; ".join(
        f"abort {op[1]}"
        if op[0] == "abort"
        else "step " + ", ".join(f"{e[0]}+{len(e[1])}{' ' + e[2] if e[2] else ''}" for e in op[1])
        for op in ops[3:]
    )
    for i, rec in enumerate(recs):
        assert rec["tracked"] == expect_tracked[i], (
            f"after op {i + 1} ({rec['op']}) of [{script}] request_states must hold "
            f"{expect_tracked[i]}, holds {rec['tracked']}"
        )
        if i >= 3:
            assert rec["returned"] == expect_abort[i - 3], (
                f"op {i + 1} ({rec['op']}) of [{script}]: expected it to return "
                f"{expect_abort[i - 3]}, got {rec['returned']}"
            )
    for rid, plan in plans.items():
        outs = [o for rec in recs for o in rec["outputs"].get(rid, [])]
        done = [j for j, o in enumerate(outs) if o.get("finished")]
        if finished_by.get(rid) == "abort":
            assert not done, f"{rid} was aborted: it gets no finished output, got {outs[-1:]}"
        elif rid in finished_by:
            assert done == [len(outs) - 1], (
                f"{rid} finished ({finished_by[rid]}): exactly one finished output, the last; "
                f"finished flags {[o.get('finished') for o in outs]}"
            )
            want_reason = "stop" if finished_by[rid] == "stop-string" else "length"
            assert outs[-1]["finish_reason"] == want_reason, (
                f"{rid} finished by {finished_by[rid]}: finish_reason must be {want_reason!r}, "
                f"got {outs[-1]['finish_reason']!r}"
            )
            full = TOK.decode(plan["ids"][: plan["sent"]])
            want = full[: full.find("!!")] if "!!" in full else full
            text = "".join(o["text"] for o in outs) if plan["stream"] else outs[-1]["text"]
            assert text == want, (
                f"{rid} (stream={plan['stream']}): the text must be {want!r}, got {text!r}"
            )


@graded(
    1,
    "Cost: process_outputs and abort_requests find each request by its id: a step's work "
    "grows with its outputs and aborts, not with the requests tracked",
    "labs/lab-10-serving/README.md#your-tasks",
    timeout=30,
)
def test_a_step_costs_its_outputs():
    """100 steps of four outputs and one abort cost about the same with 400 and with 40,000
    requests tracked, and stay under a ceiling measured in the judge (CPU time of plain
    relinks)."""
    token, steps, times = TOK.encode("a")[0], 100, {}
    for tracked in (400, 40_000):
        processor = side().crowded_processor(tracked)
        done = [0]

        def one_run(processor=processor, tracked=tracked, done=done) -> float:
            first = 4 + done[0]
            seconds, got = timed_call(side().process_steps, processor, steps, token, first)
            done[0] += steps
            want = [[done[0]] * 4, [[f"r{first + i}"] for i in range(steps)]]
            assert same_data(got, want), (
                f"{done[0]} steps of one token each for r0..r3 (of {tracked:,} tracked, "
                f"streamed) must queue {done[0]} outputs each, and each abort_requests of one "
                f"more tracked id return it: got {str(got)[:300]}"
            )
            return seconds

        times[tracked] = best_time(one_run)
    t_small, t_big = times[400], times[40_000]
    assert_cost_does_not_grow(
        t_small,
        t_big,
        lambda ratio, ceiling: (
            f"{steps} steps of 4 outputs and one abort took {t_big * 1e3:.1f} ms with 40,000 "
            f"requests tracked vs {t_small * 1e3:.1f} ms with 400 ({ratio:.0f}x; at most 12x, and "
            f"{ceiling * 1e3:.0f} ms on this machine): find each output's state by its id in "
            "request_states, and pop each aborted id; do not walk or rebuild them (README, after "
            "the task table)"
        ),
    )


@graded(
    2,
    "Prompt logprobs: the core sends them with a request's first output, whether or not it "
    "asked for sample logprobs, and they reach its RequestOutput (a stream's first one alone)",
    LOGPROBS,
)
def test_prompt_logprobs_reach_the_outputs():
    """'p' and 'q' (streamed) ask for prompt logprobs and nothing else; 'r' asks for both."""
    rows = [[t, -1.5 * (i + 1)] for i, t in enumerate(PROMPT[1:])]  # from its second token
    hi = TOK.encode("hi")
    recs = run(
        [
            add("p", prompt_logprobs=0),
            add("q", prompt_logprobs=0, stream=True),
            add("r", prompt_logprobs=0, logprobs=0),
            [
                "step",
                [
                    ["p", hi, None, None, None, None, rows],
                    ["q", hi, None, None, None, None, rows],
                    ["r", hi, None, None, None, [-0.5, -1.0], rows],
                ],
            ],
            [
                "step",
                [
                    ["p", TOK.encode("!"), "length", None],
                    ["q", TOK.encode("!"), "length", None],
                    ["r", TOK.encode("!"), "length", None, None, [-2.0]],
                ],
            ],
        ]
    )
    expected = [None, *[[row] for row in rows]]
    for rid in ("p", "r"):
        outs = recs[4]["outputs"].get(rid, [])
        got = outs[-1].get("prompt_logprobs") if outs else outs
        assert got == expected, (
            f"{rid!r}: the finished output's prompt_logprobs start with None (nothing scores "
            f"the first prompt token), then one dict per row the first output brought: "
            f"expected {expected}, got {got}; hand every output to "
            f"state.logprobs_processor.update_from_output, not only those with new_logprobs"
        )
    q = [o for r in recs for o in r["outputs"].get("q", [])]
    got_q = [o.get("prompt_logprobs") for o in q]
    assert got_q and got_q[0] == expected and all(not p for p in got_q[1:]), (
        f"streaming, the first output carries the prompt logprobs and later ones none (the "
        f"given _make_request_output pops them): got {got_q}"
    )
