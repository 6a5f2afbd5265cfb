"""Grammar-constrained decoding for a transformers engine: compiled grammars and the batch's mask.

A request with a `StructuredOutput` (omnistream/request/structured.py: tool calls, response_format)
may only emit tokens its grammar allows. xgrammar does the grammar work: one `GrammarCompiler` per
tokenizer (built on first use, so an engine that never sees a grammar pays nothing), a
`GrammarMatcher` per request that says which tokens may come next and takes each chosen one.

Why the pieces are shaped so:
* Compiling is slow next to a decode step (a large schema takes milliseconds to seconds), so it runs
  in this module's own threads, never on the engine thread nor the event loop, within a time bound:
  past it the request is refused (InvalidValue naming the client's param) instead of stalling.
  Compiled grammars, and the errors of those that do not compile, are kept by (kind, spec) in an
  LRU: a tool set or a schema sent again (every turn of a conversation) is never compiled again,
  and two requests with the same grammar at once share one compile.
* Each decode step fills ONE token bitmask for the whole batch (`BatchMask`) and applies it to the
  logits before sampling. Rows without a grammar are never touched, so an unconstrained request's
  logits, and so its tokens, are the same whether or not a constrained one shares its batch.

The engine owns the matchers' lifetimes (a finished, failed or aborted request drops its matcher) and
turns a matcher's faults into that request's failure alone.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

import torch
import xgrammar as xgr

from omnistream.engine.json_grammar import json_object_ebnf, json_schema_ebnf, strict_structural_tag
from omnistream.engine.stats import EngineStats
from omnistream.request.errors import InvalidValue
from omnistream.request.structured import StructuredOutput

log = logging.getLogger(__name__)

# How long a request waits for its grammar to compile (queueing behind other compiles included).
DEFAULT_COMPILE_TIMEOUT_S = 10.0
# Compiled grammars (and refusals) kept; a tool set's grammar is some hundred KiB at most.
DEFAULT_CACHE_ENTRIES = 256
# Compiles at once: grammar work must leave the cores to the model.
COMPILE_THREADS = 2
# Threads filling one step's rows of the bitmask at once (xgrammar's batch fill releases the GIL).
FILL_THREADS = max(1, min(8, (os.cpu_count() or 2) // 2))

CompileListener = Callable[[float], None]
_Key = tuple[str, str]


class Grammars:
    """One tokenizer's grammar compiler, its compiled grammars and the matchers made from them."""

    def __init__(
        self,
        tokenizer: Any,
        vocab_size: int,
        stop_ids: Iterable[int],
        timeout: float = DEFAULT_COMPILE_TIMEOUT_S,
        entries: int = DEFAULT_CACHE_ENTRIES,
        stats: EngineStats | None = None,
    ) -> None:
        """`vocab_size`: the model's logits width (it may exceed the tokenizer's: padding ids are
        never allowed). `stop_ids`: the tokens that end an answer once its grammar is complete
        (the end of turn among them)."""
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.stop_ids = sorted(set(stop_ids))
        self.timeout = timeout
        self.entries = entries
        self.stats = stats if stats is not None else EngineStats()
        self._lock = threading.Lock()
        self._compiler: xgr.GrammarCompiler | None = None
        self._cache: OrderedDict[_Key, xgr.CompiledGrammar | InvalidValue] = OrderedDict()
        self._inflight: dict[_Key, Future[xgr.CompiledGrammar]] = {}
        self._pool = ThreadPoolExecutor(COMPILE_THREADS, thread_name_prefix="grammar")
        self._listeners: list[CompileListener] = []

    def add_compile_listener(self, listener: CompileListener) -> None:
        """`listener(seconds)` after every compile (metrics), on the compiling thread."""
        self._listeners.append(listener)

    # --- compiling --------------------------------------------------------------------------------
    def compile(self, structured: StructuredOutput) -> xgr.CompiledGrammar:
        """The compiled grammar, from the cache or compiled now; blocks at most `timeout` seconds.
        A spec that does not compile, or not in time, is InvalidValue naming `structured.param`."""
        future = self._submit(structured)
        if isinstance(future, xgr.CompiledGrammar):
            return future
        try:
            return future.result(timeout=self.timeout)
        except FutureTimeout:
            raise self._too_slow(structured) from None

    async def compile_async(self, structured: StructuredOutput) -> xgr.CompiledGrammar:
        """`compile` for the event loop: waits without blocking it, within the same bound."""
        future = self._submit(structured)
        if isinstance(future, xgr.CompiledGrammar):
            return future
        try:
            return await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(future)), self.timeout)
        except TimeoutError:
            raise self._too_slow(structured) from None

    def cached(self, structured: StructuredOutput) -> bool:
        """Is this grammar compiled already (tests, tools)?"""
        with self._lock:
            return isinstance(self._cache.get((structured.kind, structured.spec)), xgr.CompiledGrammar)

    def _too_slow(self, structured: StructuredOutput) -> InvalidValue:
        with self._lock:
            self.stats.grammar_timeouts += 1
        return InvalidValue(
            f"the output grammar did not compile within {self.timeout:g} s (too large or too complex)",
            field=structured.param,
        )

    def _submit(self, structured: StructuredOutput) -> xgr.CompiledGrammar | Future[xgr.CompiledGrammar]:
        """A cached grammar (a refusal raises again), or the future of its compile (shared by every
        request that asks for the same grammar meanwhile)."""
        key = (structured.kind, structured.spec)
        with self._lock:
            known = self._cache.get(key)
            if known is not None:
                self._cache.move_to_end(key)
                self.stats.grammar_cache_hits += 1
                if isinstance(known, InvalidValue):
                    raise InvalidValue(known.message, field=known.field)
                return known
            future = self._inflight.get(key)
            if future is None:
                future = self._pool.submit(self._compile, structured)
                self._inflight[key] = future
            else:
                self.stats.grammar_cache_hits += 1
            return future

    def _compile(self, structured: StructuredOutput) -> xgr.CompiledGrammar:
        key = (structured.kind, structured.spec)
        started = time.perf_counter()
        result: xgr.CompiledGrammar | InvalidValue
        try:
            result = self._build(structured)
        except InvalidValue as exc:
            result = exc
        except Exception as exc:  # xgrammar's refusal: a schema or tag it cannot turn into a grammar
            result = InvalidValue(f"the output grammar does not compile: {exc}", field=structured.param)
        seconds = time.perf_counter() - started
        with self._lock:
            self._inflight.pop(key, None)
            self._cache[key] = result
            while len(self._cache) > self.entries:
                self._cache.popitem(last=False)
            self.stats.grammar_compiles += 1
            self.stats.grammar_compile_seconds += seconds
            self.stats.last_grammar_compile_seconds = seconds
        for listener in self._listeners:
            try:
                listener(seconds)
            except Exception:
                log.exception("grammar compile listener %r failed", listener)
        if isinstance(result, InvalidValue):
            raise InvalidValue(result.message, field=result.field)
        return result

    def _build(self, structured: StructuredOutput) -> xgr.CompiledGrammar:
        compiler = self._the_compiler()
        kind, spec = structured.kind, structured.spec
        # Strict, compact JSON (json_grammar.py: xgrammar's own JSON grammars admit raw control
        # characters in some strings, and whitespace in a structural tag's JSON): the same
        # grammars the vLLM thinker gives vLLM, and a weak model under a JSON grammar otherwise
        # tends to spend its tokens on spaces and newlines.
        if kind == "json_object":
            return compiler.compile_grammar(json_object_ebnf())
        try:
            parsed = json.loads(spec)
        except ValueError as exc:
            raise InvalidValue(f"the output grammar is not JSON: {exc}", field=structured.param) from None
        if kind == "json_schema":
            if not isinstance(parsed, dict | bool):
                raise InvalidValue("a JSON schema is an object or a boolean", field=structured.param)
            return compiler.compile_grammar(json_schema_ebnf(parsed))
        if kind == "structural_tag":
            if not isinstance(parsed, dict):
                raise InvalidValue("a structural tag is a JSON object", field=structured.param)
            # xgrammar's older form too (`structures`, which vLLM takes too): the same tag.
            return compiler.compile_structural_tag(strict_structural_tag(spec))
        raise InvalidValue(f"unknown structured output kind {kind!r}", field=structured.param)

    def _the_compiler(self) -> xgr.GrammarCompiler:
        with self._lock:
            if self._compiler is None:
                info = xgr.TokenizerInfo.from_huggingface(
                    self.tokenizer, vocab_size=self.vocab_size, stop_token_ids=self.stop_ids
                )
                self._compiler = xgr.GrammarCompiler(info, max_threads=COMPILE_THREADS)
            return self._compiler

    # --- per request ------------------------------------------------------------------------------
    def matcher(self, compiled: xgr.CompiledGrammar) -> xgr.GrammarMatcher:
        """A request's own state in its grammar (cheap: the compiled grammar is shared)."""
        return xgr.GrammarMatcher(compiled)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


