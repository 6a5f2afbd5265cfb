"""`/v1/realtime`: OpenAI's Realtime API over a WebSocket (docs/realtime.md "Realtime voice").

events.py parses client events, protocol.py names and shapes server events (GA and beta), vad.py
finds turns, session.py holds one connection's state, turn.py builds a turn's request,
response.py runs one response, responder.py starts, refits and ends them one at a time,
input_audio.py keeps the input audio buffer and its turns, outbound.py sends, connection.py
dispatches one connection's events to them, server.py mounts it.
"""
