"""The Qwen3-Omni thinker on vLLM's async engine: the same engine API as thinker/engine.py.

Built by the family (`ThinkerEngineSettings.backend == "vllm"`), served by the same ThinkerServicer: the
chunks, statuses and Info are the stage contract's, so the gateway, talker and Code2Wav cannot tell
the backends apart, except that this one's Info accepts only text (`input_modalities`).

What vLLM does here: its own continuous batching, paged KV cache with automatic prefix caching (a
conversation that re-sends its history each turn prefills only the new part), chunked prefill
(`--prefill-chunk` is its per-step token budget), its limits (`max_model_len`, `max_num_seqs` =
`--max-batch`). What stays ours: the chat encoding, the request checks and their error messages,
and given answers (speech), which need no model (`thinker/text.py`, shared with the transformers
engine). Each request is one `AsyncLLM.generate` task over token ids with DELTA outputs; cancelling
the task (the stream ended: client cancel, deadline, error) is what aborts it inside vLLM, through
vLLM's own abort path in `generate`. A request's output grammar (tool calls, response_format) goes to
vLLM's own structured outputs (xgrammar): checked by vLLM's validation before the request is
admitted, compiled and enforced inside vLLM's engine core.

Text only: the talker needs nothing but the thinker's token ids for a text prompt (it embeds them
itself); media prompts need the deep hidden rows at the media positions, which this engine does not
produce, so it refuses them and reports `input_modalities=["text"]` for the gateway to route by.

What it loads (`vllm_load`): "text", the thinker's language model converted to a Qwen3MoeForCausalLM
directory (vllm_checkpoint.py; the CPU path and the tests), or "native", the checkpoint directory
itself through vLLM's own Qwen3-Omni thinker (GPU deployments of the real model). Default: text on
the CPU, native on an accelerator.

vLLM starts its engine core in a child process (spawned: the caller's `__main__` must be guarded,
as `omnistream.cli` is). This module imports vLLM only inside the engine, so the family imports
without it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from omnistream.engine.chat_encoding import Tools
from omnistream.engine.output_stream import OutputStream
from omnistream.engine.requests import RequestBook
from omnistream.engine.settings import ThinkerEngineSettings
from omnistream.engine.token_memo import TokenMemo
from omnistream.models.qwen3_omni.thinker.text import ThinkerOutput, ThinkerText, spoken_piece
from omnistream.models.qwen3_omni.thinker.vllm_launch import resolve_load, start_async_llm
from omnistream.models.qwen3_omni.thinker.vllm_sampling import (
    checked_structured_outputs,
    sampling_params,
    structured_outputs,
)
from omnistream.request.errors import InternalError, InvalidRequest, InvalidValue, OmniError
from omnistream.request.stage_chain import ThinkerParams
from omnistream.request.structured import StructuredOutput

log = logging.getLogger(__name__)

INPUT_MODALITIES = ("text",)
# How long vLLM's check of a request's output grammar may take before the request is refused.
GRAMMAR_CHECK_TIMEOUT_S = 10.0
TEXT_ONLY = (
    "this thinker replica (vLLM backend) takes text prompts only; requests with audio, images or "
    "video are served by a transformers thinker"
)
# Unavailable's message once vLLM's engine core died (refusing a new request, failing a running one).
ENGINE_DIED = "the thinker's vLLM engine died; it is restarting"


@dataclass
class _Request:
    request_id: str
    output: OutputStream[Any]
    prompt_ids: list[int]
    params: ThinkerParams
    spoken: list[int] | None
    task: asyncio.Task[None] | None = None
    started: bool = False  # vLLM (or the given answer) produced its first output
    finished: bool = False  # ended (finished, failed, aborted) or failed by a dead engine core
    generated: list[int] = field(default_factory=list)
    room: asyncio.Event = field(default_factory=asyncio.Event)
    structured: Any = None  # vLLM's StructuredOutputsParams of its output grammar, when it has one


class VllmThinkerEngine(RequestBook[_Request]):
    """A thinker engine whose model work is vLLM's: the API ThinkerServicer, StageMetrics, the
    speed meter and run_stage_server use (add_request, abort, counts, stats, step and fatal
    listeners, start/stop), with the request bookkeeping (`RequestBook`, the transformers engines'
    own) on the event loop (no engine thread: vLLM's engine core runs in its own process, its
    outputs arrive as asyncio tasks)."""

    name = "thinker"
    lost_refusal = lost_failure = ENGINE_DIED

    def __init__(
        self, model_dir: str, settings: ThinkerEngineSettings, *, output_capacity: int = 512
    ) -> None:
        """`settings` as `omnistream serve thinker --backend vllm` takes them (`vllm_load`: what
        vLLM loads; no prefix cache budget: vLLM keeps its own)."""
        from transformers import AutoConfig, AutoTokenizer

        super().__init__(settings.request_limit)  # the request book's fields
        self.settings = settings
        self.config = AutoConfig.from_pretrained(str(model_dir))
        self.tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
        self.text = ThinkerText(self.config, self.tokenizer, settings.max_model_len)
        self.max_model_len = settings.max_model_len
        self.max_batch = settings.max_batch
        self.output_capacity = output_capacity
        self.input_modalities = INPUT_MODALITIES
        self._last_record: float | None = None  # end of the last step, or when work arrived
        # vLLM's own view, from its scheduler's stats each engine step (tests and metrics read it).
        self.vllm_running = 0
        self.vllm_waiting = 0
        if settings.dtype_name == "float64":
            raise InvalidRequest("the vLLM thinker runs float32, bfloat16 or float16", field="dtype")
        self.load = resolve_load(settings.vllm_load, settings.device)
        self.vllm_model = self._model_dir(model_dir)
        self.llm = start_async_llm(
            self.vllm_model,
            settings,
            self.max_model_len,
            self.max_batch,
            settings.prefill_chunk,
            native=self.load == "native",
            on_step=self._on_vllm_step,
        )

    # --- construction -------------------------------------------------------------------------------
    def _model_dir(self, model_dir: str) -> str:
        if self.load == "native":
            return str(model_dir)
        from omnistream.models.qwen3_omni.thinker.vllm_checkpoint import ensure_converted

        return str(ensure_converted(model_dir))

    # --- the engine API -------------------------------------------------------------------------------
    def encode_chat(
        self, messages: list[dict[str, Any]], tools: Tools = None, memo: TokenMemo | None = None
    ) -> list[int]:
        """See `ThinkerText.encode_chat` (call it off the event loop)."""
        return self.text.encode_chat(messages, tools, memo)

    def encode_assistant_text(self, text: str) -> list[int]:
        """See `ThinkerText.encode_assistant_text` (call it off the event loop)."""
        return self.text.encode_assistant_text(text)

    def prepare_media(
        self,
        messages: list[dict[str, Any]],
        use_audio_in_video: bool = False,
        tools: Tools = None,
        memo: Any = None,
        ahead: bool = False,
    ) -> Any:
        raise InvalidRequest(TEXT_ONLY, field="messages")

    async def compile_grammar(self, structured: StructuredOutput) -> Any:
        """vLLM's structured outputs for the grammar (vllm_sampling.py: the strict grammar built off
        the event loop), checked by vLLM's own validation (which parses it with xgrammar), both
        within `GRAMMAR_CHECK_TIMEOUT_S`: a spec vLLM would refuse is InvalidRequest naming the
        client's param before the request is admitted. vLLM compiles it itself, in its engine core."""
        checked = asyncio.to_thread(checked_structured_outputs, structured, self.text.eos_ids)
        try:
            return await asyncio.wait_for(checked, GRAMMAR_CHECK_TIMEOUT_S)
        except TimeoutError:
            raise InvalidValue(
                f"the output grammar was not checked within {GRAMMAR_CHECK_TIMEOUT_S:g} s (too large or "
                "too complex)",
                field=structured.param,
            ) from None

    def add_request(
        self,
        request_id: str,
        prompt_ids: list[int],
        params: ThinkerParams,
        media: Any = None,
        spoken: list[int] | None = None,
        grammar: Any = None,
    ) -> OutputStream[Any]:
        """Checked as the transformers thinker checks (same errors), admitted under `max_requests`,
        then run as one asyncio task; the returned stream ends with the request. `grammar`: what
        `compile_grammar(params.structured_output)` returned (else vLLM checks the grammar when
        the request reaches it, and a refusal fails the stream)."""
        if media is not None:
            raise InvalidRequest(TEXT_ONLY, field="messages")
        if params.encode_only:  # work ahead is media work
            raise InvalidRequest(f"encode_only: {TEXT_ONLY}", field="encode_only")
        if params.answer_ids:  # its sampler draws one stream a request: a continuation would differ
            raise InvalidRequest("the vLLM thinker does not continue an answer", field="answer_ids")
        self.text.check_ids(prompt_ids)
        spoken = self.text.check_budget(prompt_ids, params, spoken)
        if self.poisoned is None and self.llm.errored:  # died while idle: nothing had noticed
            self._poison(RuntimeError("vLLM's engine core is dead"))
        self.check_admission(request_id)  # before its grammar is built
        request = _Request(request_id, None, list(prompt_ids), params, spoken)  # type: ignore[arg-type]
        if params.structured_output is not None and spoken is None:
            request.structured = (
                grammar if grammar is not None else structured_outputs(params.structured_output)
            )
        request.output = OutputStream(
            asyncio.get_running_loop(), self.output_capacity, on_consume=request.room.set
        )
        self.admit(request)
        run = self._speak(request) if spoken is not None else self._generate(request)
        request.task = asyncio.get_running_loop().create_task(run, name=f"thinker-{request_id}")
        return request.output

    # --- the request book's hooks ------------------------------------------------------------------
    def _admitted(self, state: _Request) -> None:
        if len(self._requests) == 1:
            self._last_record = time.perf_counter()  # idle time before this is no step's

    def _aborted(self, state: _Request) -> None:
        """`abort` cancels the request's task: inside `AsyncLLM.generate` the cancellation aborts the
        request in vLLM's scheduler."""
        if state.task is not None:
            state.task.cancel()

    def _running(self, state: _Request) -> bool:
        """A request runs once it produced output (vLLM admitted and prefilled it, or it is a given
        answer being streamed); before that it waits in vLLM's queue."""
        return state.started

    def _report_poisoned(self, error: BaseException, count: int) -> None:
        log.critical("thinker: vLLM's engine died (%s); failing %d request(s)", error, count)

    def wake(self) -> None:
        """Nothing to wake: outputs are pushed by vLLM's output handler."""

    def num_unfinished_in_vllm(self) -> int:
        """Requests vLLM's output processor still tracks (0 once every one ended or was aborted)."""
        unfinished: int = self.llm.get_num_unfinished_requests()
        return unfinished

    def metric_collectors(self) -> list[Any]:
        """vLLM's own Prometheus metrics (`vllm:*`, in prometheus_client's global registry), for the
        stage's /metrics beside ours: `vllm:num_requests_running` is vLLM's scheduler's count."""
        from prometheus_client import REGISTRY

        class VllmMetrics:
            def collect(self) -> Iterator[Any]:
                for family in REGISTRY.collect():
                    if family.name.startswith("vllm:"):
                        yield family

        return [VllmMetrics()]

    def start(self) -> None:
        """vLLM's engine started in the constructor (it loads the weights there, as the
        transformers engine does)."""

    def stop(self) -> None:
        self._stopping = True
        for request in list(self._requests.values()):
            if request.task is not None:
                request.task.cancel()
            request.output.close()
        self._requests.clear()
        self.llm.shutdown()

    # --- per request ----------------------------------------------------------------------------------
    def _sampling(self, request: _Request) -> Any:
        """The request's vLLM SamplingParams (vllm_sampling.py), with its grammar's structured outputs."""
        return sampling_params(request.params, request.structured, self.text.eos_ids)

    async def _generate(self, request: _Request) -> None:
        from vllm.inputs import TokensPrompt

        detok = self.text.detokenizer()
        try:
            prompt = TokensPrompt(prompt_token_ids=request.prompt_ids)
            if request.params.cache_scope:  # vLLM's own scopes: its prefix cache salted per scope
                prompt["cache_salt"] = request.params.cache_scope.hex()
            async for result in self.llm.generate(prompt, self._sampling(request), request.request_id):
                completion = result.outputs[0]
                tokens = list(completion.token_ids)
                finished = result.finished
                delta = "".join(detok.add(t) for t in tokens)
                if finished:
                    delta += detok.flush()
                first = not request.started
                request.started = True
                index = len(request.generated)
                request.generated.extend(tokens)
                reason = None
                if finished:
                    reason = "length" if completion.finish_reason == "length" else "stop"
                request.output.put(
                    ThinkerOutput(
                        token_ids=tokens,
                        text_delta=delta,
                        index=index,
                        finished=finished,
                        finish_reason=reason,
                        prompt_ids=list(request.prompt_ids) if first else None,
                        # vLLM's own automatic prefix caching (vllm_launch.py turns it on)
                        cached_tokens=(result.num_cached_tokens or 0) if first else 0,
                    )
                )
            self.finish(request)
        except asyncio.CancelledError:
            raise  # aborted: `generate` has told vLLM, `abort` did our side
        except Exception as exc:
            self._failed(request, exc)

    async def _speak(self, request: _Request) -> None:
        """A given answer: no model work, the pieces the transformers thinker sends, paced by the
        output's bound (each waits until the consumer took something)."""
        assert request.spoken is not None
        detok = self.text.detokenizer()
        request.started = True
        while len(request.generated) < len(request.spoken):
            while not request.output.has_room():
                request.room.clear()
                await request.room.wait()
            request.output.put(spoken_piece(request.prompt_ids, request.spoken, request.generated, detok))
            await asyncio.sleep(0)
        self.finish(request)

    def _failed(self, request: _Request, exc: Exception) -> None:
        """The request's task raised `exc`: vLLM's engine core died (every request fails: `_poison`),
        or this request failed (`fail`, with what the client is told)."""
        from vllm.exceptions import VLLMClientError
        from vllm.v1.engine.exceptions import EngineDeadError

        if isinstance(exc, EngineDeadError):
            self._poison(exc)
            return
        if isinstance(exc, OmniError):
            error = exc
        elif isinstance(exc, VLLMClientError | ValueError):  # vLLM refused the request itself
            structured = request.params.structured_output
            error = InvalidRequest(
                f"the thinker's vLLM engine refused the request: {exc}",
                # With a grammar, it is what vLLM checks beyond our own checks.
                field=structured.param if structured is not None else None,
            )
        else:
            log.exception("thinker (vLLM): request %s failed", request.request_id, exc_info=exc)
            error = InternalError(f"thinker failed on this request: {type(exc).__name__}: {exc}")
        self.fail(request, error)

    # --- vLLM's steps ---------------------------------------------------------------------------------
    def _on_vllm_step(self, scheduler_stats: Any, iteration_stats: Any) -> None:
        """One engine step's stats (on the event loop, from vLLM's output handler): the step's
        time is the time since the previous report, or since the first request while it was idle."""
        now = time.perf_counter()
        if scheduler_stats is not None:
            self.vllm_running = scheduler_stats.num_running_reqs
            self.vllm_waiting = scheduler_stats.num_waiting_reqs
        if iteration_stats is None:
            return
        previous = self._last_record
        self._last_record = now
        self.stats.last_units = iteration_stats.num_generation_tokens
        self.stats.last_batch_size = self.vllm_running
        # Counted, and the step listeners told: a failing one never breaks vLLM's output handler.
        self._stepped(0.0 if previous is None else now - previous)
