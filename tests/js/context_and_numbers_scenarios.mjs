// JavaScript clients against the app: server-side compaction through the Agents JS
// SDK's `contextManagement` and the openai JS SDK's `context_management`, and I-JSON numbers
// through zod (the AI SDK's generateObject, the openai SDK's responses.parse).
//
//   node tests/js/context_and_numbers_scenarios.mjs <scenario> <app base URL>
//
// Prints one JSON object on stdout: what the SDK returned, and every request it sent with the
// app's HTTP status (a custom `fetch` records them). Exits 0 when the scenario ran to the end,
// 1 when the SDK threw (the JSON then holds the error). Scenarios:
//   agents-stateless   two Agents SDK runs at store: false, the second from result.history
//   agents-chained     two runs, the second by previousResponseId with only its new input
//   agents-compaction-session
//                      two runs on an OpenAIResponsesCompactionSession that compacts after
//                      each (responses.compact); the second sends the compacted history
//   openai-stream      openai SDK responses.create({stream: true, context_management})
//   numbers            many generateObject (AI SDK) and responses.parse (openai SDK, zod)
//                      answers under strict schemas with numbers: each parsed and validated
// The compaction scenarios are played by the scripted engine turns of
// tests/fixtures/engine_script.yaml ("Context compaction:" writes the summary; the summary as
// the newest message is answered "Resuming from the summary: Paris is sunny.").

import { createOpenAI } from '@ai-sdk/openai';
import {
  Agent,
  OpenAIResponsesCompactionSession,
  OpenAIResponsesModel,
  run,
  setTracingDisabled,
} from '@openai/agents';
import { generateObject } from 'ai';
import OpenAI from 'openai';
import { zodTextFormat } from 'openai/helpers/zod';
import { z } from 'zod';
import { recordingFetch, requests, playScenario } from './recording_fetch.mjs';

const MODEL = 'gpt-oss-120b';
const THRESHOLD = 1000;
const [scenario, baseUrl] = process.argv.slice(2);
if (!scenario || !baseUrl) {
  console.error('usage: node context_and_numbers_scenarios.mjs <scenario> <base URL>');
  process.exit(2);
}
setTracingDisabled(true);

const client = new OpenAI({
  baseURL: `${baseUrl}/v1`,
  apiKey: 'sk-test',
  fetch: recordingFetch,
  maxRetries: 0,
});

// Long enough to render past THRESHOLD tokens (about 1,300).
const LONG_INPUT = [
  { role: 'user', content: 'What is the weather in Paris?' },
  { role: 'user', content: 'OLD-TOOL-OUTPUT ' + 'sunny and warm, '.repeat(300) },
  { role: 'user', content: 'CM-ASK: and what should I wear?' },
];
const NEXT = { role: 'user', content: 'CM-NEXT: and tomorrow?' };

function agent(store) {
  return new Agent({
    name: 'weather',
    instructions: 'You answer questions about the weather.',
    model: new OpenAIResponsesModel(client, MODEL),
    modelSettings: {
      store,
      contextManagement: [{ type: 'compaction', compactThreshold: THRESHOLD }],
    },
  });
}

function outputTypes(result) {
  return result.output.map((item) => item.type);
}

const scenarios = {
  async 'agents-stateless'() {
    const weather = agent(false);
    const first = await run(weather, LONG_INPUT);
    const second = await run(weather, [...first.history, NEXT]);
    return {
      first: { output: outputTypes(first), finalOutput: first.finalOutput },
      second: { output: outputTypes(second), finalOutput: second.finalOutput },
    };
  },

  async 'agents-chained'() {
    const weather = agent(true);
    const first = await run(weather, LONG_INPUT);
    const second = await run(weather, [NEXT], { previousResponseId: first.lastResponseId });
    return {
      first: { output: outputTypes(first), finalOutput: first.finalOutput },
      second: { output: outputTypes(second), finalOutput: second.finalOutput },
    };
  },

  // The session compacts its history after every run (shouldTriggerCompaction: always) and
  // keeps what responses.compact returns: the user's messages and one compaction item.
  async 'agents-compaction-session'() {
    const session = new OpenAIResponsesCompactionSession({
      client,
      model: MODEL,
      shouldTriggerCompaction: () => true,
    });
    const weather = new Agent({
      name: 'weather',
      instructions: 'Answer weather questions.',
      model: new OpenAIResponsesModel(client, MODEL),
    });
    const kept = async () => (await session.getItems()).map((item) => item.type ?? item.role);
    const first = await run(weather, 'SDK-TEXT: is it sunny in Paris?', { session });
    const afterFirst = await kept();
    const second = await run(weather, 'SDK-REASON: and tomorrow?', { session });
    return {
      finalOutputs: [first.finalOutput, second.finalOutput],
      kept: [afterFirst, await kept()],
    };
  },

  async 'openai-stream'() {
    const stream = await client.responses.create({
      model: MODEL,
      input: LONG_INPUT,
      store: false,
      stream: true,
      context_management: [{ type: 'compaction', compact_threshold: THRESHOLD }],
    });
    const events = [];
    let final = null;
    for await (const event of stream) {
      events.push({
        type: event.type,
        output_index: event.output_index,
        item_type: event.item?.type,
        encrypted: event.item?.encrypted_content?.length ?? null,
      });
      if (event.type === 'response.completed') final = event.response;
    }
    return {
      events,
      output: final.output.map((item) => item.type),
      outputText: final.output_text,
    };
  },

  async numbers() {
    const count = Number(process.env.NUMBERS_ANSWERS ?? 40);
    const schema = z.object({
      age: z.number(),
      count: z.number().int(),
      scores: z.array(z.number()),
      point: z.object({ x: z.number().int(), y: z.number() }),
    });
    const aiSdk = createOpenAI({ baseURL: `${baseUrl}/v1`, apiKey: 'sk-test', fetch: recordingFetch });
    const objects = [];
    for (let index = 0; index < count; index += 1) {
      // generateObject validates with zod: a number JSON.parse reads as ±Infinity fails it.
      const { object } = await generateObject({
        model: aiSdk.responses(MODEL),
        schema,
        prompt: `IJSON numbers, please (AI SDK ${index}).`,
        providerOptions: { openai: { store: false, strictJsonSchema: true } },
      });
      objects.push(object);
      const parsed = await client.responses.parse({
        model: MODEL,
        input: `IJSON numbers, please (openai SDK ${index}).`,
        store: false,
        text: { format: zodTextFormat(schema, 'numbers') },
      });
      if (parsed.output_parsed === null) throw new Error(`no parsed output: ${parsed.output_text}`);
      objects.push(parsed.output_parsed);
    }
    const numbers = objects.flatMap((o) => [o.age, o.count, ...o.scores, o.point.x, o.point.y]);
    return {
      answers: objects.length,
      numbers: numbers.length,
      allFinite: numbers.every(Number.isFinite),
      integersSafe: objects.every((o) => Number.isSafeInteger(o.count) && Number.isSafeInteger(o.point.x)),
      strict: requests.every((r) => r.path !== '/v1/responses' || r.body.text?.format?.strict === true),
    };
  },
};

await playScenario(scenarios, scenario);
