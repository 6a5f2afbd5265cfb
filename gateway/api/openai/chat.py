"""`POST /v1/chat/completions` (OpenAI's chat completions, with audio): the request body, what it
becomes (a `GenerationRequest` through the one defaults table), and the endpoint's router.

The two shapes of the answer (an SSE stream of chunks, or one completion) are `chat_responses.py`;
the app that mounts this router is `gateway/api/app.py`.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError

from gateway.api.openai.chat_responses import complete, sse_stream
from gateway.api.openai.errors import COMMON_RESPONSES, ErrorResponse, unavailable
from gateway.api.openai.messages import ChatMessage, Message, Name, UnknownRoleMessage, turn
from gateway.api.openai.request_guards import first_invalid_unicode, printable
from gateway.api.openai.sse import SessionStream
from gateway.api.openai.voices import speaker_for
from gateway.serving.core import GatewayCore
from gateway.serving.tracing import http_entry
from gateway.tools.history import check_tool_results
from gateway.tools.spec import Function, Named, ToolUse, response_format_output, tool_use
from omnistream.request.defaults import DEFAULTS, RequestInput, ServingDefaults, resolve
from omnistream.request.generation import GenerationRequest

# Unknown fields are refused, and no type is coerced ("stream": "yes", "max_tokens": "12", 0 for
# false): as OpenAI's API does, and as the published JSON schema says (an integer is still a number).
STRICT = ConfigDict(extra="forbid", strict=True)


class FunctionParam(BaseModel):
    model_config = STRICT
    name: str = Field(
        pattern=r"^[a-zA-Z0-9_-]{1,64}$", description="1 to 64 letters, digits, underscores or dashes."
    )
    description: str | None = None
    parameters: dict[str, Any] | None = Field(
        None, description="A JSON schema of the arguments; absent: the function takes none."
    )
    strict: bool | None = Field(None, description="Accepted: arguments always follow the schema exactly.")


class ToolParam(BaseModel):
    model_config = STRICT
    type: Literal["function"]
    function: FunctionParam


class NamedFunction(BaseModel):
    model_config = STRICT
    name: str


class NamedToolChoice(BaseModel):
    model_config = STRICT
    type: Literal["function"]
    function: NamedFunction


class JsonSchemaFormat(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)
    name: Annotated[str, Field(pattern=r"^[a-zA-Z0-9_-]{1,64}$")]
    description: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class ResponseFormatText(BaseModel):
    model_config = STRICT
    type: Literal["text"]


class ResponseFormatJsonObject(BaseModel):
    model_config = STRICT
    type: Literal["json_object"]


class ResponseFormatJsonSchema(BaseModel):
    model_config = STRICT
    type: Literal["json_schema"]
    json_schema: JsonSchemaFormat


ResponseFormat = Annotated[
    ResponseFormatText | ResponseFormatJsonObject | ResponseFormatJsonSchema, Field(discriminator="type")
]


class AudioOptions(BaseModel):
    model_config = STRICT
    voice: Name | None = Field(
        None,
        description="One of the model's speakers (e.g. ethan, chelsie, aiden), or an OpenAI voice name "
        "(its nearest speaker); default: the model's default voice (ethan on Qwen3-Omni).",
    )
    format: Literal["wav", "pcm16"] = Field(
        "wav",
        description="wav: a WAV file (streamed: header in the first chunk); "
        "pcm16: raw 16-bit LE 24 kHz mono.",
    )


class StreamOptions(BaseModel):
    model_config = STRICT
    include_usage: bool = True


class ChatCompletionRequest(BaseModel):
    """The OpenAI chat-completions request, plus omnistream's own knobs (marked as extensions)."""

    model_config = STRICT
    model: Name | None = None
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    modalities: list[Literal["text", "audio"]] = Field(["text", "audio"], min_length=1)
    audio: AudioOptions | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(
        None, ge=0.0, le=2.0, description=f"Default {DEFAULTS.temperature}; 0 = greedy."
    )
    top_p: float | None = Field(None, gt=0.0, le=1.0, description=f"Default {DEFAULTS.top_p}.")
    seed: int | None = Field(
        None, ge=0, lt=2**63, description="Seeds the text and (unless talker_seed) the voice."
    )
    n: int | None = Field(None, ge=1, le=1)
    user: Name | None = None
    tools: list[ToolParam] | None = Field(None, description="Functions the model may call.")
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = Field(
        None,
        description="auto (the default with tools): the model decides; none: no call (the tools are "
        "left out of the prompt); required: only calls, at least one; a named function: one call of it. "
        "required and a named function are enforced by grammar-constrained decoding.",
    )
    parallel_tool_calls: bool | None = Field(
        None, description="Default true: with required, one or more calls; false: one."
    )
    response_format: ResponseFormat | None = Field(
        None,
        description="json_schema and json_object answers are enforced by grammar-constrained decoding "
        "and are text only (`content`; no audio is made).",
    )
    # extensions
    speaker: Name | None = Field(None, description="Extension: same as audio.voice.")
    initial_codec_chunk_frames: int | None = Field(
        None,
        ge=1,
        le=25,
        description="Extension: frames in the first audio chunk (default: chosen from load).",
    )
    codec_chunk_schedule: Literal["grow", "fixed"] | None = Field(
        None,
        description=f"Extension: how audio chunks after the first are sized (default "
        f"{DEFAULTS.codec_chunk_schedule}: each twice the last, up to the codec chunk frames, so the "
        "next one arrives before the audio sent has played; fixed: all the codec chunk frames).",
    )
    ignore_eos: bool = Field(False, description="Extension: generate exactly max_tokens (benchmarks).")
    transcript_in_content: bool = Field(
        False,
        description="Extension: with audio, also send the text as `content` (OpenAI sends it only as "
        "the audio's transcript, with content null).",
    )
    max_audio_frames: int | None = Field(
        None, ge=1, description="Extension: at most this many 80 ms codec frames."
    )
    talker_temperature: float | None = Field(
        None,
        ge=0.0,
        le=2.0,
        description=f"Extension: default {DEFAULTS.talker_temperature}; 0 = greedy voice.",
    )
    talker_top_k: int | None = Field(
        None, ge=0, description=f"Extension: default {DEFAULTS.talker_top_k}; 0 = off."
    )
    talker_top_p: float | None = Field(
        None, gt=0.0, le=1.0, description=f"Extension: default {DEFAULTS.talker_top_p}."
    )
    talker_repetition_penalty: float | None = Field(
        None, gt=0.0, le=10.0, description=f"Extension: default {DEFAULTS.talker_repetition_penalty}."
    )
    talker_seed: int | None = Field(None, ge=0, lt=2**63, description="Extension: default `seed`.")
    async_chunk: bool | None = Field(
        None, description="Extension: stream stage to stage (default: gateway's)."
    )
    timeout: float | None = Field(
        None, gt=0.0, description="Extension: seconds before the request ends with 504."
    )
    use_audio_in_video: bool | None = Field(
        None,
        description=f"Extension: also hear the sound of video_url parts "
        f"(default {DEFAULTS.use_audio_in_video}).",
    )
    cache_salt: str | None = Field(
        None,
        min_length=1,
        max_length=256,
        description="Extension (vLLM): requests with the same salt share cached prompt prefixes "
        "with each other only (none: every request shares with any other of the same content).",
    )

    @model_validator(mode="before")
    @classmethod
    def _valid_unicode_everywhere(cls, data: Any) -> Any:
        """Refuse a lone surrogate anywhere in the body (values and keys) with a 422 naming its path.

        JSON may escape one ("\\ud800") and Python decodes it, but it cannot be encoded as UTF-8, so
        it would fail later: building the stage's protobuf message, or writing the SSE stream. One
        walk over the raw body covers every field, present and future.
        """
        path = first_invalid_unicode(data)
        if path is None:
            return data
        error = PydanticCustomError("invalid_unicode", "string is not valid Unicode (a lone surrogate)")
        loc = tuple(printable(p) if isinstance(p, str) else p for p in path)  # the bad one may be a key
        raise ValidationError.from_exception_data(
            cls.__name__, [InitErrorDetails(type=error, loc=loc, input="(not valid Unicode)")]
        )


