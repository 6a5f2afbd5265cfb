// The turn panel's cells for one answer, from response.done's `omnistream` fields: kept apart from
// app.js (no DOM, no audio) so their text is checked under Node (tests/unit/gateway/playground).

/** A millisecond number as the panel shows it; "–" when the gateway had none. */
export function formatMs(value) {
  return typeof value === "number" ? `${Math.round(value)} ms` : "–";
}

/** What a listener heard (omnistream/audio/listener.py): "none", or how many stalls and their total;
 * "–" for an answer without audio. */
export function stallText(omni) {
  if (typeof omni.stalls !== "number") return "–";
  if (omni.stalls === 0) return "none";
  return `${omni.stalls} · ${formatMs(omni.stall_ms)}`;
}

/** The stall cell's tooltip: the underrun (vLLM-Omni's audio_underrun), the longest stall and
 * whether continuity held; "" without audio. */
export function stallTitle(omni) {
  if (typeof omni.stalls !== "number") return "";
  const kept = omni.continuity_ok ? "continuity kept" : "continuity lost";
  return `underrun ${formatMs(omni.underrun_ms)}, longest stall ${formatMs(omni.longest_stall_ms)}: ${kept}`;
}

/** One row: turn, status, TTFT, first audio, RTF, stalls, replicas (a list of lines). */
export function turnCells(turn, status, omni) {
  const replicas = Object.entries(omni.replicas ?? {}).map(([stage, replica]) => `${stage} ${replica ?? "–"}`);
  const rtf = typeof omni.rtf === "number" ? omni.rtf.toFixed(2) : "–";
  return [String(turn), status, formatMs(omni.ttft_ms), formatMs(omni.ttfa_ms), rtf, stallText(omni), replicas];
}
