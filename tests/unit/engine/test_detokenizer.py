from __future__ import annotations

from omnistream.engine.detokenizer import IncrementalDetokenizer
from omnistream.models.qwen3_omni.checkpoint import load_tokenizer


def test_multibyte_characters_are_never_split(tiny_model_dir):
    tok = load_tokenizer(tiny_model_dir)
    text = "caf\u00e9 \u65e5\u672c\u8a9e \u0436 \U0001f389 ok"  # mostly outside the BPE corpus
    ids = tok.encode(text, add_special_tokens=False)
    detok = IncrementalDetokenizer(tok)
    deltas = [detok.add(i) for i in ids] + [detok.flush()]
    assert "".join(deltas) == text
    assert all("\ufffd" not in d for d in deltas)
    assert sum(1 for d in deltas if d) < len(ids)  # some tokens were held back mid-character
