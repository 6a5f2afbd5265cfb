"""`omnistream bench --conversation`: conversation memory (issue 37), the prefix cache on against off.

Per checkpoint (`--conversation-models`: tiny, real-shaped, or a checkpoint directory) and per cache
setting (on: the stages' default prefix cache; off: `--prefix-cache-gib 0`), run A B B A over
`--repeats` (on, off, off, on), each run on a fresh stack (`omnistream up`'s start_stack: every run
starts with an empty cache and nothing of the run before it), the same three workloads:

- realtime: one /v1/realtime session of `--conversation-turns` spoken turns. Each turn is a sentence
  spoken by espeak-ng (2.9-4.3 s, omnistream/bench/speech.py); with `--conversation-turn-seconds`
  (e.g. 4.5) it ends in silence up to that length, as a turn that voice activity detection commits
  ends in the silence that closed it: every turn then brings the same new audio (65 audio tokens
  at 4.5 s), and turn N against turn 2 differs only in the history. Sent as a
  `conversation.item.create` with an `input_audio` part; once the item is in the conversation,
  `response.create`. Per turn, timed at the client from response.create: TTFT (the first transcript
  or text delta), TTFP (the first audio delta), and `response.done`'s usage: input_tokens and
  input_token_details.cached_tokens, and the gateway's own TTFT (`response.omnistream.ttft_ms`, from
  the response's start there: the rest of the client's TTFT is the websocket and the turn's set-up).
- rest: a chat of as many turns over POST /v1/chat/completions (streamed, pcm16 audio, usage in
  the last chunk), each turn re-sending the whole history (system, then user and assistant turns:
  the assistant turn is the transcript the turn before streamed); the user turns are the same
  sentences, as text. Per turn: TTFT, TTFP from the request, usage.prompt_tokens and
  usage.prompt_tokens_details.cached_tokens.
- concurrent: `--conversation-concurrency` REST conversations at once (each its own words, so they
  share only the system prompt), `--conversation-concurrent-turns` turns each: audio seconds, output
  tokens and turns per second of wall time, and the TTFT of all their turns.

Answers are short and alike on both sides: greedy text and voice, `--conversation-max-tokens`
tokens (ignore EOS) and at most `--conversation-audio-frames` codec frames a turn. A warm-up
(a REST request and a one-turn realtime session with other words) runs on each fresh stack first.

Targets (issue 37), with the cache: turn N's TTFT at most 1.25x turn 2's on the tiny checkpoint and
1.5x on the real-shaped one (and on any other), at turn N at least 80% of the input tokens cached,
and at concurrency 10 no less throughput (audio s/s) than without the cache, to within
`--conversation-throughput-tolerance`. Each target is printed with pass/fail; the runs' numbers go to
`conversation.json` and the tables to `conversation.md` under `--output-dir`.

The package: `workloads` (the clients' conversations and their turns), `summary` (runs merged,
ratios, targets), `tables` (the markdown), `runs` (the stacks and the A B B A order).
"""

from omnistream.bench.conversation.runs import run_conversation

__all__ = ["run_conversation"]
