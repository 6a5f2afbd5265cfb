"""The multipart form of `POST /v1/audio/transcriptions`, as openai-python sends it: `file`, the
scalar fields, lists as `name[]` (one part per item), an object as `name[key]` parts.

Every refusal is a 400 (`InvalidValue`, as OpenAI answers a bad transcription request) naming the
field: no file or two, a text field where the file goes (or a file elsewhere), an unknown field,
one given twice, a value of the wrong type or out of range, `word` timestamps and `include[]`
(the model gives neither word timings nor log-probs), a stream of a verbose_json, srt or vtt
transcript. `chunking_strategy` (`auto`, a `server_vad` object) is checked and then ignored.
"""

from __future__ import annotations

import json
import posixpath
from typing import Annotated, Any, Literal

from fastapi import Request
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.datastructures import FormData, UploadFile
from starlette.exceptions import HTTPException

from gateway.api.openai.request_guards import BodyTooLarge
from gateway.api.openai.transcript_formats import RESPONSE_FORMATS, ResponseFormat
from gateway.media.file_decode import AUDIO_DEMUXERS
from gateway.media.parts import INPUT_AUDIO_FORMATS
from gateway.serving.transcription import check_language
from omnistream.request.errors import InvalidValue

LIST_FIELDS = ("timestamp_granularities", "include")
# OpenAI's fields for its other transcription models (gpt-transcribe, diarization): refused by name.
NOT_SUPPORTED = ("keywords", "languages", "known_speaker_names", "known_speaker_references")
# File extensions -> MIME type, for a file sent without an audio/* Content-Type.
EXTENSIONS = {**INPUT_AUDIO_FORMATS, "mpeg": "audio/mpeg", "mpga": "audio/mpeg", "oga": "audio/ogg"}


