"""`/v1/realtime`: OpenAI's Realtime API over a WebSocket (docs/realtime.md "Realtime voice").

events.py parses client events (their settings: settings.py; their items: client_items.py; the
field types they share: field_types.py), protocol.py names and shapes server events (GA and beta),
vad.py finds turns. One connection's state: session_config.py (its configuration; the settings a
session and a response share: shared_fields.py), input_buffer.py (the uncommitted input audio),
conversation.py (its items and history). turn.py builds a turn's request, response.py runs one
response (response_body.py: the response object the client sees), responder.py starts, refits and
ends them one at a time, input_audio.py keeps the input audio buffer and its turns, outbound.py
sends, connection.py dispatches one connection's events to them, server.py mounts it.
"""
