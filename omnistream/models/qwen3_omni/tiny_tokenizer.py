"""The tiny Qwen3-Omni checkpoint's tokenizer (tiny.py builds the checkpoint around it): a
deterministic byte-level BPE whose special tokens match the config, the real tokenizer's media token
names, Qwen3's tool tokens, and a chat template that renders chats, media and tool calls as the real
one does.
"""

from __future__ import annotations

from pathlib import Path
from typing import cast

# Order matters: the special tokens take the ids right after the BPE vocabulary, in this order.
SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|audio_start|>",
    "<|audio_end|>",
    "<|audio_pad|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<tts_pad>",
    "<tts_text_bos>",
    "<tts_text_eod>",
]
BPE_VOCAB = 480
THINKER_VOCAB = 512  # BPE_VOCAB + specials, rounded up

# Qwen3's tool tokens, as the real vocabulary has them: added tokens, not special (a call's markup
# decodes into the answer's text, where the gateway's parser finds it). They take the ids after the
# special tokens, so the BPE ids, the special ids and the weights stay those of a build without them.
TOOL_TOKENS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]

# ChatML; a content given as parts renders media the way the real Qwen3-Omni template does (one
# placeholder between its start/end tokens, which the processor expands); a string renders as before.
# With `tools`, assistant `tool_calls` and `tool` messages: Qwen3's format, byte for byte (the
# `# Tools` system block with one JSON line per tool inside <tools></tools>, each call as
# `<tool_call>\n{"name": ..., "arguments": ...}\n</tool_call>`, consecutive tool results as one
# user turn of `<tool_response>` blocks). A chat without any of them renders as it always did.
_CONTENT_MACRO = (
    "{% macro render_content(content) %}"
    "{% if content is string %}{{ content }}"
    "{% elif content %}{% for part in content %}"
    "{% if part['type'] == 'audio' %}{{ '<|audio_start|><|audio_pad|><|audio_end|>' }}"
    "{% elif part['type'] == 'image' %}{{ '<|vision_start|><|image_pad|><|vision_end|>' }}"
    "{% elif part['type'] == 'video' %}{{ '<|vision_start|><|video_pad|><|vision_end|>' }}"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}"
    "{% endmacro %}"
)
_TOOLS_BLOCK = (
    "{% if tools %}"
    "{{ '<|im_start|>system\n' }}"
    "{% if messages[0]['role'] == 'system' %}{{ render_content(messages[0]['content']) + '\n\n' }}{% endif %}"
    "{{ '# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>' }}"
    "{% for tool in tools %}{{ '\n' + (tool | tojson) }}{% endfor %}"
    "{{ '\n</tools>\n\nFor each function call, return a json object with function name and arguments "
    'within <tool_call></tool_call> XML tags:\n<tool_call>\n{\\"name\\": <function-name>, '
    '\\"arguments\\": <args-json-object>}\n</tool_call><|im_end|>\n\' }}'
    "{% endif %}"
)
_TOOL_CALLS = (
    "{% for tool_call in message['tool_calls'] %}"
    "{% if not loop.first or message['content'] %}{{ '\n' }}{% endif %}"
    "{% set call = tool_call['function'] if tool_call['function'] is defined else tool_call %}"
    "{{ '<tool_call>\n{\"name\": \"' + call['name'] + '\", \"arguments\": ' }}"
    "{% if call['arguments'] is string %}{{ call['arguments'] }}"
    "{% else %}{{ call['arguments'] | tojson }}{% endif %}"
    "{{ '}\n</tool_call>' }}"
    "{% endfor %}"
)
CHAT_TEMPLATE = (
    _CONTENT_MACRO + _TOOLS_BLOCK + "{% for message in messages %}"
    "{% if tools and loop.first and message['role'] == 'system' %}"
    "{% elif message['role'] == 'tool' %}"
    "{% if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}{{ '<|im_start|>user' }}{% endif %}"
    "{{ '\n<tool_response>\n' }}{{ render_content(message['content']) }}{{ '\n</tool_response>' }}"
    "{% if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}{{ '<|im_end|>\n' }}{% endif %}"
    "{% else %}"
    "{{ '<|im_start|>' + message['role'] + '\n' }}"
    "{{ render_content(message['content']) }}"
    "{% if message['role'] == 'assistant' and message['tool_calls'] %}" + _TOOL_CALLS + "{% endif %}"
    "{{ '<|im_end|>' + '\n' }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# The processor finds placeholders and their frames by these names (the real tokenizer's).
MEDIA_TOKENS = {
    "audio_token": "<|audio_pad|>",
    "image_token": "<|image_pad|>",
    "video_token": "<|video_pad|>",
    "audio_bos_token": "<|audio_start|>",
    "audio_eos_token": "<|audio_end|>",
    "vision_bos_token": "<|vision_start|>",
    "vision_eos_token": "<|vision_end|>",
}

_CORPUS_WORDS = (
    "the quick brown fox jumps over the lazy dog while a small bird sings in the morning light "
    "hello world how are you today I am fine thank you please tell me a story about the sea "
    "streaming audio text speech model thinker talker voice sound music answer question system "
    "user assistant you are a helpful assistant what is the weather like it is sunny and warm "
    "numbers one two three four five six seven eight nine ten zero 0 1 2 3 4 5 6 7 8 9 "
    "punctuation , . ! ? ; : ' \" ( ) - caf\u00e9 na\u00efve \u00fcber \u4f60\u597d \U0001f600"
)


def _corpus() -> list[str]:
    turns = [
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n",
        "<|im_start|>user\nHello, how are you?<|im_end|>\n",
        "<|im_start|>assistant\nI am fine, thank you.<|im_end|>\n",
    ]
    words = _CORPUS_WORDS.split()
    lines = [" ".join(words[i : i + 12]) for i in range(0, len(words), 3)]
    return turns * 50 + lines * 20 + ["system user assistant"] * 100


def build_tokenizer(directory: Path) -> dict[str, int]:
    """Train a deterministic byte-level BPE and save it as a `PreTrainedTokenizerFast` directory."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=BPE_VOCAB,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    # The chat roles are single tokens in the real vocabulary; the talker finds turns by them.
    tok.add_tokens(["system", "user", "assistant"])
    # Pad the BPE part to a fixed size so the special ids never move.
    while tok.get_vocab_size() < BPE_VOCAB:
        tok.add_tokens([f"<|unused_{tok.get_vocab_size()}|>"])
    tok.add_special_tokens(SPECIAL_TOKENS)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in TOOL_TOKENS])
    fast = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]  # transformers: unannotated
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=SPECIAL_TOKENS[1:],
        **MEDIA_TOKENS,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(directory))
    # Every special token was just added: none is unknown (None).
    ids = cast(dict[str, int], {t: tok.token_to_id(t) for t in SPECIAL_TOKENS})
    for word in ("system", "user", "assistant"):
        encoded = tok.encode(word).ids
        if len(encoded) != 1:
            raise RuntimeError(f"tiny tokenizer must keep {word!r} as one token, got {encoded}")
        ids[word] = encoded[0]
    return ids
