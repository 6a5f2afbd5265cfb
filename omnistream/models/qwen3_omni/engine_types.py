"""The static half of the engine API check: each of the family's engines is its stage's protocol.

Nothing runs here (the block is for the type checker only, so importing this module imports no
engine): mypy checks each assignment below against omnistream/engine/api.py, so an engine that drifts
from the API its servicer calls fails `make lint`; tests/unit/engine/test_api.py checks the same
members and signatures at run time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from omnistream.engine.api import Code2WavStageEngine, TalkerStageEngine, ThinkerStageEngine
    from omnistream.models.qwen3_omni.code2wav.engine import Code2WavEngine
    from omnistream.models.qwen3_omni.talker.engine import TalkerEngine
    from omnistream.models.qwen3_omni.thinker.engine import ThinkerEngine
    from omnistream.models.qwen3_omni.thinker.vllm_engine import VllmThinkerEngine

    def _thinker(engine: ThinkerEngine) -> ThinkerStageEngine:
        return engine

    def _vllm_thinker(engine: VllmThinkerEngine) -> ThinkerStageEngine:
        return engine

    def _talker(engine: TalkerEngine) -> TalkerStageEngine:
        return engine

    def _code2wav(engine: Code2WavEngine) -> Code2WavStageEngine:
        return engine
