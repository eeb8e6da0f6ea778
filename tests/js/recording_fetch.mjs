// The `fetch` every scenario script gives its client: it records each request the client sends
// (method, path, JSON body) with the app's HTTP status, and the body of an error answer, so the
// script can print what was sent beside what the SDK returned.

export const requests = [];

export async function recordingFetch(url, init) {
  const entry = { method: init?.method ?? 'GET', path: new URL(url).pathname };
  if (typeof init?.body === 'string') entry.body = JSON.parse(init.body);
  requests.push(entry);
  const response = await fetch(url, init);
  entry.status = response.status;
  if (!response.ok) entry.error = await response.clone().text();
  return response;
}

// Plays `scenarios[name]` and prints one JSON line: `{ok, result, requests}`, or `{ok: false,
// error, requests}` (exit 1); an unknown name exits 2. The Python test reads that line.
export async function playScenario(scenarios, name) {
  const play = scenarios[name];
  if (!play) {
    console.error(`unknown scenario: ${name}`);
    process.exit(2);
  }
  try {
    const result = await play();
    console.log(JSON.stringify({ ok: true, result, requests }));
  } catch (error) {
    console.log(
      JSON.stringify({
        ok: false,
        error: { name: error?.name, message: String(error?.message ?? error), stack: error?.stack },
        requests,
      }),
    );
    process.exit(1);
  }
}