class ServerVad(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["server_vad"]
    prefix_padding_ms: int | None = Field(None, ge=0)
    silence_duration_ms: int | None = Field(None, ge=0)
    threshold: float | None = Field(None, ge=0.0, le=1.0)


class TranscriptionForm(BaseModel):
    """The fields but `file` and `chunking_strategy`. Lax types: form values are strings."""

    model_config = ConfigDict(extra="forbid")
    model: Annotated[str, Field(min_length=1, max_length=256)]
    language: str | None = None
    prompt: str | None = None
    response_format: ResponseFormat = "json"
    temperature: float = Field(0.0, ge=0.0, le=1.0)
    timestamp_granularities: list[Literal["segment", "word"]] = []
    include: list[Literal["logprobs"]] = []
    stream: bool = False


def _refused(exc: ValidationError, prefix: str | None = None) -> InvalidValue:
    first = exc.errors()[0]
    names = [str(p) for p in first["loc"] if isinstance(p, str)]
    param = ".".join([prefix, *names] if prefix else names) or prefix
    return InvalidValue(f"{param}: {first['msg']}", field=param)


def _check_chunking(value: Any) -> None:
    """`auto` or a `server_vad` object (as `chunking_strategy[key]` parts, or one JSON part)."""
    if isinstance(value, str) and value.lstrip().startswith("{"):
        try:
            value = json.loads(value)
        except ValueError:
            raise InvalidValue("chunking_strategy: not valid JSON", field="chunking_strategy") from None
    if isinstance(value, dict):
        try:
            ServerVad.model_validate(value)
        except ValidationError as exc:
            raise _refused(exc, "chunking_strategy") from None
    elif value != "auto":
        raise InvalidValue("chunking_strategy: 'auto' or a server_vad object", field="chunking_strategy")


def _collected(form: FormData) -> tuple[list[UploadFile], dict[str, Any]]:
    """The uploads and the other fields by name (lists and the chunking object put together)."""
    values: dict[str, Any] = {}
    uploads: list[UploadFile] = []
    for key, value in form.multi_items():
        name, bracket, sub = key.partition("[")
        if isinstance(value, UploadFile):
            if name != "file" or bracket:
                raise InvalidValue(f"{name}: must be a text field, not a file", field=name)
            uploads.append(value)
        elif name == "file":
            raise InvalidValue("file: must be a file upload (a part with a filename)", field="file")
        elif name in NOT_SUPPORTED:
            raise InvalidValue(f"{name}: not supported by this model", field=name)
        elif name in LIST_FIELDS and sub in ("", "]"):
            values.setdefault(name, []).append(value)
        elif name == "chunking_strategy" and sub.endswith("]") and sub != "]":
            nested = values.setdefault(name, {})
            if not isinstance(nested, dict):
                raise InvalidValue(f"{name}: given more than once", field=name)
            nested[sub[:-1]] = value
        elif bracket or name not in {"chunking_strategy", *TranscriptionForm.model_fields}:
            raise InvalidValue(f"{key}: unknown field", field=key)
        elif name in values:
            raise InvalidValue(f"{name}: given more than once", field=name)
        else:
            values[name] = value
    return uploads, values


def parse_form(form: FormData) -> tuple[UploadFile, TranscriptionForm]:
    """The upload and the validated fields, or the 400 naming the first field at fault."""
    uploads, values = _collected(form)
    if len(uploads) != 1:
        message = (
            "file: give one file"
            if uploads
            else "file: required (the audio file to transcribe, a multipart/form-data part)"
        )
        raise InvalidValue(message, field="file")
    if "chunking_strategy" in values:
        _check_chunking(values.pop("chunking_strategy"))
    try:
        fields = TranscriptionForm.model_validate(values)
    except ValidationError as exc:
        raise _refused(exc) from None
    if "word" in fields.timestamp_granularities:
        raise InvalidValue(
            "timestamp_granularities: word timestamps are not available (the model gives no timings; "
            "segment is)",
            field="timestamp_granularities",
        )
    if fields.include:
        raise InvalidValue("include: logprobs are not available from this model", field="include")
    if fields.stream and fields.response_format not in ("json", "text"):
        raise InvalidValue(
            f"stream: a {fields.response_format} transcript is not streamed (json and text are)",
            field="stream",
        )
    check_language(fields.language, "language")
    return uploads[0], fields


def audio_mime(content_type: str | None, filename: str | None) -> str:
    """The file's audio/* type when the decoder knows it, else its extension's, else "" (the
    decoder sniffs the format, then checks that it is one it takes)."""
    mime = (content_type or "").split(";", 1)[0].strip().lower()
    if mime in AUDIO_DEMUXERS:
        return mime
    return EXTENSIONS.get(posixpath.splitext(filename or "")[1].lstrip(".").lower(), "")


async def read_form(request: Request) -> tuple[bytes, str, TranscriptionForm]:
    """The file's bytes, its MIME type ("": sniffed) and the fields, from the multipart body."""
    content_type = request.headers.get("content-type", "").lower()
    if not content_type.startswith(("multipart/form-data", "application/x-www-form-urlencoded")):
        raise InvalidValue(
            "file: the body must be multipart/form-data, the audio file in `file`", field="file"
        )
    try:
        form = await request.form(max_files=4, max_fields=64)
    except BodyTooLarge:
        raise
    except HTTPException as exc:  # the multipart parser's refusal of a malformed body
        raise InvalidValue(f"the multipart body cannot be read: {exc.detail}") from None
    try:
        upload, fields = parse_form(form)
        return await upload.read(), audio_mime(upload.content_type, upload.filename), fields
    finally:
        await form.close()


# The form in /openapi.json (the route reads the body itself, so FastAPI cannot describe it).
OPENAPI_BODY = {
    "requestBody": {
        "required": True,
        "content": {
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "required": ["file", "model"],
                    "properties": {
                        "file": {
                            "type": "string",
                            "format": "binary",
                            "description": "wav, mp3, flac, ogg, webm, m4a, mp4 or aac (media limits apply)",
                        },
                        "model": {
                            "type": "string",
                            "minLength": 1,
                            "maxLength": 256,
                            "description": "Any name (whisper-1, gpt-4o-transcribe, ...): the one model",
                        },
                        "language": {"type": "string", "description": "An ISO-639 code, e.g. en"},
                        "prompt": {"type": "string", "description": "Context: spelling, style, text before"},
                        "response_format": {
                            "type": "string",
                            "enum": list(RESPONSE_FORMATS),
                            "default": "json",
                        },
                        "temperature": {
                            "type": "number",
                            "minimum": 0,
                            "maximum": 1,
                            "description": "Accepted, not used: the transcription is greedy",
                        },
                        "timestamp_granularities[]": {
                            "type": "array",
                            "items": {"type": "string", "enum": ["segment"]},
                        },
                        "stream": {"type": "boolean", "default": False, "description": "json and text only"},
                        "chunking_strategy": {"type": "string", "enum": ["auto"], "description": "Ignored"},
                    },
                }
            }
        },
    }
}
