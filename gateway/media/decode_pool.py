"""Decoding a request's media off the event loop, bounded in threads, time and bytes.

One request's media decode as one job in a small thread pool (FFmpeg and Pillow release the GIL
while they work, so the event loop keeps serving other requests). The pool has `decode_workers`
threads and as many slots; a request waits for a slot at most `decode_timeout`, behind a bounded
number of others (else 429 with Retry-After: the gateway is busy decoding, try again), and its decode
then gets `decode_timeout` of wall-clock time (then 422). A slot is freed only when its thread has
really finished, so a file that outlives its deadline still counts against the pool until the
decoder's own deadline checks stop it: the pool's bound holds, and other requests are never
starved by threads they cannot see.

URLs (only under the operator's `media_url_prefixes`) are fetched here too: http(s) with an async
client, `url_timeout` per URL in all and the byte limit counted as the body arrives; file:// in the
worker thread.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import unquote, urlsplit

import httpx

from gateway.admission.permits import Rejected
from gateway.media.file_decode import Deadline, decode_audio, decode_image, decode_video
from gateway.media.limits import MediaLimits, Tally
from gateway.media.parts import EncodedMedia, pending
from omnistream.request.errors import InvalidRequest, TooLarge
from omnistream.request.media import Media

# Requests that may wait for a decoding slot, per worker; more are refused at once (429).
MAX_WAITING_PER_WORKER = 8
RETRY_AFTER = 1  # seconds, the Retry-After of a refusal for a busy decoder


class MediaDecoder:
    def __init__(self, limits: MediaLimits, http_transport: httpx.AsyncBaseTransport | None = None) -> None:
        limits.validate()
        self.limits = limits
        self._transport = http_transport  # tests: a mock server
        self._pool = ThreadPoolExecutor(limits.decode_workers, thread_name_prefix="media-decode")
        self._slots = asyncio.Semaphore(limits.decode_workers)
        self._waiting = 0

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    async def decode(self, messages: list[dict[str, Any]] | None, use_audio_in_video: bool) -> int:
        """Replace every `EncodedMedia` in `messages` by its decoded media, in place; returns the
        decoded bytes (for the stage message's size check). Raises the 4xx error naming the field."""
        found = pending(messages)
        if not found:
            return 0
        items = [item for _, item in found]
        self._check_encoded(items)
        fetched = await self._fetch_http(items)
        await self._acquire_slot()
        deadline = Deadline(self.limits.decode_timeout)  # the decode's own: queueing is not decoding
        loop = asyncio.get_running_loop()
        try:
            future = loop.run_in_executor(self._pool, self._decode_all, fetched, use_audio_in_video, deadline)
        except BaseException:
            self._slots.release()
            raise
        future.add_done_callback(lambda _: self._slots.release())
        try:
            # The thread stops itself at the deadline; the extra second only covers a decoder stuck
            # inside one FFmpeg call, which then keeps its slot until it returns.
            decoded, size = await asyncio.wait_for(asyncio.shield(future), self.limits.decode_timeout + 1.0)
        except TimeoutError:
            raise InvalidRequest(
                f"the media took over {self.limits.decode_timeout:g} s to decode "
                "(the gateway's media_decode_timeout)",
                field=items[0].field,
            ) from None
        for (part, _), media in zip(found, decoded, strict=True):
            part[part["type"]] = media
        return size

    def check_audio(self, encoded_bytes: int, samples: int, field: str) -> None:
        """Audio decoded elsewhere (a realtime turn, resampled as it arrived: gateway/realtime/
        turn_resampler.py), `samples` at 16 kHz from `encoded_bytes` of input, against the limits
        its decode here would have kept, with the same errors."""
        if encoded_bytes > self.limits.max_media_bytes:
            raise _too_many_bytes(self.limits, field)
        Tally(self.limits).add_audio(samples, field)
        if not samples:
            raise InvalidRequest("the audio is empty (no samples)", field=field)

    async def _acquire_slot(self) -> None:
        """A decoding slot, waiting at most `decode_timeout` behind at most `MAX_WAITING_PER_WORKER`
        requests per worker; else 429 (the gateway is busy decoding, not the request at fault)."""
        if self._waiting >= MAX_WAITING_PER_WORKER * self.limits.decode_workers:
            raise _busy()
        self._waiting += 1
        try:
            async with asyncio.timeout(self.limits.decode_timeout):
                await self._slots.acquire()
        except TimeoutError:
            raise Rejected(
                "the gateway is busy decoding media; try again", "media_busy", RETRY_AFTER
            ) from None
        finally:
            self._waiting -= 1

    def _check_encoded(self, items: Sequence[EncodedMedia]) -> None:
        """Before any work: the encoded sizes given so far (base64 estimated) against the limit."""
        total = 0
        for count, item in enumerate(items, 1):
            total += item.encoded_size()
            if total - 2 * count > self.limits.max_media_bytes:  # base64 padding: up to 2 bytes each
                raise _too_many_bytes(self.limits, item.field)

    async def _fetch_http(self, items: list[EncodedMedia]) -> list[EncodedMedia]:
        remote = [i for i in items if i.url and urlsplit(i.url).scheme.lower() in ("http", "https")]
        if not remote:
            return items
        budget = self.limits.max_media_bytes - sum(i.encoded_size() for i in items)
        out = list(items)
        timeout = httpx.Timeout(self.limits.url_timeout)
        client = httpx.AsyncClient(timeout=timeout, follow_redirects=False, transport=self._transport)
        async with client:
            for index, item in enumerate(items):
                if item not in remote:
                    continue
                data, mime = await _get(client, item, budget, self.limits)
                budget -= len(data)
                out[index] = EncodedMedia(item.kind, mime, item.field, data=data)
        return out

    def _decode_all(
        self, items: list[EncodedMedia], use_audio_in_video: bool, deadline: Deadline
    ) -> tuple[list[Media], int]:
        """In a worker thread: bytes of each item, then its media; every limit counted as we go."""
        tally = Tally(self.limits)
        encoded = 0
        decoded: list[Media] = []
        for item in items:
            data = self._bytes_of(item, self.limits.max_media_bytes - encoded)
            encoded += len(data)
            if encoded > self.limits.max_media_bytes:
                raise _too_many_bytes(self.limits, item.field)
            if not data:
                raise InvalidRequest(f"the {item.kind} is empty (zero bytes)", field=item.field)
            deadline.check(item.field)
            if item.kind == "audio":
                decoded.append(decode_audio(data, item.mime, item.field, tally, deadline))
            elif item.kind == "image":
                decoded.append(decode_image(data, item.mime, item.field, tally, self.limits))
            else:
                decoded.append(
                    decode_video(
                        data, item.mime, item.field, tally, self.limits, deadline, use_audio_in_video
                    )
                )
        return decoded, tally.decoded_bytes

    @staticmethod
    def _bytes_of(item: EncodedMedia, budget: int) -> bytes:
        if item.data is not None:
            return item.data
        if item.base64 is not None:
            try:
                # Line breaks (MIME-style base64) are fine; any other non-alphabet character is not.
                return base64.b64decode("".join(item.base64.split()), validate=True)
            except (binascii.Error, ValueError):
                raise InvalidRequest("the data is not valid base64", field=item.field) from None
        assert item.url is not None
        return _read_file(item, budget)


def _busy() -> Rejected:
    return Rejected("the gateway is busy decoding media; try again", "media_busy", RETRY_AFTER)


def _too_many_bytes(limits: MediaLimits, field: str) -> TooLarge:
    return TooLarge(
        f"the request's media are over {limits.max_media_bytes} bytes (the gateway's max_media_bytes)",
        field=field,
    )


async def _get(
    client: httpx.AsyncClient, item: EncodedMedia, budget: int, limits: MediaLimits
) -> tuple[bytes, str]:
    """One URL's body, at most `budget` bytes, within `url_timeout` in all (httpx's own timeout
    bounds each read, not a server that drips bytes)."""
    assert item.url is not None
    chunks: list[bytes] = []
    size = 0
    try:
        async with asyncio.timeout(limits.url_timeout):
            async with client.stream("GET", item.url) as response:
                if response.status_code != 200:
                    raise InvalidRequest(
                        f"fetching the URL answered HTTP {response.status_code}", field=item.field
                    )
                async for chunk in response.aiter_bytes():
                    size += len(chunk)
                    if size > budget:
                        raise _too_many_bytes(limits, item.field)
                    chunks.append(chunk)
                mime = response.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    except TimeoutError:
        raise InvalidRequest("fetching the URL timed out", field=item.field) from None
    except httpx.HTTPError as exc:
        raise InvalidRequest(f"fetching the URL failed ({type(exc).__name__})", field=item.field) from None
    if not mime.startswith(item.kind + "/"):
        mime = ""  # application/octet-stream and the like: let the decoder sniff
    return b"".join(chunks), mime


def _read_file(item: EncodedMedia, budget: int) -> bytes:
    """A file:// URL (already checked against the allowed prefixes), at most `budget` bytes."""
    assert item.url is not None
    path = unquote(urlsplit(item.url).path)
    try:
        with open(path, "rb") as file:
            if not os.path.isfile(path):
                raise InvalidRequest("the URL is not a regular file", field=item.field)
            data = file.read(budget + 1)
    except OSError as exc:
        raise InvalidRequest(f"the file cannot be read ({exc.strerror})", field=item.field) from None
    return data
