import json

from omnistream.cli.common import ensure_tiny_model


def test_a_tiny_checkpoint_from_an_older_builder_is_rebuilt(tmp_path):
    stale = tmp_path / "tiny"
    stale.mkdir()
    (stale / "config.json").write_text("{}")  # what an older builder left: no processor configs
    (stale / "omnistream_tiny.json").write_text(json.dumps({"seed": 0}))
    ensure_tiny_model(stale)
    assert (stale / "preprocessor_config.json").exists()
    marker = json.loads((stale / "omnistream_tiny.json").read_text())
    assert marker["builder"]
    built = (stale / "model.safetensors").stat().st_mtime_ns
    ensure_tiny_model(stale)  # current now: left alone
    assert (stale / "model.safetensors").stat().st_mtime_ns == built
