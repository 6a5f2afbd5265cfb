"""The stage replicas the gateway routes to: where they are (`discovery`), which are healthy and
least loaded (`replicas`), what model they serve together (`deployment`) and what can be served
with them now (`readiness`)."""
