// `response.inject` (the Responses multi-agent beta) through the openai JS SDK's beta WebSocket
// client, `ResponsesWS` from 'openai/resources/beta/responses/ws', against the app: the model
// calls get_weather (the scripted turn SDK-TOOL of tests/fixtures/engine_script.yaml), the
// client injects the call's output into the waiting response, and the response goes on in
// place. Every message the server sent is printed as received (its JSON), for the Python test
// to validate with the openai Python SDK's beta and GA types.
//
//   node tests/js/inject_scenarios.mjs <scenario> <app base URL>
//
// Scenarios:
//   inject      with `OpenAI-Beta: responses_multi_agent=v1`: inject on the call's
//               output_item.done, then read to the terminal event; then inject again (too late)
//   no-beta     without the header: the response ends with its call; the inject is an error

import OpenAI from 'openai';
import { ResponsesWS } from 'openai/resources/beta/responses/ws';
import { playScenario } from './recording_fetch.mjs';

const MODEL = 'gpt-oss-120b';
const BETA = { 'OpenAI-Beta': 'responses_multi_agent=v1' };
const WEATHER_TOOL = {
  type: 'function',
  name: 'get_weather',
  strict: false,
  parameters: { type: 'object', properties: { city: { type: 'string' } } },
};
const [scenario, baseUrl] = process.argv.slice(2);
if (!scenario || !baseUrl) {
  console.error('usage: node inject_scenarios.mjs <scenario> <base URL>');
  process.exit(2);
}

const client = new OpenAI({ baseURL: `${baseUrl}/v1`, apiKey: 'sk-test', maxRetries: 0 });

// A socket whose every server message is kept as received, and a way to wait for one.
function open(headers) {
  const ws = new ResponsesWS(client, headers ? { headers } : {});
  const received = [];
  const waiters = [];
  // Each server message as the SDK parsed it (its JSON, untouched: the SDK does not coerce).
  ws.on('event', (event) => {
    const message = JSON.parse(JSON.stringify(event));
    received.push(message);
    for (const waiter of [...waiters]) {
      if (waiter.test(message)) {
        waiters.splice(waiters.indexOf(waiter), 1);
        waiter.resolve(message);
      }
    }
  });
  ws.on('error', () => {}); // a server `error` event comes as an `event` too
  const next = (test, seconds = 30) =>
    new Promise((resolve, reject) => {
      const found = received.find((message) => test(message) && !message.__taken);
      if (found) {
        found.__taken = true;
        resolve(found);
        return;
      }
      const timer = setTimeout(() => reject(new Error('timed out waiting')), seconds * 1000);
      waiters.push({
        test,
        resolve: (message) => {
          clearTimeout(timer);
          message.__taken = true;
          resolve(message);
        },
      });
    });
  return { ws, received, next };
}

const isTerminal = (m) =>
  ['response.completed', 'response.incomplete', 'response.failed'].includes(m.type);
const isCall = (m) => m.type === 'response.output_item.done' && m.item?.type === 'function_call';

function clean(received) {
  return received.map(({ __taken, ...message }) => message);
}

const scenarios = {
  async inject() {
    const { ws, received, next } = open(BETA);
    ws.send({ type: 'response.create', model: MODEL, input: 'SDK-TOOL: weather?', tools: [WEATHER_TOOL] });
    const call = await next(isCall);
    const created = received[0];
    const input = [
      { type: 'function_call_output', call_id: call.item.call_id, output: 'INJECTED-OUTPUT sunny' },
    ];
    ws.send({ type: 'response.inject', response_id: created.response.id, input });
    await next(isTerminal);
    ws.send({ type: 'response.inject', response_id: created.response.id, input });
    await next((m) => m.type === 'response.inject.failed');
    ws.close();
    return { messages: clean(received) };
  },
  async 'no-beta'() {
    const { ws, received, next } = open(null);
    ws.send({ type: 'response.create', model: MODEL, input: 'SDK-TOOL: weather?', tools: [WEATHER_TOOL] });
    const call = await next(isCall);
    await next(isTerminal);
    const input = [{ type: 'function_call_output', call_id: call.item.call_id, output: 'x' }];
    ws.send({ type: 'response.inject', response_id: received[0].response.id, input });
    await next((m) => m.type === 'error');
    ws.close();
    return { messages: clean(received) };
  },
};

await playScenario(scenarios, scenario);
