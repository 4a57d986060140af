// Server-sent events read with fetch() and a stream reader: EventSource cannot send the
// Authorization header. Only what the API sends is handled: id, event, data, comments.

export interface SseEvent {
  id: string | null;
  event: string;
  data: string;
}

/** Reads the stream at ``url`` until it ends (resolves) or fails/aborts (rejects). */
export async function readEvents(
  url: string,
  headers: Record<string, string>,
  signal: AbortSignal,
  onEvent: (event: SseEvent) => void,
): Promise<void> {
  const reply = await fetch(url, {
    headers: { ...headers, Accept: 'text/event-stream' },
    cache: 'no-store',
    signal,
  });
  if (!reply.ok || !reply.body) throw new Error(`events: ${reply.status}`);
  const reader = reply.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = '';
  let id: string | null = null;
  let event = 'message';
  let data: string[] = [];
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value;
    const lines = buffer.split(/\r\n|\r|\n/);
    buffer = lines.pop() ?? ''; // an unfinished line waits for the next chunk
    for (const line of lines) {
      if (line === '') {
        if (data.length) onEvent({ id, event, data: data.join('\n') });
        event = 'message';
        data = [];
        continue;
      }
      if (line.startsWith(':')) continue; // keep-alive comment
      const colon = line.indexOf(':');
      const field = colon < 0 ? line : line.slice(0, colon);
      let text = colon < 0 ? '' : line.slice(colon + 1);
      if (text.startsWith(' ')) text = text.slice(1);
      if (field === 'id') id = text;
      else if (field === 'event') event = text;
      else if (field === 'data') data.push(text);
    }
  }
}