def to_tool_use(body: ChatCompletionRequest) -> ToolUse:
    """What the body's tools, tool_choice, parallel_tool_calls and response_format mean for the
    answer (gateway/tools/spec.py: the prompt's tools, the grammar, whether calls are parsed)."""
    functions = [
        Function(
            t.function.name,
            t.function.description,
            t.function.parameters,
            t.function.strict,
            f"tools.{i}.function",
        )
        for i, t in enumerate(body.tools or ())
    ]
    choice = body.tool_choice
    mode = Named(choice.function.name) if isinstance(choice, NamedToolChoice) else choice or "auto"
    fmt = body.response_format
    output = None
    if fmt is not None:
        schema = fmt.json_schema.schema_ if isinstance(fmt, ResponseFormatJsonSchema) else None
        output = response_format_output(fmt.type, schema)
    return tool_use(functions, mode, body.parallel_tool_calls is not False, output)


def _known_role(message: ChatMessage) -> Message:
    """A message of a validated body: an `UnknownRoleMessage` never validates (its role fails)."""
    assert not isinstance(message, UnknownRoleMessage), "a message of unknown role passed validation"
    return message


def to_request_input(
    body: ChatCompletionRequest, url_prefixes: tuple[str, ...] = (), tools: ToolUse | None = None
) -> RequestInput:
    """The body as given: every field the client left out stays None, for `resolve` to fill in.
    Media parts stay encoded (`EncodedMedia`); `GatewayCore.open` decodes them before admission.
    `tools`: the body's tool use (`to_tool_use`); a JSON answer is text only."""
    audio = body.audio
    messages = [turn(_known_role(m), i, url_prefixes) for i, m in enumerate(body.messages)]
    check_tool_results(messages)
    tools = tools or ToolUse()
    structured = tools.structured_output
    json_answer = structured is not None and structured.kind != "structural_tag"
    return RequestInput(
        messages=messages,
        tools=tools.prompt_tools(),
        structured_output=structured,
        max_tokens=body.max_completion_tokens or body.max_tokens,
        ignore_eos=body.ignore_eos,
        temperature=body.temperature,
        top_p=body.top_p,
        seed=body.seed,
        return_audio="audio" in body.modalities and not json_answer,
        voice=body.speaker or (audio.voice if audio else None),
        max_audio_frames=body.max_audio_frames,
        talker_temperature=body.talker_temperature,
        talker_top_p=body.talker_top_p,
        talker_top_k=body.talker_top_k,
        talker_repetition_penalty=body.talker_repetition_penalty,
        talker_seed=body.talker_seed,
        initial_codec_chunk_frames=body.initial_codec_chunk_frames,
        codec_chunk_schedule=body.codec_chunk_schedule,
        async_chunk=body.async_chunk,
        use_audio_in_video=body.use_audio_in_video,
        cache_salt=body.cache_salt,
    )


