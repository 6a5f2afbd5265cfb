// A small client of the gateway's /v1/realtime WebSocket (OpenAI Realtime API, GA event names).
//
// Browsers cannot set an Authorization header on a WebSocket, so the API key travels as the
// `openai-insecure-api-key.<key>` subprotocol, next to `realtime`, as OpenAI's browser clients do.

let counter = 0;

export class RealtimeConnection {
  /**
   * @param {string} url ws(s)://host/v1/realtime?model=...
   * @param {string} apiKey empty when the gateway has none
   * @param {{onEvent: (event: object) => void, onClose: (info: {code: number, reason: string, opened: boolean}) => void}} hooks
   */
  constructor(url, apiKey, hooks) {
    this.hooks = hooks;
    this.opened = false;
    const protocols = ["realtime"];
    if (apiKey) protocols.push(`openai-insecure-api-key.${apiKey}`);
    this.socket = new WebSocket(url, protocols);
    this.ready = new Promise((resolve, reject) => {
      this.socket.addEventListener("open", () => {
        this.opened = true;
        resolve();
      });
      this.socket.addEventListener("close", (event) => {
        if (!this.opened) reject(new Error(closeReason(event)));
      });
    });
    this.ready.catch(() => {}); // a refused connection is reported through `ready` or onClose
    this.socket.addEventListener("message", (event) => this.onMessage(event));
    this.socket.addEventListener("close", (event) =>
      this.hooks.onClose({ code: event.code, reason: event.reason, opened: this.opened }),
    );
  }

  onMessage(event) {
    if (typeof event.data !== "string") return; // the protocol is JSON text frames only
    let parsed;
    try {
      parsed = JSON.parse(event.data);
    } catch {
      return;
    }
    this.hooks.onEvent(parsed);
  }

  /** Send a client event; returns its event_id (error events name it). */
  send(event) {
    if (this.socket.readyState !== WebSocket.OPEN) return null;
    const eventId = event.event_id ?? `evt_pg_${Date.now().toString(36)}_${++counter}`;
    this.socket.send(JSON.stringify({ ...event, event_id: eventId }));
    return eventId;
  }

  close() {
    if (this.socket.readyState <= WebSocket.OPEN) this.socket.close(1000, "client closed");
  }
}

function closeReason(event) {
  if (event.reason) return event.reason;
  if (event.code === 1006) return "the gateway refused the connection (wrong API key, or no /v1/realtime?)";
  return `connection closed (code ${event.code})`;
}
