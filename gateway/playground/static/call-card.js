// A function call's card in the transcript, from its realtime item (or its streamed arguments): kept
// apart from app.js (no DOM) so its text is checked under Node (tests/unit/gateway/playground).

/** The arguments as the card shows them: indented once they are whole JSON, as they came before. */
export function argumentsText(args) {
  const text = args ?? "";
  try {
    return JSON.stringify(JSON.parse(text), null, 2);
  } catch {
    return text;
  }
}

/** {title, name, body, plain} of a `function_call` or `function_call_output` item (null for any
 * other): `plain` is the one-line text the page's test hooks read. */
export function callCard(item) {
  if (item?.type === "function_call") {
    const body = argumentsText(item.arguments);
    return { title: "Function call", name: item.name ?? "", body, plain: `${item.name ?? ""}(${item.arguments ?? ""})` };
  }
  if (item?.type === "function_call_output") {
    const body = argumentsText(item.output);
    return { title: "Function result", name: item.call_id ?? "", body, plain: `→ ${item.output ?? ""}` };
  }
  return null;
}