def to_generation_request(
    body: ChatCompletionRequest, core: GatewayCore
) -> tuple[GenerationRequest, str, ToolUse]:
    """The request the body asks for, defaults from the one table (`omnistream.request.defaults`),
    and its tool use (how the answer's text is read)."""
    audio_format = body.audio.format if body.audio else "wav"
    serving = ServingDefaults.of(core.config, core.deployment.voices, core.deployment.default_voice)
    tools = to_tool_use(body)
    given = to_request_input(body, tuple(core.config.media_url_prefixes), tools)
    if given.voice is not None:  # an OpenAI voice name: the model's nearest voice, as /v1/audio/speech
        given = dataclasses.replace(given, voice=speaker_for(given.voice, serving.voices, serving.voice))
    return resolve(given, serving), audio_format, tools


RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "A chat.completion; with stream=true an SSE stream of chat.completion.chunk",
        "content": {"text/event-stream": {}},
    },
    401: {"model": ErrorResponse, "description": "Missing or wrong API key (when one is set)"},
    413: {
        "model": ErrorResponse,
        "description": "Body over max_request_bytes, prompt over max_prompt_chars, or media over "
        "a media limit (bytes, seconds, pixels)",
    },
    400: {
        "model": ErrorResponse,
        "description": "Tools, tool_choice, response_format or messages that do not hold together: "
        "parameters that are not a JSON schema, tool_choice naming no given function, a tool message "
        "answering no call, a grammar too large or failing to compile (`param` names the field)",
    },
    422: {
        "model": ErrorResponse,
        "description": "Invalid request, or media that are corrupt, unsupported, empty or of "
        "another type than declared (`param` names the field)",
    },
    **COMMON_RESPONSES,
}


def router(core: GatewayCore) -> APIRouter:
    """The endpoint over `core`: it opens a session (everything that can refuse the request runs
    before the status line), then answers with an SSE stream or one completion."""
    api = APIRouter()

    @api.post("/v1/chat/completions", summary="Chat completion with text and audio", responses=RESPONSES)
    async def chat_completions(body: ChatCompletionRequest, http_request: Request) -> Response:
        if not core.ready:
            raise unavailable()
        request, audio_format, tools = to_generation_request(body, core)
        trace = http_entry("POST", "/v1/chat/completions", http_request.headers)
        session = await core.open(request, timeout=body.timeout, trace=trace)
        completion_id = f"chatcmpl-{session.request_id}"
        created = int(time.time())
        model = body.model or core.deployment.model_id or ""
        if body.stream:
            include_usage = body.stream_options.include_usage if body.stream_options else True
            stream = sse_stream(
                session,
                completion_id,
                created,
                model,
                audio_format if request.return_audio else None,
                include_usage,
                body.transcript_in_content,
                tools,
            )
            return SessionStream(
                session,
                stream,
                media_type="text/event-stream",
                headers={"Cache-Control": "no-cache", "X-Request-Id": session.request_id},
            )
        return await complete(
            session,
            completion_id,
            created,
            model,
            audio_format,
            request.return_audio,
            core.deployment.sample_rate or 0,
            body.transcript_in_content,
            tools,
        )

    return api
