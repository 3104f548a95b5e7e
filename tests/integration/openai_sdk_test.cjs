// The official `openai` npm SDK against a local cluster's HTTP API
// (openai_sdk_test.sh starts it): models, chat (streamed and not, with
// log-probabilities), completions, tools (validation, a call, streamed, and
// its round trip), and the SDK's typed errors.
// usage: node openai_sdk_test.cjs OPENAI_MODULE_DIR BASE_URL API_KEY
'use strict';
const assert = require('node:assert/strict');
const [moduleDir, baseURL, apiKey] = process.argv.slice(2);
const OpenAI = require(moduleDir);

async function expectError(promise, Kind, status, check) {
  try {
    await promise;
  } catch (e) {
    assert.ok(e instanceof Kind, `${e} is not a ${Kind.name}`);
    assert.equal(e.status, status);
    if (check) check(e);
    return;
  }
  assert.fail(`no ${Kind.name}`);
}

async function main() {
  const client = new OpenAI({baseURL: `${baseURL}/v1`, apiKey, maxRetries: 0});
  const models = await client.models.list();
  assert.equal(models.data.length, 1);
  const model = models.data[0].id;

  const messages = [{role: 'system', content: 'Be brief.'}, {role: 'user', content: 'Hello!'}];
  const whole = await client.chat.completions.create(
      {model, messages, max_tokens: 10, temperature: 0, logprobs: true, top_logprobs: 3});
  const choice = whole.choices[0];
  assert.equal(choice.message.role, 'assistant');
  assert.equal(choice.logprobs.content.length, whole.usage.completion_tokens);
  assert.equal(choice.logprobs.content[0].top_logprobs.length, 3);

  const stream = await client.chat.completions.create(
      {model, messages, max_tokens: 10, temperature: 0, stream: true,
       stream_options: {include_usage: true}});
  let text = '';
  let usage = null;
  for await (const chunk of stream) {
    if (chunk.choices.length > 0) text += chunk.choices[0].delta.content ?? '';
    if (chunk.usage) usage = chunk.usage;
  }
  assert.equal(text, choice.message.content);
  assert.deepEqual(usage.completion_tokens, whole.usage.completion_tokens);

  const completion = await client.completions.create(
      {model, prompt: 'Once upon a time', max_tokens: 6, temperature: 0, ignore_eos: true});
  assert.equal(completion.usage.completion_tokens, 6);
  assert.equal(completion.choices[0].finish_reason, 'length');

  await expectError(client.completions.create({model: 'gpt-4o', prompt: 'x'}), OpenAI.NotFoundError,
                    404, (e) => assert.equal(e.code, 'model_not_found'));
  // n = 2 sibling choices, sampled, each token with its own log-probability.
  const two = await client.chat.completions.create(
      {model, messages, max_tokens: 5, temperature: 1, seed: 4, n: 2, logprobs: true,
       ignore_eos: true});
  assert.deepEqual(two.choices.map((c) => c.index), [0, 1]);
  assert.equal(two.usage.completion_tokens, 10);
  for (const c of two.choices) {
    assert.equal(c.logprobs.content.length, 5);
    for (const t of c.logprobs.content) assert.ok(t.logprob <= 0, JSON.stringify(t));
  }
  await expectError(client.chat.completions.create({model, messages, n: 17}),
                    OpenAI.BadRequestError, 400, (e) => assert.equal(e.param, 'n'));
  // Tools: typed 400s naming the field; tool_choice "none" answers in text; a
  // named tool_choice makes a call (streamed too), and the call with its
  // result goes back as history for the answer (the tiny model's template is
  // DeepSeek-V3's, tool branches included).
  const tools = [{type: 'function', function: {name: 'get_weather', description: 'Weather',
                                                parameters: {type: 'object', properties: {}}}}];
  await expectError(client.chat.completions.create({model, messages, tools: [{type: 'function'}]}),
                    OpenAI.BadRequestError, 400, (e) => assert.equal(e.param, 'tools[0].function'));
  await expectError(
      client.chat.completions.create(
          {model, messages, tools, tool_choice: {type: 'function', function: {name: 'nope'}}}),
      OpenAI.BadRequestError, 400, (e) => assert.equal(e.param, 'tool_choice.function.name'));
  const plain = await client.chat.completions.create(
      {model, messages, tools, tool_choice: 'none', max_tokens: 3, ignore_eos: true});
  assert.equal(plain.choices[0].finish_reason, 'length');
  assert.equal(plain.choices[0].message.tool_calls, undefined);
  const named = {type: 'function', function: {name: 'get_weather'}};
  const called = await client.chat.completions.create(
      {model, messages, tools, tool_choice: named, max_tokens: 6, ignore_eos: true, temperature: 0});
  const call = called.choices[0].message;
  assert.equal(call.tool_calls.length, 1, JSON.stringify(call));
  assert.equal(call.tool_calls[0].function.name, 'get_weather');
  assert.equal(typeof call.tool_calls[0].function.arguments, 'string');
  const streamed = await client.chat.completions.create(
      {model, messages, tools, tool_choice: named, max_tokens: 6, ignore_eos: true, temperature: 0,
       stream: true});
  let name = '';
  let args = '';
  for await (const chunk of streamed) {
    for (const t of chunk.choices[0]?.delta?.tool_calls ?? []) {
      name += t.function?.name ?? '';
      args += t.function?.arguments ?? '';
    }
  }
  assert.equal(name, 'get_weather');
  assert.equal(args, call.tool_calls[0].function.arguments);  // greedy: the same call
  const answer = await client.chat.completions.create(
      {model, tools, max_tokens: 4, ignore_eos: true, temperature: 0,
       messages: [...messages, call,
                  {role: 'tool', tool_call_id: call.tool_calls[0].id, content: '21 C'}]});
  assert.equal(answer.choices[0].message.role, 'assistant');
  assert.equal(answer.usage.completion_tokens, 4);
  const stranger = new OpenAI({baseURL: `${baseURL}/v1`, apiKey: 'sk-wrong', maxRetries: 0});
  await expectError(stranger.models.list(), OpenAI.AuthenticationError, 401);
  console.log('openai SDK: OK');
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
