"""A running request's stages moved to a sibling replica when theirs is lost (issue 62).

The chain (omnistream/chain/run.py) re-opens a thinker there with the answer so far, replays to an
audio stage what the lost replica was fed, and passes on only what comes after what the client has;
this decides whether there is a sibling to move to: only for a lost replica (its stage's link
broke: `Unavailable` naming the stage; the stage's own errors are the request's answer), at most
`limit` times a request, to a replica in rotation. The lost one leaves the rotation at once, so its
other requests and new ones go elsewhere; the request's replica list (what the session counts as
serving it) follows the move.
"""

from __future__ import annotations

import logging

from gateway.cluster.replica import Replica
from gateway.cluster.replicas import Replicas
from gateway.serving.metrics import GatewayMetrics
from gateway.serving.tracing import RequestSpan
from omnistream.request.errors import OmniError, Unavailable

log = logging.getLogger(__name__)


class Siblings:
    """One request's moves (GatewayCore gives one to each attempt's stage calls)."""

    def __init__(
        self,
        replicas: Replicas,
        serving: list[Replica],
        metrics: GatewayMetrics,
        span: RequestSpan,
        request_id: str,
        limit: int,
        kinds: frozenset[str] = frozenset(),
    ) -> None:
        """`serving`: the replicas the session counts as serving the request, updated in place;
        `kinds`: the media kinds a thinker it moves to must take."""
        self._replicas, self._serving, self._metrics = replicas, serving, metrics
        self._span, self._request_id, self._limit, self._kinds = span, request_id, limit, kinds
        self.moves = 0

    def take(self, stage: str, error: OmniError) -> Replica | None:
        """The sibling `stage` moves to after `error`, now counted as serving the request; None
        when it cannot move (then `error` is the request's answer)."""
        if error.kind != Unavailable.kind or error.stage != stage:
            return None
        lost = next(r for r in self._serving if r.stage == stage)
        self._replicas.mark_failed(lost)
        if self.moves >= self._limit:
            self._stays(stage, "limit", error)
            return None
        try:
            sibling = self._replicas.pick(stage, self._kinds if stage == "thinker" else frozenset())
        except Unavailable:
            self._stays(stage, "no_sibling", error)
            return None
        self.moves += 1
        self._serving[self._serving.index(lost)] = sibling
        lost.inflight -= 1
        sibling.inflight += 1
        sibling.served += 1
        self._metrics.resumes.labels(stage=stage, outcome="resumed").inc()
        self._span.resumed(stage, lost.address, sibling.address, error)
        log.warning(
            "request %s: %s; resuming on %s replica %s",
            self._request_id,
            error.message,
            stage,
            sibling.address,
        )
        return sibling

    def _stays(self, stage: str, outcome: str, error: OmniError) -> None:
        self._metrics.resumes.labels(stage=stage, outcome=outcome).inc()
        log.warning("request %s: %s; not resumed (%s)", self._request_id, error.message, outcome)

    def heard(self, stage: str, gap_s: float) -> None:
        """The moved request's output (audio; text for a thinker) went on `gap_s` seconds after the
        loss was seen."""
        self._metrics.resume_gap.labels(stage=stage).observe(gap_s)
        self._span.note({f"omnistream.resume.{stage}.gap": gap_s})
