"""The Python API refuses a bad option value with traceq's error type (OptionError, a
TraceqError and a ValueError), in one line naming the choices, as docs/api.md promises."""

from __future__ import annotations

import pytest

import traceq
from conftest import sample


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> traceq.Trace:
    return traceq.load(sample("lenet_b256_cudnn.sqlite"), tmp_path_factory.mktemp("o") / "s.duckdb")


@pytest.mark.parametrize(("call", "words"), [
    (lambda t: t.top(by="nonsense"), "'nonsense' is not a valid name by: choose one of 'demangled', 'short', 'mangled'"),
    (lambda t: t.ru(by="x"), "'x' is not a valid group by"),
    (lambda t: t.idle(by="x"), "'x' is not a valid idle by"),
    (lambda t: t.compare(t, by="zz"), "'zz' is not a valid compare by"),
    (lambda t: t.memory(by="q"), "'q' is not a valid memory by"),
    (lambda t: t.top(k=0), "k must be a whole number of at least 1 (0 given)"),
    (lambda t: t.top(k=-3), "k must be a whole number of at least 1 (-3 given)"),
    (lambda t: t.layers(iteration_regex="("), "iteration regex '('"),
    (lambda t: t.stages(iteration_regex="[z-a]"), "iteration regex '[z-a]'"),
])
def test_a_bad_option_is_an_option_error(trace: traceq.Trace, call, words: str) -> None:
    with pytest.raises(traceq.OptionError) as e:
        call(trace)
    assert isinstance(e.value, traceq.TraceqError) and isinstance(e.value, ValueError)
    assert words in str(e.value) and "\n" not in str(e.value)


def test_good_options_still_work(trace: traceq.Trace) -> None:
    assert trace.top(k=1, by="short").height == 1
    assert trace.layers(iteration_regex=r"iteration (\d+)").height > 0
