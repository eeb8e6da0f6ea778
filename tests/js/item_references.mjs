// The Vercel AI SDK's tool loop against the app (tests/test_item_references.py runs it):
// with `store: true`, its default, the step after a tool call sends the earlier reasoning and
// tool call back as item references. Prints the answer and each request's input as JSON.
//
//   node tests/js/item_references.mjs http://127.0.0.1:8000/v1
import { createOpenAI } from "@ai-sdk/openai";
import { generateText, stepCountIs, tool } from "ai";
import { z } from "zod";

const inputs = [];
const provider = createOpenAI({
  baseURL: process.argv[2],
  apiKey: "sk-test",
  fetch: async (url, init) => {
    inputs.push(JSON.parse(init.body).input);
    return fetch(url, init);
  },
});
const result = await generateText({
  model: provider.responses("gpt-oss-120b"),
  prompt: "REF-TOOL: weather in Rome?",
  tools: {
    get_weather: tool({
      description: "Current weather in a city.",
      inputSchema: z.object({ city: z.string() }),
      execute: async ({ city }) => `REF-RESULT: rainy in ${city}`,
    }),
  },
  stopWhen: stepCountIs(3),
});
console.log(JSON.stringify({ text: result.text, steps: result.steps.length, inputs }));
