"""Size limits of the wire format, named once for every side that speaks it.

A gRPC channel or server refuses a message over its limit, and a stage's chunks, a thinker's
prompt and the gateway's replies all travel as single messages: the gateway, the stages and the
client must agree on the limit, so they all start from this one.
"""

from __future__ import annotations

# The largest gRPC message sent or received (grpc's own default is 4 MiB): room for a request's
# decoded media and prompt text in one ThinkerOpen (gateway/config.py checks its limits fit it).
MAX_MESSAGE_BYTES = 16 * 1024 * 1024
