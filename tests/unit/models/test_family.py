"""The model-family registry: a checkpoint's config.json picks its family, without torch."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from omnistream.engine.load_options import LoadOptions
from omnistream.engine.settings import (
    Code2WavEngineSettings,
    TalkerEngineSettings,
    ThinkerEngineSettings,
    derive,
)
from omnistream.models.family import families, family_for, family_named, model_info, read_config
from omnistream.models.qwen3_omni.family import FAMILY
from omnistream.request.errors import InvalidRequest


def test_the_tiny_checkpoint_is_qwen3_omni(tiny_model_dir):
    family = family_for(tiny_model_dir)
    assert family.name == "qwen3_omni"
    assert family is family_named("qwen3_omni")
    assert set(families()) == {"qwen3_omni"}


def test_describe_reads_what_stages_report_from_the_config(tiny_model_dir):
    info = family_for(tiny_model_dir).describe(read_config(tiny_model_dir))
    assert info.sample_rate == 24000
    assert info.codebooks == 16
    assert info.samples_per_frame == 1920
    assert info.frames_per_second == 12.5
    assert info.voices == ("aiden", "chelsie", "ethan")
    assert info.default_voice == "ethan"
    assert model_info(tiny_model_dir) == info


def test_an_unknown_model_type_is_refused_by_name(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(InvalidRequest, match="no model family serves model_type 'llama'"):
        family_for(tmp_path)


def test_a_directory_without_config_is_refused(tmp_path):
    with pytest.raises(InvalidRequest, match=r"config\.json does not exist"):
        family_for(tmp_path)


def test_an_unknown_family_name_is_refused():
    with pytest.raises(InvalidRequest, match="unknown model family 'nope'"):
        family_named("nope")


def test_choosing_a_family_and_describing_it_load_no_torch(tiny_model_dir):
    probe = textwrap.dedent(
        f"""
        import sys
        from omnistream.models.family import family_for, read_config

        family_for({tiny_model_dir!r}).describe(read_config({tiny_model_dir!r}))
        print(sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "transformers")))
        """
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", out.stdout


def test_random_prompts_have_the_exact_length_and_the_chat_framing(tiny_model_dir):
    family = family_for(tiny_model_dir)
    config, tokenizer = family.load_config(tiny_model_dir), family.load_tokenizer(tiny_model_dir)
    prompts = family.random_prompts(config, tokenizer, 3, 20, seed=1)
    assert [len(p) for p in prompts] == [20, 20, 20]
    assert all(p[:2] == [config.im_start_token_id, config.user_token_id] for p in prompts)
    assert prompts == family.random_prompts(config, tokenizer, 3, 20, seed=1)


def test_the_engine_factory_hands_the_audio_stages_their_step_budgets(tiny_model_dir):
    options = LoadOptions(dtype="float32")
    talker = FAMILY.engine(
        "talker",
        tiny_model_dir,
        derive(TalkerEngineSettings, options, max_batch=4, max_step_batch=2, first_audio_target=0.25),
    )
    assert (talker.max_step_batch, talker.first_audio_target) == (2, 0.25)
    assert (
        FAMILY.engine(
            "talker", tiny_model_dir, derive(TalkerEngineSettings, options, max_batch=4)
        ).max_step_batch
        == 4
    )  # default: the batch
    code2wav = FAMILY.engine(
        "code2wav",
        tiny_model_dir,
        derive(Code2WavEngineSettings, options, max_step_frames=30, first_audio_target=1.5),
    )
    assert (code2wav.max_step_frames, code2wav.first_audio_target) == (30, 1.5)


def test_the_vllm_backend_serves_the_thinker_only(tiny_model_dir):
    """Refused before any weight is read: vLLM runs no talker or code2wav here, and a misspelt
    backend is named."""
    with pytest.raises(ValueError, match="thinker only"):
        FAMILY.engine("talker", tiny_model_dir, ThinkerEngineSettings(backend="vllm"))
    with pytest.raises(ValueError, match="unknown backend"):
        FAMILY.engine("thinker", tiny_model_dir, ThinkerEngineSettings(backend="onnx"))
