"""Memory per stage from a config: the KV formula, exact parameter counts, the start-time refusal
(with `torch.cuda.mem_get_info` faked: no GPU here), and the README table equal to the function."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from omnistream.engine.load_options import LoadOptions
from omnistream.engine.settings import ThinkerEngineSettings
from omnistream.models.qwen3_omni import memory
from omnistream.models.qwen3_omni.checkpoint import load_config, load_stage
from omnistream.request.errors import InvalidRequest

README = Path(__file__).resolve().parents[4] / "docs" / "gpu.md"  # the GPU table's page


def test_kv_cache_is_layers_heads_dim_capacity_slots_two_bytes(tiny_model_dir):
    text = load_config(tiny_model_dir).thinker_config.text_config
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    want = text.num_hidden_layers * text.num_key_value_heads * head_dim * 256 * 4 * 2 * 2
    assert memory.kv_cache_bytes(text, 4, 256, 2) == want
    m = memory.stage_memory(load_config(tiny_model_dir), "thinker", "bfloat16", 4, 256)
    assert m.kv_cache == want and m.total == m.weights + m.kv_cache + m.prefix_cache + m.headroom
    assert m.prefix_cache == want // 2  # the thinker's prefix cache: half its KV cache by default
    config = load_config(tiny_model_dir)
    off = memory.stage_memory(config, "thinker", "bfloat16", 4, 256, prefix_cache_bytes=0)
    assert off.total == m.total - m.prefix_cache


def test_code2wav_counts_the_state_slots_its_engine_allocates(tiny_model_dir):
    from omnistream.engine.settings import Code2WavEngineSettings
    from omnistream.models.qwen3_omni.code2wav.engine import Code2WavEngine

    engine = Code2WavEngine(tiny_model_dir, Code2WavEngineSettings(dtype="float32", max_batch=3))
    pool = engine.streamer.slots.pool
    need = memory.stage_memory(load_config(tiny_model_dir), "code2wav", "float32", 3, 256)
    assert need.kv_cache == pool.numel() * pool.element_size() > 0
    settings = Code2WavEngineSettings(dtype="float32", max_batch=3, max_requests=40)
    pool = Code2WavEngine(tiny_model_dir, settings).streamer.slots.pool
    need = memory.stage_memory(load_config(tiny_model_dir), "code2wav", "float32", 3, 256, requests=40)
    assert need.kv_cache == pool.numel() * pool.element_size()  # --max-requests: a slot each


@pytest.mark.parametrize("stage", memory.STAGES)
def test_parameter_count_from_the_config_equals_the_loaded_stage(tiny_model_dir, stage):
    holder = load_stage(stage, tiny_model_dir, LoadOptions(dtype="float32"))
    loaded = sum(p.numel() for p in holder.parameters()) + sum(b.numel() for b in holder.buffers())
    assert memory.stage_params(load_config(tiny_model_dir), stage) == loaded


def _fake_gpu(monkeypatch, free_gib: float, total_gib: float = 141.0) -> list:
    asked: list = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)

    def mem_get_info(device):
        asked.append(device)
        return int(free_gib * memory.GIB), int(total_gib * memory.GIB)

    monkeypatch.setattr(torch.cuda, "mem_get_info", mem_get_info)
    return asked


def test_a_stage_that_does_not_fit_refuses_with_the_numbers_and_the_flags(monkeypatch):
    config = memory.load_real_config()
    asked = _fake_gpu(monkeypatch, free_gib=40.0)
    with pytest.raises(InvalidRequest) as err:
        memory.check_stage_fits(config, "thinker", LoadOptions("cuda:1"), 16, 4096)
    message = err.value.message
    assert "the thinker needs 75.6 GiB on cuda:1" in message and "40.0 GiB of 141.0 GiB is free" in message
    assert "bfloat16" in message  # auto resolved on cuda
    for flag in ("--max-batch", "--max-model-len", "--prefix-cache-gib", "--thinker-device"):
        assert flag in message
    assert asked == [torch.device("cuda:1")]


def test_a_stage_that_fits_passes_and_the_cpu_is_not_checked(monkeypatch):
    config = memory.load_real_config()
    _fake_gpu(monkeypatch, free_gib=80.0)
    need = memory.check_stage_fits(config, "thinker", LoadOptions("cuda"), 16, 4096)
    assert need is not None and need.total < 80 * memory.GIB
    # float32 doubles the weights: the same GPU no longer holds it.
    with pytest.raises(InvalidRequest, match="in float32"):
        memory.check_stage_fits(config, "thinker", LoadOptions("cuda", "float32"), 16, 4096)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda d: pytest.fail("checked the CPU"))
    assert memory.check_stage_fits(config, "thinker", LoadOptions("cpu"), 16, 4096) is None


def test_the_real_thinker_is_about_thirty_billion_parameters():
    params = memory.stage_params(memory.load_real_config(), "thinker")
    assert 30e9 < params < 33e9  # 30.5 B text model + audio and vision encoders


def test_the_readme_table_is_the_functions_output():
    table = memory.memory_table(memory.load_real_config())
    readme = README.read_text()
    assert table in readme, (
        f"docs/gpu.md's table is stale; regenerate: python -m omnistream.models.qwen3_omni.memory\n{table}"
    )
    assert re.search(r"--max-batch 16.*--max-model-len 4096|max-batch 16, max-model-len 4096", readme)


def test_the_table_defaults_are_the_serving_defaults():
    import argparse

    from services.serve_args import add_arguments

    p = argparse.ArgumentParser()
    add_arguments(p)
    args = p.parse_args(["--model", "unused"])
    assert (args.max_batch, args.max_model_len) == (memory.DEFAULT_MAX_BATCH, memory.DEFAULT_MAX_MODEL_LEN)
    assert args.dtype == "auto"  # -> bfloat16 on cuda: the table's dtype


def test_the_family_refuses_a_stage_that_does_not_fit_before_loading_it(monkeypatch, tiny_model_dir):
    from omnistream.models.qwen3_omni.family import FAMILY
    from omnistream.models.qwen3_omni.thinker import engine as thinker_engine

    _fake_gpu(monkeypatch, free_gib=0.5, total_gib=1.0)
    monkeypatch.setattr(thinker_engine, "load_stage", lambda *a, **k: pytest.fail("loaded weights anyway"))
    with pytest.raises(InvalidRequest, match=r"the thinker needs .* on cuda:0 .* only 0\.5 GiB of 1\.0 GiB"):
        FAMILY.engine(
            "thinker", tiny_model_dir, ThinkerEngineSettings("cuda:0", max_batch=4, max_model_len=256)
        )


def test_stages_sharing_a_gpu_must_fit_together(monkeypatch):
    config = memory.load_real_config()
    thinker = memory.stage_memory(config, "thinker", "bfloat16", 16, 4096).total
    talker = memory.stage_memory(config, "talker", "bfloat16", 16, 4096).total
    # Room for the thinker alone, not for the thinker and the talker at once.
    _fake_gpu(monkeypatch, free_gib=(thinker + talker // 2) / memory.GIB)
    assert memory.check_stage_fits(config, "talker", LoadOptions("cuda:0"), 16, 4096) is not None
    shared = [
        ("thinker", LoadOptions("cuda:0")),
        ("talker", LoadOptions("cuda:0")),
        ("code2wav", LoadOptions("cpu")),
    ]
    with pytest.raises(
        InvalidRequest, match=r"cuda:0 would hold thinker 75\.6 GiB \+ talker 12\.5 GiB"
    ) as err:
        memory.check_placement_fits(config, shared, 16, 4096)
    assert "--talker-device" in err.value.message
    apart = [
        ("thinker", LoadOptions("cuda:0")),
        ("talker", LoadOptions("cuda:1")),
        ("talker", LoadOptions("cuda:1")),
    ]
    assert memory.check_placement_fits(config, apart, 16, 4096) == {"cuda:0": thinker, "cuda:1": 2 * talker}
