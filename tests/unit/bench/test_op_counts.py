"""omnistream/bench/op_counts.py on the tiny model: steady steps are counted, and what the code
predictor's static steps dispatch counts as inside a capturable region."""

from __future__ import annotations

import pytest
from transformers import Qwen3OmniMoeConfig

from omnistream.bench.op_counts import REAL_SHAPED, code2wav_window, measure, real_shaped_model
from omnistream.engine.load_options import LoadOptions

F32 = LoadOptions(dtype="float32")


def test_every_stage_is_counted(tiny_model_dir):
    results = {(r.stage, r.batch): r.counts for r in measure(tiny_model_dir, F32, batches=(1, 2))}
    assert set(results) == {
        (s, b) for s in ("thinker", "talker", "talker-static", "code2wav") for b in (1, 2)
    }
    for key, counts in results.items():
        assert counts.total == counts.inside + counts.outside > 0, key
    # The code predictor's 15 static steps are a capturable region; its work does not grow per row.
    assert results["talker", 1].inside > 0
    assert results["talker", 1].inside == results["talker", 2].inside
    assert results["thinker", 1].outside > 0
    # Static frames: nearly the whole frame is inside its two regions.
    assert results["talker-static", 1].outside < results["talker", 1].outside // 10


def test_the_same_step_counts_the_same_ops(tiny_model_dir):
    first, second = (measure(tiny_model_dir, F32, ("talker",), (2,))[0].counts for _ in range(2))
    assert first == second


@pytest.mark.slow
def test_real_shaped_build_has_the_real_code_predictor_depth(tmp_path):
    directory = real_shaped_model(tmp_path / "real-shaped")
    talker = Qwen3OmniMoeConfig.from_pretrained(directory).talker_config
    assert talker.code_predictor_config.num_hidden_layers == REAL_SHAPED["code_predictor_layers"]
    assert talker.text_config.num_hidden_layers == REAL_SHAPED["layers"]


def test_a_code2wav_window_costs_about_the_same_ops_at_batch_8(tiny_model_dir):
    """The engine's window at batch 8 dispatches at most 1.2x batch 1's ops (issue 23's target)."""
    one, eight = (r.counts.total for r in measure(tiny_model_dir, F32, ("code2wav",), (1, 8)))
    assert eight <= 1.2 * one, (one, eight)


@pytest.mark.parametrize("build", ["tiny_model_dir", "real_shaped_model_dir"], ids=["tiny", "real-shaped"])
def test_a_code2wav_window_runs_in_capturable_regions_with_a_few_host_ops(build, request):
    """Issue 63: Code2Wav's step is fixed-shape (code2wav/static_step.py): at most 20 ops outside
    its capturable regions, the same at batch 1 and 16 (none per row, per layer or per conv); the
    rest is its graph on CUDA."""
    model_dir = request.getfixturevalue(build)
    one, sixteen = (code2wav_window(model_dir, batch, F32) for batch in (1, 16))
    assert one.outside == sixteen.outside <= 20, (one.outside_ops, sixteen.outside_ops)
    assert one.inside == sixteen.inside > 20 * one.outside
