"""The web playground: one static page (no build step) that talks to /v1/realtime."""