class BatchMask:
    """One token bitmask for a whole step's batch: the rows with a matcher are filled, and only those
    rows of the logits are masked (the others stay bit for bit what the model gave).

    Off the critical path: a step's rows are known, and their matchers hold what came before, when
    the step begins, while the mask is needed only once its logits are there. So the engine starts
    the fill (`start`) before its forward, in this mask's own thread (xgrammar's fill releases the
    GIL), and waits for it at sampling (`MaskFill.wait`), as vLLM overlaps its grammar work with the
    model's. One fill thread: a step's fill is never written while the last one's is still read.

    On the CPU the fill thread also turns the rows' bits into an additive mask (0 or -inf per
    token, through a byte lookup table), so that applying it is one vectorised add at sampling:
    xgrammar's CPU apply reads the bits token by token (4.8 ms for 16 rows of 152,064 logits on
    this machine's core, a third of the step; the add is 0.3 ms)."""

    def __init__(self, vocab_size: int, rows: int, additive: bool = False) -> None:
        """`additive`: build the additive mask beside the bits (an engine whose logits are on the
        CPU); on a GPU the bits go to the device and xgrammar's kernel applies them."""
        self.vocab_size = vocab_size
        self.bitmask = xgr.allocate_token_bitmask(rows, vocab_size)  # int32 [rows, ceil(V / 32)], CPU
        self._batch = xgr.BatchGrammarMatcher(max_threads=FILL_THREADS)
        self._filler = ThreadPoolExecutor(1, thread_name_prefix="grammar-mask")
        self.additive = torch.zeros(rows, vocab_size) if additive else None  # [rows filled, V]
        # byte -> its 8 tokens' addends (bit b of a byte allows its b-th token: little-endian words)
        bits = (torch.arange(256).unsqueeze(1) >> torch.arange(8)) & 1
        self._addends = torch.zeros(256, 8).masked_fill_(bits == 0, float("-inf"))

    def start(self, matchers: Sequence[xgr.GrammarMatcher], rows: Sequence[int]) -> MaskFill:
        """Begin filling `rows[i]` from `matchers[i]` in the fill thread; the matchers must not move
        (no token accepted) until the fill is waited for."""
        matchers, rows = list(matchers), list(rows)
        return MaskFill(self._filler.submit(self._fill_batch, matchers, rows), matchers, rows)

    def _fill_batch(self, matchers: list[xgr.GrammarMatcher], rows: list[int]) -> None:
        self._batch.batch_fill_next_token_bitmask(matchers, self.bitmask, indices=rows)
        if self.additive is not None:  # row i of it: rows[i]'s addends
            words = self.bitmask[rows].contiguous().view(torch.uint8).long()
            addends = self._addends[words].view(len(rows), -1)[:, : self.vocab_size]
            self.additive[: len(rows)].copy_(addends)

    def apply_filled(self, logits: torch.Tensor, filling: MaskFill) -> None:
        """Apply a fill that `start` made (waited for): one add of the additive mask on the CPU,
        else as `apply`."""
        rows = filling.rows
        if self.additive is None or logits.device.type != "cpu":
            self.apply(logits, rows)
            return
        addends = self.additive[: len(rows)]
        if addends.dtype != logits.dtype:
            addends = addends.to(logits.dtype)
        if rows == list(range(len(rows))):
            logits[: len(rows)].add_(addends)
        else:
            logits.index_add_(0, torch.tensor(rows, dtype=torch.long), addends)

    def close(self) -> None:
        self._filler.shutdown(wait=True)

    def fill(self, matcher: xgr.GrammarMatcher, row: int) -> None:
        """Row `row` allows what `matcher` allows next."""
        matcher.fill_next_token_bitmask(self.bitmask, row)

    def fill_rows(self, matchers: Sequence[xgr.GrammarMatcher], rows: Sequence[int]) -> None:
        """Row `rows[i]` allows what `matchers[i]` allows next, the rows filled in parallel (a row's
        fill costs about a millisecond at a real vocabulary: one after another they would add up to
        a large share of a batch's step). Raises if any matcher fails: the caller then fills row by
        row to find it."""
        if len(matchers) == 1:
            self.fill(matchers[0], rows[0])
            return
        self._batch.batch_fill_next_token_bitmask(list(matchers), self.bitmask, indices=list(rows))

    def apply(self, logits: torch.Tensor, rows: Sequence[int]) -> None:
        """Disallowed tokens of `rows` (filled this step) to -inf, in place, before sampling."""
        if not rows:
            return
        bitmask = self.bitmask[: logits.shape[0]]
        if logits.dtype in (torch.float32, torch.float16, torch.bfloat16):
            if logits.device.type != "cpu":
                bitmask = bitmask.to(logits.device, non_blocking=True)
            xgr.apply_token_bitmask_inplace(logits, bitmask, vocab_size=self.vocab_size, indices=list(rows))
            return
        # float64 (the reference runs): xgrammar's kernels take 16/32-bit floats only.
        index = torch.tensor(list(rows), dtype=torch.long)
        allowed = unpack_bitmask(bitmask.index_select(0, index), logits.shape[1]).to(logits.device)
        index = index.to(logits.device)
        logits[index] = logits.index_select(0, index).masked_fill(~allowed, float("-inf"))


class MaskFill:
    """A fill under way (`BatchMask.start`): `wait` for it before the mask is applied."""

    def __init__(self, future: Future[None], matchers: list[xgr.GrammarMatcher], rows: list[int]) -> None:
        self.future = future
        self.matchers = matchers
        self.rows = rows

    def wait(self) -> None:
        """Returns once the rows are filled; raises what the fill raised (some matcher failed: the
        caller then fills row by row to find which)."""
        self.future.result()


def unpack_bitmask(bitmask: torch.Tensor, vocab: int) -> torch.Tensor:
    """[R, words] int32 bitmask -> [R, vocab] bool (bit j of word w allows token 32 w + j)."""
    shifts = torch.arange(32, dtype=torch.int32, device=bitmask.device)
    bits = (bitmask.unsqueeze(-1) >> shifts) & 1
    return bits.reshape(bitmask.shape[0], -1)[:, :vocab].bool()
