"""omnistream/engine/step_graphs.py on the CPU: the capture check's logic with fake graphs (a fake
replays its step eagerly; no CUDA graph is pretended to run). A graph is kept only when its first
replay equals the eager step; one that replays other values or fails to capture is dropped for its
key, logged, and that key runs eagerly from then on; what the step mutates is restored."""

from __future__ import annotations

import contextlib

import torch

from omnistream.engine.step_graphs import StepGraphs, outputs_equal


class FakeGraph:
    """Stands in for a captured graph: `replay` re-runs the step into the captured output."""

    def __init__(self, step, wrong: bool = False) -> None:
        self.step = step
        self.out = step()
        self.wrong = wrong
        self.replays = 0

    def replay(self) -> None:
        self.replays += 1
        fresh = self.step()
        for mine, new in zip(_tuple(self.out), _tuple(fresh), strict=True):
            mine.copy_(new)
        if self.wrong:
            _tuple(self.out)[0].add_(1)


def _tuple(out):
    return (out,) if isinstance(out, torch.Tensor) else out


def _graphs(recorded: list[FakeGraph], wrong: bool = False, fails: bool = False) -> StepGraphs:
    def record(step):
        if fails:
            raise RuntimeError("operation not permitted when stream is capturing")
        graph = FakeGraph(step, wrong)
        recorded.append(graph)
        return graph, graph.out

    return StepGraphs(
        "test step", torch.device("cpu"), 2, record=record, device_context=contextlib.nullcontext
    )


def test_a_matching_graph_is_kept_and_replayed():
    recorded: list[FakeGraph] = []
    graphs = _graphs(recorded)
    x = torch.arange(4.0)
    calls = []

    def step():
        calls.append(1)
        return x * 2, x + 1

    for _ in range(3):
        doubled, plus = graphs.run("k", step)
        assert torch.equal(doubled, x * 2) and torch.equal(plus, x + 1)
    assert len(recorded) == 1 and recorded[0].replays == 3  # the check's replay, then two
    assert graphs.graphs["k"][0] is recorded[0]


def test_a_graph_that_replays_other_values_is_dropped_for_eager(caplog):
    recorded: list[FakeGraph] = []
    graphs = _graphs(recorded, wrong=True)
    x = torch.arange(4.0)
    for _ in range(3):
        assert torch.equal(graphs.run(("bucket", 4), lambda: x * 3), x * 3)  # the eager values
    assert recorded[0].replays == 1  # checked once, never replayed again
    assert graphs.graphs[("bucket", 4)][0] is None
    assert "test step: the graph of ('bucket', 4) replays other values than its eager step" in caplog.text


def test_a_graph_that_fails_to_capture_runs_eagerly(caplog):
    graphs = _graphs([], fails=True)
    x = torch.arange(4.0)
    assert torch.equal(graphs.run("k", lambda: x - 1), x - 1)
    assert torch.equal(graphs.run("k", lambda: x - 1), x - 1)
    assert graphs.graphs["k"][0] is None
    assert caplog.text.count("test step: capturing k failed; it runs eagerly") == 1


def test_what_the_step_mutates_is_restored_before_each_run_of_the_check():
    """A step that reads and then changes a tensor (the talker's presence masks) sees it as it was
    at every run of the check, so its eager run and its graph compare like with like."""
    recorded: list[FakeGraph] = []
    graphs = _graphs(recorded)
    seen = torch.zeros(1)

    def step():
        out = seen + 10
        seen.add_(1)
        return out

    assert torch.equal(graphs.run("k", step, mutated=[seen]), torch.tensor([10.0]))
    assert graphs.graphs["k"][0] is recorded[0]  # not dropped: each run started from 0
    assert torch.equal(seen, torch.ones(1))  # the replay's own change is the step's


def test_outputs_compare_shapes_and_values_and_never_nan():
    a = torch.tensor([1.0, float("nan")])
    assert outputs_equal((torch.ones(2),), (torch.ones(2),))
    assert not outputs_equal(torch.ones(2), torch.ones(3))
    assert not outputs_equal(a, a.clone())
    assert not outputs_equal((torch.ones(2),), torch.ones(2))
