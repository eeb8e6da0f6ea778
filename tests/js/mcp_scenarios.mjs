// The Agents JS SDK's hosted MCP tool against the app (tests/clients/test_js_mcp.py).
//
//   MCP_SERVER_URL=http://127.0.0.1:PORT/mcp node tests/js/mcp_scenarios.mjs <scenario> <app base URL>
//
// Prints one JSON object on stdout: what the SDK returned, and every request it sent with the
// app's HTTP status. Exits 0 when the scenario ran to the end, 1 when the SDK threw.
// Scenarios:
//   agents-approval   hostedMcpTool({requireApproval: 'always', onApproval}) approves the call
//                     the model asks for; the SDK sends the approval, the app runs the call
//   agents-denial     the same, denied: the model is told and answers without the call
// Played by the scripted engine turns "MCP-ECHO-TASK", "MCP-ECHOED-7" and "denied this tool
// call" of tests/fixtures/engine_script.yaml.

import { Agent, OpenAIResponsesModel, hostedMcpTool, run, setTracingDisabled } from '@openai/agents';
import OpenAI from 'openai';
import { recordingFetch, requests } from './recording_fetch.mjs';

const MODEL = 'gpt-oss-120b';
const [scenario, baseUrl] = process.argv.slice(2);
const serverUrl = process.env.MCP_SERVER_URL;
if (!scenario || !baseUrl || !serverUrl) {
  console.error('usage: MCP_SERVER_URL=... node mcp_scenarios.mjs <scenario> <base URL>');
  process.exit(2);
}
setTracingDisabled(true);

const client = new OpenAI({
  baseURL: `${baseUrl}/v1`,
  apiKey: 'sk-test',
  fetch: recordingFetch,
  maxRetries: 0,
});

async function approvalRun(approve) {
  const asked = [];
  const agent = new Agent({
    name: 'docs',
    instructions: 'Use the docs server.',
    model: new OpenAIResponsesModel(client, MODEL),
    tools: [
      hostedMcpTool({
        serverLabel: 'docs',
        serverUrl,
        requireApproval: 'always',
        onApproval: async (_context, item) => {
          const raw = item.rawItem;
          const data = raw.providerData ?? {};
          asked.push({ name: data.name ?? raw.name, arguments: data.arguments ?? raw.arguments ?? null, label: data.server_label ?? null });
          return approve ? { approve: true } : { approve: false, reason: 'not today' };
        },
      }),
    ],
  });
  const result = await run(agent, 'MCP-ECHO-TASK');
  return {
    asked,
    finalOutput: result.finalOutput,
    outputs: result.rawResponses.map((response) => response.output.map((item) => item.type ?? null)),
    calls: result.rawResponses.flatMap((response) =>
      response.output
        .filter((item) => item.type === 'hosted_tool_call')
        .map((item) => ({ type: item.providerData?.type ?? item.name, output: item.output ?? item.providerData?.output ?? null })),
    ),
  };
}

const scenarios = {
  'agents-approval': () => approvalRun(true),
  'agents-denial': () => approvalRun(false),
};

try {
  const result = await scenarios[scenario]();
  console.log(JSON.stringify({ ok: true, result, requests }));
} catch (error) {
  console.log(JSON.stringify({ ok: false, error: { message: String(error?.message ?? error), stack: error?.stack }, requests }));
  process.exit(1);
}
