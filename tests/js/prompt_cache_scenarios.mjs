// The openai JS SDK reads `prompt_cache_diagnostics`: one baseline response, then a request
// per reason that changes only that one thing and names the baseline as
// `prompt_cache_options.comparison_response_id`; a hit, a comparison not found, and the
// diagnostics on a streamed response's events.
//
//   node tests/js/prompt_cache_scenarios.mjs <scenario> <app base URL>
//
// Prints one JSON object on stdout (as the other scenario scripts: what the SDK returned, every
// request it sent with the app's status). Scenarios:
//   reasons   each reason the app can show (model_changed needs a second deployment: the
//             Python in-process test; context_compacted after responses.compact), cache_hit,
//             comparison_response_not_found, and a stream
// The app test of the same: tests/app/test_prompt_cache_diagnostics.py.

import OpenAI from 'openai';
import { recordingFetch, playScenario } from './recording_fetch.mjs';

const MODEL = 'gpt-oss-120b';
const [scenario, baseUrl] = process.argv.slice(2);
if (!scenario || !baseUrl) {
  console.error('usage: node prompt_cache_scenarios.mjs <scenario> <base URL>');
  process.exit(2);
}

const client = new OpenAI({
  baseURL: `${baseUrl}/v1`,
  apiKey: 'sk-test',
  fetch: recordingFetch,
  maxRetries: 0,
});

const BASE = {
  model: MODEL,
  instructions: 'Answer briefly and precisely. '.repeat(40),
  input: 'What is prompt caching?',
  prompt_cache_key: 'js-diagnostics',
};
const TOOL = {
  type: 'function',
  name: 'get_time',
  description: 'The current time in a city.',
  parameters: { type: 'object', properties: { city: { type: 'string' } } },
  strict: false,
};
const SCHEMA = {
  type: 'json_schema',
  name: 'answer',
  schema: {
    type: 'object',
    properties: { text: { type: 'string' } },
    required: ['text'],
    additionalProperties: false,
  },
  strict: true,
};
// Each reason by the one change that makes it (OpenAI's order).
const CHANGES = {
  prompt_cache_key_changed: { prompt_cache_key: 'js-diagnostics-other' },
  tools_changed: { tools: [TOOL] },
  text_format_changed: { text: { format: SCHEMA } },
  reasoning_effort_changed: { reasoning: { effort: 'high' } },
  verbosity_changed: { text: { verbosity: 'low' } },
  input_changed: { input: 'What is a KV cache?' },
  service_tier_changed: { service_tier: 'flex' },
};

// The history tests/support/weather_history.py holds: compacted, it starts the prompt over.
const WEATHER = [{ type: 'function', name: 'get_weather', parameters: { type: 'object' }, strict: false }];
const HISTORY = [
  { role: 'user', content: 'What is the weather in Paris?' },
  { type: 'function_call', call_id: 'call_w', name: 'get_weather', arguments: '{"city": "Paris"}' },
  { type: 'function_call_output', call_id: 'call_w', output: 'OLD-TOOL-OUTPUT ' + 'sunny and warm, '.repeat(300) },
  { role: 'assistant', content: 'OLD-ANSWER: it is sunny.' },
];

async function compacted() {
  const baseline = await client.responses.create({ model: MODEL, input: HISTORY, tools: WEATHER });
  const summary = await client.responses.compact({ model: MODEL, input: HISTORY, tools: WEATHER });
  const resumed = await client.responses.create({
    model: MODEL,
    input: summary.output,
    tools: WEATHER,
    prompt_cache_options: { comparison_response_id: baseline.id },
  });
  return resumed.prompt_cache_diagnostics;
}

const compared = (id, changes = {}) =>
  client.responses.create({
    ...BASE,
    ...changes,
    prompt_cache_options: { comparison_response_id: id },
  });

const scenarios = {
  async reasons() {
    const baseline = await client.responses.create(BASE);
    const reasons = {};
    for (const [expected, changes] of Object.entries(CHANGES)) {
      const { prompt_cache_diagnostics: d, usage } = await compared(baseline.id, changes);
      reasons[expected] = {
        type: d?.type,
        reason: d?.reason,
        missed: d?.cache_missed_tokens,
        reusable: d?.comparison_reusable_tokens,
        input: usage.input_tokens,
      };
    }
    const hit = (await compared(baseline.id)).prompt_cache_diagnostics;
    const notFound = (await compared('resp_js_unknown')).prompt_cache_diagnostics;
    const stream = await client.responses.create({
      ...BASE,
      reasoning: { effort: 'low' },
      prompt_cache_options: { comparison_response_id: baseline.id },
      stream: true,
    });
    const streamed = [];
    for await (const event of stream) {
      if (event.response) {
        streamed.push([event.type, event.response.prompt_cache_diagnostics?.reason ?? null]);
      }
    }
    const compaction = await compacted();
    return {
      baselineTokens: baseline.usage.input_tokens,
      reasons,
      compaction,
      hit,
      notFound,
      streamed,
    };
  },
};

await playScenario(scenarios, scenario);
