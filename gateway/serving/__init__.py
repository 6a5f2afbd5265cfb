"""One request through the gateway, whatever face it came in by: `core` admits it and picks its
replicas, `stage_calls` runs the three stage streams, `session` hands its events to the face, and
`metrics` records what the client saw."""
