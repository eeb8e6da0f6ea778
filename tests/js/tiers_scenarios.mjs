// The openai JS SDK and service tiers (issue 49): every value its `ServiceTier` type names is
// accepted, and the tier a response was served at is in the Response, in every stream event's
// response and in the stored one; a tier the key may not use is the SDK's BadRequestError.
//
//   node tests/js/tiers_scenarios.mjs <scenario> <app base URL>
//
// The key is SERVE_APP_KEY; the values to send are SERVE_APP_TIERS (a JSON list: the Python test
// reads them from this SDK's own `ServiceTier` type, resources/responses/responses.d.ts).
// Prints one JSON object on stdout (as the other scenario scripts: what the SDK returned, every
// request it sent with the app's status). Scenarios:
//   tiers     per value: the created Response, the stream's events, the retrieved Response
//   refused   SERVE_APP_TIERS' first value, which the key may not use: the error the SDK threw
// The test: tests/clients/test_js_tiers.py.

import OpenAI from 'openai';
import { recordingFetch, playScenario } from './recording_fetch.mjs';

const MODEL = 'gpt-oss-120b';
const [scenario, baseUrl] = process.argv.slice(2);
if (!scenario || !baseUrl) {
  console.error('usage: node tiers_scenarios.mjs <scenario> <base URL>');
  process.exit(2);
}

const client = new OpenAI({
  baseURL: `${baseUrl}/v1`,
  apiKey: process.env.SERVE_APP_KEY ?? 'sk-test',
  fetch: recordingFetch,
  maxRetries: 0,
});
const TIERS = JSON.parse(process.env.SERVE_APP_TIERS ?? '[]');

const scenarios = {
  async tiers() {
    const served = {};
    for (const tier of TIERS) {
      const created = await client.responses.create({ model: MODEL, input: 'hi', service_tier: tier });
      const stream = await client.responses.create({
        model: MODEL,
        input: 'hi',
        service_tier: tier,
        stream: true,
      });
      const events = [];
      for await (const event of stream) events.push(event);
      const retrieved = await client.responses.retrieve(created.id);
      served[tier] = { created, events, retrieved };
    }
    return served;
  },
  async refused() {
    try {
      await client.responses.create({ model: MODEL, input: 'hi', service_tier: TIERS[0] });
    } catch (error) {
      if (error instanceof OpenAI.BadRequestError) {
        return { status: error.status, param: error.param, code: error.code, message: error.message };
      }
      throw error;
    }
    throw new Error(`service_tier ${TIERS[0]} was served`);
  },
};

await playScenario(scenarios, scenario);
