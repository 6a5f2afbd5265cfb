"""An engine's per-step numbers, apart from the engine so that the engine API (api.py) can name them
without importing the engine that imports the API."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class EngineStats:
    """A snapshot for metrics: read from any thread."""

    steps: int = 0
    last_batch_size: int = 0
    last_step_seconds: float = 0.0
    # Output units the last step produced (thinker: tokens, talker: codec frames emitted, code2wav:
    # codec frames decoded); omnistream/service/speed.py measures the stage's speed from it.
    last_units: int = 0
    # Prompt positions the last step prefilled (thinker, talker): such a step says little about
    # the batch's own step time (omnistream/service/step_model.py leaves it out).
    last_prefill_rows: int = 0
    aborted: int = 0
    errors: int = 0
    finished: int = 0
    # Scheduling under a per-step budget (the talker and Code2Wav): requests that could have
    # stepped but were left for more urgent ones, in all and in the last step, and the buffered
    # audio seconds (omnistream/engine/playout.py) of the requests the last step ran.
    deferred: int = 0
    last_deferred: int = 0
    last_buffered: tuple[float, ...] = ()
    # Grammar-constrained decoding (omnistream/engine/grammar.py): grammars compiled (each once:
    # later requests with the same grammar are cache hits), their compile time in all and the
    # last one's, and compiles a request stopped waiting for (its bound passed).
    grammar_compiles: int = 0
    grammar_compile_seconds: float = 0.0
    last_grammar_compile_seconds: float = 0.0
    grammar_cache_hits: int = 0
    grammar_timeouts: int = 0
