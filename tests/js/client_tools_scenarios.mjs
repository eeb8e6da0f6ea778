// The Agents JS SDK's own client-run tools against the app: `shellTool` with a Shell that
// runs each command through bash in a temporary directory, `applyPatchTool` with an Editor
// that applies the V4A diff with the SDK's own `applyDiff`. The model's call comes back as a
// `shell_call` / `apply_patch_call`, the tool really runs, and the model's next turn reads its
// output (the scripted turns CLIENT-* of tests/fixtures/engine_script.yaml).
//
//   node tests/js/client_tools_scenarios.mjs <scenario> <app base URL>
//
// Prints one JSON object on stdout (what ran, the final output, every request sent with the
// app's status); exits 1 when the SDK threw. Scenarios:
//   shell         an agent with shellTool runs CLIENT-SHELL-TASK (chained by previousResponseId)
//   apply-patch   an agent with applyPatchTool runs CLIENT-PATCH-TASK (history resent)
//   unknown-tool  an agent with a function tool runs UNKNOWN-THEN-WEATHER: the model first
//                 calls `echo`, which the agent does not have; the app answers that call
//                 itself (the SDK, shown it, failed the run: "Tool echo not found"), the
//                 model then calls the agent's tool and answers

import { execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import {
  Agent,
  OpenAIResponsesModel,
  applyDiff,
  applyPatchTool,
  run,
  setTracingDisabled,
  shellTool,
  tool,
} from '@openai/agents';
import OpenAI from 'openai';
import { recordingFetch, playScenario } from './recording_fetch.mjs';

const MODEL = 'gpt-oss-120b';
const [scenario, baseUrl] = process.argv.slice(2);
if (!scenario || !baseUrl) {
  console.error('usage: node client_tools_scenarios.mjs <scenario> <base URL>');
  process.exit(2);
}
setTracingDisabled(true);

const client = new OpenAI({
  baseURL: `${baseUrl}/v1`,
  apiKey: 'sk-test',
  fetch: recordingFetch,
  maxRetries: 0,
});

function agent(tools) {
  return new Agent({
    name: 'coder',
    instructions: 'Work in the current directory with your tools.',
    model: new OpenAIResponsesModel(client, MODEL),
    tools,
  });
}

// A Shell running each command through bash in `folder`.
function shellIn(folder, ran) {
  return {
    async run(action) {
      const output = action.commands.map((command) => {
        ran.push(command);
        try {
          const stdout = execFileSync('bash', ['-c', command], { cwd: folder, encoding: 'utf8' });
          return { stdout, stderr: '', outcome: { type: 'exit', exitCode: 0 } };
        } catch (error) {
          const outcome = { type: 'exit', exitCode: error.status ?? 1 };
          return { stdout: String(error.stdout ?? ''), stderr: String(error.stderr ?? ''), outcome };
        }
      });
      return { output };
    },
  };
}

// An Editor on `folder`.
function editorIn(folder) {
  const done = { status: 'completed', output: 'patch-done-4711' };
  return {
    async createFile(operation) {
      writeFileSync(join(folder, operation.path), applyDiff('', operation.diff, 'create'));
      return done;
    },
    async updateFile(operation) {
      const path = join(folder, operation.path);
      writeFileSync(path, applyDiff(readFileSync(path, 'utf8'), operation.diff));
      return done;
    },
    async deleteFile(operation) {
      rmSync(join(folder, operation.path));
      return done;
    },
  };
}

const scenarios = {
  async shell() {
    const folder = mkdtempSync(join(tmpdir(), 'shell-'));
    const ran = [];
    const tool = shellTool({ shell: shellIn(folder, ran) });
    const first = await run(agent([tool]), 'CLIENT-SHELL-TASK');
    return {
      ran,
      file: readFileSync(join(folder, 'shell.txt'), 'utf8'),
      finalOutput: first.finalOutput,
      itemTypes: first.newItems.map((item) => item.rawItem?.type ?? item.type),
    };
  },
  async 'apply-patch'() {
    const folder = mkdtempSync(join(tmpdir(), 'patch-'));
    const tool = applyPatchTool({ editor: editorIn(folder) });
    const result = await run(agent([tool]), 'CLIENT-PATCH-TASK');
    return {
      file: readFileSync(join(folder, 'hello.txt'), 'utf8'),
      finalOutput: result.finalOutput,
      itemTypes: result.newItems.map((item) => item.rawItem?.type ?? item.type),
    };
  },
  async 'unknown-tool'() {
    const cities = [];
    // Not strict: a strict tool's grammar would leave the model no recipient but the agent's
    // own tools (constrained decoding), and the simulated engine holds its script to it.
    const weather = tool({
      name: 'get_weather',
      description: 'Current weather in a city.',
      parameters: {
        type: 'object',
        properties: { city: { type: 'string' } },
        required: ['city'],
        additionalProperties: false,
      },
      strict: false,
      async execute({ city }) {
        cities.push(city);
        return `WEATHER-RESULT: sunny in ${city}`;
      },
    });
    const result = await run(agent([weather]), 'UNKNOWN-THEN-WEATHER: weather in Paris?');
    return {
      cities,
      finalOutput: result.finalOutput,
      called: result.newItems
        .filter((item) => item.rawItem?.type === 'function_call')
        .map((item) => item.rawItem.name),
    };
  },
};

await playScenario(scenarios, scenario);
