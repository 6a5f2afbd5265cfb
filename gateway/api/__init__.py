"""The gateway's faces: the HTTP app (`app.py`: OpenAI's REST/SSE endpoints in `openai/`, the
probes) and the gRPC service (`grpc.py`); the realtime WebSocket is `gateway/realtime/`."""
