"""`/v1/realtime`: OpenAI's Realtime API over a WebSocket (docs/realtime.md "Realtime voice").

events.py parses client events, protocol.py names and shapes server events (GA and beta), vad.py
finds turns, session.py holds one connection's state, turn.py builds a turn's request,
response.py runs one response, outbound.py sends, connection.py dispatches, server.py mounts it.
"""
