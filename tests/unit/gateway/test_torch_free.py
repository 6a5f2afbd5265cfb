"""The gateway is a router: importing it and handling a request's data never loads torch or
transformers (they take seconds and hundreds of MB to load)."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def test_gateway_imports_and_request_handling_load_no_torch():
    probe = textwrap.dedent(
        """
        import sys

        import numpy as np

        import gateway.main, gateway.api.app, gateway.api.grpc
        import gateway.serving.core, gateway.serving.stage_calls
        from gateway.media.file_decode import Deadline, decode_image
        from gateway.media.limits import MediaLimits, Tally
        from omnistream.wire.messages import message_proto
        from gateway.config import GatewayConfig
        from omnistream.request.generation import GenerationRequest
        from omnistream.request.defaults import RequestInput, resolve
        from omnistream.wire.tensors import numpy_from_proto, to_proto

        GenerationRequest(messages=[{"role": "user", "content": "hi"}]).validate()
        resolve(RequestInput(messages=[{"role": "user", "content": "hi"}], seed=1))
        pcm = np.linspace(-1, 1, 480, dtype=np.float32)
        assert (numpy_from_proto(to_proto(pcm)) == pcm).all()
        GatewayConfig(thinker=["a:1"], talker=["b:1"], code2wav=["c:1"]).validate()
        import io
        from PIL import Image
        png = io.BytesIO()
        Image.new("RGB", (40, 30)).save(png, format="PNG")
        image = decode_image(png.getvalue(), "image/png", "f", Tally(MediaLimits()), MediaLimits())
        message_proto({"role": "user", "content": [{"type": "image", "image": image}]})
        print(sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "transformers")))
        """
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", out.stdout
