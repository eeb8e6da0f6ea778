// The Vercel AI SDK 7 (`ai` + `@ai-sdk/openai` 4, its Responses model) against the app.
//
//   node tests/js/ai_sdk_scenarios.mjs <scenario> <app base URL>
//
// Prints one JSON object on stdout: what the SDK returned, and every request it sent with the
// app's HTTP status (a custom `fetch` records them; an error body is kept). The process exits 0
// when the scenario ran to the end, 1 when the SDK threw (the JSON then holds the error).
// Scenarios, played by the scripted engine turns marked AISDK- in
// tests/fixtures/engine_script.yaml:
//   tool-loop, tool-loop-stream      generateText / streamText, a tool, stopWhen: stepCountIs(3)
//   chat                             two turns, the second from result.response.messages
//   reasoning-summary(-stream)       providerOptions.openai.reasoningSummary: 'auto' (with
//                                    forceReasoning: the SDK does not know gpt-oss reasons)
// All at the SDK's default `store: true`.

import { createOpenAI } from '@ai-sdk/openai';
import { generateText, stepCountIs, streamText, tool } from 'ai';
import { z } from 'zod';
import { recordingFetch, requests } from './recording_fetch.mjs';

const MODEL = 'gpt-oss-120b';
const [scenario, baseUrl] = process.argv.slice(2);
if (!scenario || !baseUrl) {
  console.error('usage: node ai_sdk_scenarios.mjs <scenario> <base URL>');
  process.exit(2);
}

const openai = createOpenAI({ baseURL: `${baseUrl}/v1`, apiKey: 'sk-test', fetch: recordingFetch });
const model = openai.responses(MODEL);

// The tool the scripted engine calls twice: a city's population, from a fixed table.
const POPULATIONS = { Lyon: 522000, Marseille: 873000 };
const toolCalls = [];
const tools = {
  city_population: tool({
    description: 'The population of a French city.',
    inputSchema: z.object({ city: z.string().describe('The city name') }),
    execute: async ({ city }) => {
      toolCalls.push({ city });
      return `AISDK-POPULATION ${city.toUpperCase()}: ${POPULATIONS[city] ?? 'unknown'}`;
    },
  }),
};
const TOOL_LOOP_PROMPT = 'AISDK-LOOP: which is larger, Lyon or Marseille?';

function summarizeSteps(steps) {
  return steps.map((step) => ({
    finishReason: step.finishReason,
    text: step.text,
    reasoningText: step.reasoningText ?? null,
    toolCalls: step.toolCalls.map((call) => ({ toolName: call.toolName, input: call.input })),
    toolResults: step.toolResults.map((result) => ({
      toolName: result.toolName,
      output: result.output,
    })),
    responseId: step.response?.id ?? null,
    inputTokens: step.usage?.inputTokens ?? null,
  }));
}

const scenarios = {
  async 'tool-loop'() {
    const result = await generateText({
      model,
      tools,
      stopWhen: stepCountIs(3),
      prompt: TOOL_LOOP_PROMPT,
    });
    return { text: result.text, steps: summarizeSteps(result.steps), toolCalls };
  },

  async 'tool-loop-stream'() {
    const result = streamText({
      model,
      tools,
      stopWhen: stepCountIs(3),
      prompt: TOOL_LOOP_PROMPT,
    });
    const partTypes = [];
    for await (const part of result.fullStream) {
      if (part.type === 'error') throw part.error;
      partTypes.push(part.type);
    }
    return {
      text: await result.text,
      steps: summarizeSteps(await result.steps),
      toolCalls,
      partTypes: [...new Set(partTypes)],
    };
  },

  async chat() {
    const messages = [{ role: 'user', content: 'AISDK-CHAT-1: my name is Ada.' }];
    const first = await generateText({ model, messages });
    const secondMessages = [
      ...messages,
      ...first.response.messages,
      { role: 'user', content: 'AISDK-CHAT-2: what is my name?' },
    ];
    const second = await generateText({ model, messages: secondMessages });
    return {
      texts: [first.text, second.text],
      responseIds: [first.response.id, second.response.id],
      inputTokens: [first.usage.inputTokens, second.usage.inputTokens],
      responseMessageRoles: first.response.messages.map((message) => message.role),
    };
  },

  // The SDK sends `reasoning` only to models it knows to reason (o-series, gpt-5 and later):
  // for gpt-oss it drops `reasoningSummary` with a warning unless `forceReasoning` is set.
  async 'reasoning-summary'() {
    const result = await generateText({
      model,
      prompt: 'AISDK-THINK: is 17 prime?',
      providerOptions: { openai: { reasoningSummary: 'auto', forceReasoning: true } },
    });
    return {
      text: result.text,
      reasoningText: result.reasoningText ?? null,
      reasoning: result.reasoning.map((part) => part.text),
      warnings: result.warnings ?? [],
    };
  },

  async 'reasoning-summary-stream'() {
    const result = streamText({
      model,
      prompt: 'AISDK-THINK: is 17 prime?',
      providerOptions: { openai: { reasoningSummary: 'auto', forceReasoning: true } },
    });
    let reasoningDeltas = '';
    const partTypes = [];
    for await (const part of result.fullStream) {
      if (part.type === 'error') throw part.error;
      if (part.type === 'reasoning-delta') reasoningDeltas += part.text;
      partTypes.push(part.type);
    }
    return {
      text: await result.text,
      reasoningText: (await result.reasoningText) ?? null,
      reasoningDeltas,
      partTypes: [...new Set(partTypes)],
      warnings: (await result.warnings) ?? [],
    };
  },
};

const run = scenarios[scenario];
if (!run) {
  console.error(`unknown scenario ${scenario}; known: ${Object.keys(scenarios).join(', ')}`);
  process.exit(2);
}
try {
  const result = await run();
  process.stdout.write(`${JSON.stringify({ scenario, ok: true, result, requests })}\n`);
} catch (error) {
  const failure = {
    name: error?.name,
    message: error?.message,
    statusCode: error?.statusCode ?? null,
    responseBody: error?.responseBody ?? null,
  };
  process.stdout.write(`${JSON.stringify({ scenario, ok: false, error: failure, toolCalls, requests })}\n`);
  process.exitCode = 1;
}
