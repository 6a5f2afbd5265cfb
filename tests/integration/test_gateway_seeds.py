"""The seed a gateway gives a sampled request that brings none (gateway/serving/server_seeds.py), on
the real services: with the gateway's `seed` setting the same request gets the same sampled answer."""

from __future__ import annotations

import httpx

from .conftest import configured_gateway, gateway_process, gateway_url

MESSAGES = [{"role": "user", "content": "Tell me a story about the sea."}]


def test_a_gateway_with_a_seed_setting_repeats_its_sampled_answers(stages, tmp_path):
    """A sampled request that names no seed runs on one the gateway chose: with the `seed` setting,
    one derived from the request, so the same request gets the same text and audio again (and
    through another gateway of the same setting); without it, a fresh one each time."""
    limits = {"max_tokens": 24, "max_audio_frames": 40, "initial_codec_chunk_frames": 4}

    def answer(url: str) -> tuple[str, str]:
        body = {"messages": MESSAGES, "audio": {"format": "pcm16"}, **limits}
        reply = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120)
        assert reply.status_code == 200, reply.text
        audio = reply.json()["choices"][0]["message"]["audio"]
        return audio["transcript"], audio["data"]

    for name in ("a", "b"):
        (tmp_path / name).mkdir()
    with configured_gateway(stages, tmp_path / "a", {"seed": 41}) as seeded:
        first = answer(gateway_url(seeded))
        assert answer(gateway_url(seeded)) == first
    with configured_gateway(stages, tmp_path / "b", {"seed": 41}) as again:
        assert answer(gateway_url(again)) == first
    with gateway_process(stages) as unset:
        assert answer(gateway_url(unset)) != first != answer(gateway_url(unset))
