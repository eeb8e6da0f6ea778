// The openai JS SDK sends `moderation` and reads `Response.moderation`: scores on both sides, an
// input blocked before any output, an output window blocked mid-stream, a classifier that
// fails (an error result), and a 400 naming the param. The app plays gpt-oss-safeguard with
// tests/fixtures/moderation_script.yaml (tests/clients/test_js_moderation.py starts it).
//
//   node tests/js/moderation_scenarios.mjs <scenario> <app base URL>
//
// Prints one JSON object on stdout (as the other scenario scripts): every Response and stream
// event exactly as the SDK returned it, which the Python test validates with the openai SDK's
// types. Scenarios:
//   moderation   the cases above

import OpenAI from 'openai';
import { recordingFetch, playScenario } from './recording_fetch.mjs';

const MODEL = 'gpt-oss-120b';
const CLASSIFIER = 'gpt-oss-safeguard-20b';
const [scenario, baseUrl] = process.argv.slice(2);
if (!scenario || !baseUrl) {
  console.error('usage: node moderation_scenarios.mjs <scenario> <base URL>');
  process.exit(2);
}

const client = new OpenAI({
  baseURL: `${baseUrl}/v1`,
  apiKey: 'sk-test',
  fetch: recordingFetch,
  maxRetries: 0,
});

const moderation = (input, output) => ({
  model: CLASSIFIER,
  policy: { input: { mode: input }, output: { mode: output } },
});

const scenarios = {
  async moderation() {
    const scored = await client.responses.create({
      model: MODEL,
      input: 'Say hello.',
      moderation: moderation('score', 'score'),
    });
    const inputBlocked = await client.responses.create({
      model: MODEL,
      input: 'MOD-VIOLENT: I will hurt him.',
      moderation: moderation('block', 'score'),
    });
    const stream = await client.responses.create({
      model: MODEL,
      input: 'TELL-VIOLENT',
      moderation: moderation('score', 'block'),
      stream: true,
    });
    const events = [];
    for await (const event of stream) events.push(event);
    const failed = await client.responses.create({
      model: MODEL,
      input: 'MOD-CRASH now',
      moderation: { model: CLASSIFIER },
    });
    let refused = null;
    try {
      await client.responses.create({
        model: MODEL,
        input: 'hi',
        moderation: { model: CLASSIFIER, policy: { input: { mode: 'warn' } } },
      });
    } catch (error) {
      refused = { status: error.status, param: error.param, type: error.type };
    }
    return {
      scored,
      inputBlocked,
      events,
      failed,
      refused,
      // Read as the SDK types them (Response.Moderation.ModerationResult | Error).
      read: {
        scoredInput: scored.moderation?.input.type,
        flagged: inputBlocked.moderation?.input.type === 'moderation_result'
          ? inputBlocked.moderation.input.flagged
          : null,
        reason: inputBlocked.incomplete_details?.reason,
        failedCode: failed.moderation?.input.type === 'error' ? failed.moderation.input.code : null,
      },
    };
  },
};

await playScenario(scenarios, scenario);
