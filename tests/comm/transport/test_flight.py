"""The flight recorder: records read back as written, and the ranks missing from a call."""
from hypothesis import given, settings
from hypothesis import strategies as st

from minidist.comm.transport import flight

WORLD = 4


def _buffer():
    return memoryview(bytearray(flight.region_bytes(WORLD)))


def test_records_read_back_as_written():
    buf = _buffer()
    rec = flight.Recorder(buf, 0, 2)
    rec.begin(5, 12, [0, 2, 3], "all_reduce op=SUM dtype=float32 shape=(4,)")
    got = flight.read(buf, 0, WORLD)
    assert [r.calls for r in got] == [0, 0, 1, 0]
    r2 = got[2]
    assert (r2.ctx, r2.number, r2.ranks, r2.state) == (5, 12, [0, 2, 3], flight.IN_CALL)
    assert r2.text == "all_reduce op=SUM dtype=float32 shape=(4,)"
    rec.end()
    assert flight.read(buf, 0, WORLD)[2].state == flight.FINISHED
    rec.close()


def test_the_rank_that_did_not_enter_is_named_and_no_other():
    buf = _buffer()
    recorders = [flight.Recorder(buf, 0, r) for r in range(WORLD)]
    for r in range(WORLD):
        recorders[r].begin(0, 1, list(range(WORLD)), "all_reduce op=SUM")
        recorders[r].end()
    for r in (0, 1, 3):             # rank 2 stays behind, computing
        recorders[r].begin(0, 2, list(range(WORLD)), "barrier")
    records = flight.read(buf, 0, WORLD)
    for me in (0, 1, 3):
        mine, absent = flight.missing(records, me)
        assert mine.number == 2 and [a.rank for a in absent] == [2]
    assert flight.missing(records, 2) == (None, [])   # not in a call: nobody to wait for
    assert flight.who_is_missing(records) == [
        "rank 2 did not enter barrier #2 of group [0, 1, 2, 3], which ranks 0, 1, 3 wait in"]
    report = flight.hang_report(records, 0)
    assert "rank 2: all_reduce #1 of group [0, 1, 2, 3] op=SUM: finished" in report
    assert "rank 0: barrier #2 of group [0, 1, 2, 3]: in it for" in report
    for rec in recorders:
        rec.close()


def test_a_rank_ahead_in_the_same_group_has_entered():
    buf = _buffer()
    a, b = flight.Recorder(buf, 0, 0), flight.Recorder(buf, 0, 1)
    a.begin(0, 3, [0, 1], "broadcast src=0")   # the root sent and moved on to call 4
    b.begin(0, 4, [0, 1], "broadcast src=0")
    records = flight.read(buf, 0, 2)
    assert flight.missing(records, 0)[1] == []
    assert [r.rank for r in flight.missing(records, 1)[1]] == [0]
    a.close()
    b.close()


def test_a_repeated_call_keeps_its_text_and_a_new_one_replaces_it():
    """The text is written only when it changes; what is read back is always the last call's."""
    buf = bytearray(flight.region_bytes(1))
    rec = flight.Recorder(memoryview(buf), 0, 0)
    line = "all_reduce op=SUM dtype=float32 shape=(256,)"
    for number in range(3):
        rec.begin(0, number, [0], line)
        rec.end()
    assert flight.read(memoryview(buf), 0, 1)[0].text == line
    rec.begin(0, 3, [0], "barrier")
    got = flight.read(memoryview(buf), 0, 1)[0]
    assert (got.text, got.number, got.calls) == ("barrier", 3, 4)
    rec.close()


_calls = st.lists(st.tuples(st.integers(0, 3), st.integers(-1, 40),
                            st.sampled_from([[0, 1], [0, 1, 2, 3], [2]]),
                            st.sampled_from(["all_reduce op=SUM", "barrier", "send to rank 1 tag=0"]),
                            st.booleans()), min_size=1, max_size=12)


@settings(max_examples=60, deadline=None)
@given(_calls)
def test_the_recorder_leaves_the_naive_recorders_record_after_every_step(calls):
    """Recorder writes only what changed; after every begin and end a reader sees
    what NaiveRecorder (every word, every call) leaves, the clock words aside."""
    fast_buf, naive_buf = _buffer(), _buffer()
    fast, naive = flight.Recorder(fast_buf, 0, 1), flight.NaiveRecorder(naive_buf, 0, 1)
    lists = {}
    for ctx, number, ranks, text, ends in calls:
        ranks = lists.setdefault(tuple(ranks), list(ranks))   # the same list, as a plan passes
        for rec in (fast, naive):
            rec.begin(ctx, number, ranks, text)
        assert _without_clock(fast_buf) == _without_clock(naive_buf)
        if ends:
            fast.end()
            naive.end()
            assert _without_clock(fast_buf, ended=True) == _without_clock(naive_buf, ended=True)
    fast.close()
    naive.close()


def _without_clock(buf, ended: bool = False):
    """Each record as read, its start time dropped (and its end time, but while finished)."""
    return [(r.calls, r.state, r.ctx, r.number, r.ranks, r.text, r.done_ctx, r.done,
             r.ended > 0 if ended or r.state == flight.FINISHED else None)
            for r in flight.read(buf, 0, WORLD)]


@settings(max_examples=30, deadline=None)
@given(st.floats(0.0, 1e6), st.floats(0.0, 60.0), st.booleans())
def test_a_call_begun_and_ended_at_a_clock_reading_reads_back_those_times(start, took, naive):
    """The latency path passes its own time.perf_counter() readings (``now``); the
    record holds them as they were, and a call without one reads the same clock."""
    import time
    buf = _buffer()
    rec = (flight.NaiveRecorder if naive else flight.Recorder)(buf, 0, 3)
    rec.begin(0, 7, [0, 3], "all_reduce op=SUM", start)
    assert flight.read(buf, 0, WORLD)[3].started == start
    rec.end(start + took)
    assert flight.read(buf, 0, WORLD)[3].ended == start + took
    before = time.perf_counter()
    rec.begin(0, 8, [0, 3], "all_reduce op=SUM")
    assert before <= flight.read(buf, 0, WORLD)[3].started <= time.perf_counter()
    rec.close()


def test_a_record_describes_how_long_its_call_has_run_on_the_writers_clock():
    import time
    buf = _buffer()
    rec = flight.Recorder(buf, 0, 0)
    rec.begin(0, 1, [0, 1], "barrier", time.perf_counter() - 60.0)
    assert "in it for 60." in flight.read(buf, 0, WORLD)[0].describe()
    rec.close()
