// `swiftcpp deploy` tested with the real OpenAI client (npm openai@6.49.0) on loopback, against `swiftcpp infer`
// on the same model. Run by ctest (DeployClient); exits 77 (skipped) with the reason when node_modules are absent.
//   SWIFTCPP_BIN=build/bin/swiftcpp node tests/client/deploy.test.mjs
import { spawn, spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, readdirSync, writeFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, dirname } from 'node:path';
import { fileURLToPath } from 'node:url';
import assert from 'node:assert/strict';

const here = dirname(fileURLToPath(import.meta.url));
const root = join(here, '..', '..');
let OpenAI;
try {
  ({ default: OpenAI } = await import('openai'));
} catch (e) {
  console.log(`SKIP: the npm package openai is not installed in tests/client (scripts/setup.sh runs npm ci there): ${e.message}`);
  process.exit(77);
}
const bin = process.env.SWIFTCPP_BIN || join(root, 'build', 'bin', 'swiftcpp');
const model = join(root, 'models', 'stories260K');
const threads = process.env.SWIFTCPP_TEST_THREADS || '1';
const key = 'sk-test-key';
const work = mkdtempSync(join(tmpdir(), 'swiftcpp-deploy-'));
const results = [];

async function check(name, fn) {
  const t0 = Date.now();
  try {
    await fn();
    results.push([name, 'ok', Date.now() - t0]);
    console.log(`ok   ${name} (${Date.now() - t0} ms)`);
  } catch (e) {
    results.push([name, 'FAIL', Date.now() - t0]);
    console.log(`FAIL ${name}: ${e.stack || e}`);
  }
}

// Starts `swiftcpp deploy` on a free port; resolves once /health says 200.
const children = [];
process.on('exit', () => { for (const c of children) if (c.exitCode === null) c.kill('SIGKILL'); });
async function startServer(args, modelDir = model) {
  const child = spawn(bin, ['--threads', threads, 'deploy', '--model', modelDir, '--port', '0', ...args],
                      { stdio: ['ignore', 'ignore', 'pipe'] });
  children.push(child);
  let log = '';
  const port = await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`no port after 30 s:\n${log}`)), 30000);
    child.stderr.on('data', (d) => {
      log += d.toString();
      const m = log.match(/listening on http:\/\/[^:]+:(\d+)/);
      if (m) { clearTimeout(timer); resolve(Number(m[1])); }
    });
    child.on('exit', (code) => reject(new Error(`deploy exited with ${code}:\n${log}`)));
  });
  const base = `http://127.0.0.1:${port}`;
  const statuses = new Set();
  for (let i = 0; i < 600; i++) {
    const r = await fetch(`${base}/health`).catch(() => null);
    if (r) statuses.add(r.status);
    if (r && r.status === 200) break;
    await new Promise((res) => setTimeout(res, 50));
  }
  return { child, port, base, statuses, log: () => log };
}

function infer(args) {
  const r = spawnSync(bin, ['--threads', threads, 'infer', '--model', model, ...args], { encoding: 'utf8' });
  if (r.status !== 0) throw new Error(`infer failed (${r.status}): ${r.stderr}`);
  return r;
}

// A safetensors file's tensors as Float32Array (F32) with shapes.
function readSafetensors(path) {
  const buf = readFileSync(path);
  const n = Number(buf.readBigUInt64LE(0));
  const header = JSON.parse(buf.subarray(8, 8 + n).toString('utf8'));
  const out = {};
  for (const [name, t] of Object.entries(header)) {
    if (name === '__metadata__') continue;
    const [a, b] = t.data_offsets;
    const bytes = buf.subarray(8 + n + a, 8 + n + b);
    const copy = Buffer.from(bytes);
    out[name] = { shape: t.shape, dtype: t.dtype,
                  data: t.dtype === 'F32' ? new Float32Array(copy.buffer, copy.byteOffset, (b - a) / 4)
                                          : new BigInt64Array(copy.buffer, copy.byteOffset, (b - a) / 8) };
  }
  return out;
}

function logSoftmax(row) {
  let max = -Infinity;
  for (const x of row) max = Math.max(max, x);
  let sum = 0;
  for (const x of row) sum += Math.exp(x - max);
  const lse = max + Math.log(sum);
  return Array.from(row, (x) => x - lse);
}

const proc = (pid, what) => readFileSync(`/proc/${pid}/${what}`, 'utf8');
const rssKiB = (pid) => Number(proc(pid, 'status').match(/VmRSS:\s+(\d+)/)[1]);
const fdCount = (pid) => readdirSync(`/proc/${pid}/fd`).length;
const threadCount = (pid) => readdirSync(`/proc/${pid}/task`).length;

const server = await startServer(['--template', 'chatml', '--parallel', '2', '--max-queue', '8', '--api-key', key,
                                  '--served-model-name', 'stories']);
const client = new OpenAI({ baseURL: `${server.base}/v1`, apiKey: key, maxRetries: 0 });
const prompts = ['Once upon a time', 'The cat sat', 'Lily went to the park', 'Tom had a red ball', 'The sun was hot',
                 'A little dog', 'Mom said', 'They played all day'];
const chat = (text, extra = {}) => client.chat.completions.create({
  model: 'stories', messages: [{ role: 'user', content: text }], temperature: 0, max_tokens: 40, ...extra });

await check('health answers 200 once loaded (503 before, when seen)', async () => {
  assert.ok(server.statuses.has(200));
  for (const s of server.statuses) assert.ok(s === 200 || s === 503, `unexpected /health status ${s}`);
});

await check('models.list names the served model', async () => {
  const list = await client.models.list();
  assert.deepEqual(list.data.map((m) => m.id), ['stories']);
  assert.equal(list.data[0].object, 'model');
});

await check('greedy chat equals swiftcpp infer byte for byte, with its usage counts', async () => {
  const rows = prompts.slice(0, 3).map((p) => JSON.stringify({ messages: [{ role: 'user', content: p }] })).join('\n');
  writeFileSync(join(work, 'prompts.jsonl'), rows + '\n');
  infer(['--template', 'chatml', '--prompts-file', join(work, 'prompts.jsonl'), '--output', join(work, 'out.jsonl'),
         '--temperature', '0', '--max-new-tokens', '40']);
  const expected = readFileSync(join(work, 'out.jsonl'), 'utf8').trim().split('\n').map((l) => JSON.parse(l));
  for (let i = 0; i < 3; i++) {
    const r = await chat(prompts[i]);
    assert.equal(r.object, 'chat.completion');
    assert.equal(r.choices[0].message.role, 'assistant');
    assert.equal(r.choices[0].message.content, expected[i].response, prompts[i]);
    assert.equal(r.usage.prompt_tokens, expected[i].prompt_tokens);
    assert.equal(r.usage.completion_tokens, expected[i].completion_tokens);
    assert.equal(r.usage.total_tokens, expected[i].prompt_tokens + expected[i].completion_tokens);
    assert.equal(r.choices[0].finish_reason, expected[i].finish_reason === 'length' ? 'length' : 'stop');
  }
});

await check('streamed text equals the whole response; role first, usage and [DONE] last', async () => {
  const whole = await chat(prompts[0], { max_tokens: 60 });
  const stream = await chat(prompts[0], { max_tokens: 60, stream: true, stream_options: { include_usage: true } });
  const chunks = [];
  for await (const c of stream) chunks.push(c);
  assert.equal(chunks[0].choices[0].delta.role, 'assistant');
  const text = chunks.flatMap((c) => c.choices.map((ch) => ch.delta.content || '')).join('');
  assert.equal(text, whole.choices[0].message.content);
  const last = chunks[chunks.length - 1];
  assert.deepEqual(last.choices, []);
  assert.deepEqual(last.usage, whole.usage);
  assert.equal(chunks[chunks.length - 2].choices[0].finish_reason, whole.choices[0].finish_reason);
  // The raw stream ends with [DONE].
  const raw = await fetch(`${server.base}/v1/chat/completions`, {
    method: 'POST', headers: { 'Content-Type': 'application/json', Authorization: `Bearer ${key}` },
    body: JSON.stringify({ messages: [{ role: 'user', content: prompts[0] }], temperature: 0, max_tokens: 10, stream: true }) });
  assert.equal(raw.headers.get('content-type').split(';')[0], 'text/event-stream');
  const body = await raw.text();
  assert.ok(body.endsWith('data: [DONE]\n\n'), body.slice(-80));
});

await check('a stop string straddling two tokens never leaks into a streamed delta', async () => {
  // Each streamed delta of a greedy run is one token's text: a stop made of the end of one and the start of the
  // next straddles them.
  const deltas0 = [];
  for await (const c of await chat(prompts[1], { max_tokens: 60, stream: true })) {
    if (c.choices[0]?.delta?.content) deltas0.push(c.choices[0].delta.content);
  }
  const full = deltas0.join('');
  let stop = null, at = -1;
  for (let k = 0, pos = 0; k + 1 < deltas0.length; pos += deltas0[k].length, k++) {
    const a = deltas0[k], b = deltas0[k + 1];
    for (const [na, nb] of [[2, 2], [2, 1], [1, 2], [1, 1]]) {
      if (a.length < na || b.length < nb) continue;
      const candidate = a.slice(-na) + b.slice(0, nb);
      if (candidate.trim().length < candidate.length) continue;  // no spaces: a clearer case
      if (full.indexOf(candidate) === pos + a.length - na) { stop = candidate; at = full.indexOf(candidate); break; }
    }
    if (stop) break;
  }
  assert.ok(stop, `no straddling pair in ${JSON.stringify(deltas0)}`);
  const cut = full.slice(0, at);
  const deltas = [];
  let finish = null;
  for await (const c of await chat(prompts[1], { max_tokens: 60, stop: [stop], stream: true })) {
    for (const ch of c.choices) {
      if (ch.delta.content) deltas.push(ch.delta.content);
      if (ch.finish_reason) finish = ch.finish_reason;
    }
  }
  assert.equal(deltas.join(''), cut, `stop ${JSON.stringify(stop)}`);
  // No delta ever carried a byte past the cut, not even a first character of the stop held back later.
  let seen = '';
  for (const d of deltas) {
    seen += d;
    assert.ok(cut.startsWith(seen), `delta ${JSON.stringify(d)} leaks past ${JSON.stringify(cut)}`);
  }
  assert.equal(finish, 'stop');
});

await check('logprobs equal log_softmax of infer --output-logits within 1e-5', async () => {
  const prompt = 'Once upon a time';
  const r = await client.completions.create({ model: 'stories', prompt, temperature: 0, max_tokens: 8, logprobs: 20 });
  const lp = r.choices[0].logprobs;
  infer(['--template', 'raw', '--prompt', prompt, '--max-new-tokens', '1', '--temperature', '0', '--output-logits',
         join(work, 'logits.safetensors')]);
  const t = readSafetensors(join(work, 'logits.safetensors')).logits;
  const [T, V] = t.shape;
  const row = logSoftmax(t.data.subarray((T - 1) * V, T * V));
  const sorted = [...row].sort((a, b) => b - a);
  assert.ok(Math.abs(lp.token_logprobs[0] - sorted[0]) <= 1e-5, `${lp.token_logprobs[0]} vs ${sorted[0]}`);
  const top = Object.values(lp.top_logprobs[0]).sort((a, b) => b - a);
  assert.ok(top.length >= 15 && top.length <= 20);  // tokens with the same text share a key
  for (let i = 0; i < top.length; i++) assert.ok(sorted.some((x) => Math.abs(x - top[i]) <= 1e-5), `top ${i}: ${top[i]}`);
  // Every generated token: the logits of the prompt followed by the generated text.
  const text = r.choices[0].text;
  infer(['--template', 'raw', '--prompt', prompt + text, '--max-new-tokens', '1', '--temperature', '0', '--output-logits',
         join(work, 'logits2.safetensors')]);
  const t2 = readSafetensors(join(work, 'logits2.safetensors')).logits;
  const P = T;
  if (t2.shape[0] === P + r.usage.completion_tokens) {
    for (let k = 0; k < r.usage.completion_tokens; k++) {
      const row2 = logSoftmax(t2.data.subarray((P - 1 + k) * V, (P + k) * V));
      const best = Math.max(...row2);
      assert.ok(Math.abs(lp.token_logprobs[k] - best) <= 1e-5, `token ${k}: ${lp.token_logprobs[k]} vs ${best}`);
    }
  }
  // Chat logprobs: the chosen token and top_logprobs entries with bytes.
  const c = await chat(prompt, { max_tokens: 3, logprobs: true, top_logprobs: 5 });
  const entry = c.choices[0].logprobs.content[0];
  assert.equal(entry.top_logprobs.length, 5);
  assert.deepEqual(entry.bytes, [...Buffer.from(entry.token, 'utf8')]);
  assert.ok(Math.abs(entry.logprob - entry.top_logprobs[0].logprob) <= 1e-6);
});

await check('n: 3 with a seed is reproducible', async () => {
  const ask = () => chat('Once upon a time', { n: 3, seed: 1234, temperature: 1.0, max_tokens: 30 });
  const a = await ask(), b = await ask();
  assert.equal(a.choices.length, 3);
  assert.deepEqual(a.choices.map((c) => c.message.content), b.choices.map((c) => c.message.content));
  assert.deepEqual(a.choices.map((c) => c.index), [0, 1, 2]);
  assert.ok(new Set(a.choices.map((c) => c.message.content)).size > 1, 'three samples all equal');
  const other = await chat('Once upon a time', { n: 3, seed: 99, temperature: 1.0, max_tokens: 30 });
  assert.notDeepEqual(other.choices.map((c) => c.message.content), a.choices.map((c) => c.message.content));
});

await check('presence and frequency penalties change the greedy text', async () => {
  const plain = await chat(prompts[0], { max_tokens: 60 });
  const pen = await chat(prompts[0], { max_tokens: 60, frequency_penalty: 2.0, presence_penalty: 2.0 });
  assert.notEqual(pen.choices[0].message.content, plain.choices[0].message.content);
});

await check('8 concurrent streams against --parallel 2 equal their serial outputs; /health within 200 ms', async () => {
  const serial = [];
  for (const p of prompts) serial.push((await chat(p, { max_tokens: 120 })).choices[0].message.content);
  let worst = 0, running = true;
  const poll = (async () => {
    while (running) {
      const t0 = performance.now();
      const r = await fetch(`${server.base}/health`).catch(() => ({ status: 0 }));
      if (r.status !== 200) worst = Infinity;
      worst = Math.max(worst, performance.now() - t0);
      await new Promise((res) => setTimeout(res, 20));
    }
  })();
  const streamed = await Promise.all(prompts.map(async (p) => {
    const s = await chat(p, { max_tokens: 120, stream: true });
    let text = '';
    for await (const c of s) text += c.choices[0]?.delta?.content || '';
    return text;
  })).finally(() => { running = false; });
  await poll;
  assert.deepEqual(streamed, serial);
  assert.ok(worst < 200, `/health took ${worst.toFixed(1)} ms`);
});

const metric = async (name) => {
  const text = await (await fetch(`${server.base}/metrics`)).text();
  const m = text.match(new RegExp(`^${name} (\\S+)$`, 'm'));
  return m ? Number(m[1]) : NaN;
};

await check('an aborted stream frees its slot within 1 s without disturbing the others', async () => {
  const other = (await chat(prompts[2], { max_tokens: 200 })).choices[0].message.content;
  const controller = new AbortController();
  const doomed = await client.chat.completions.create(
    { model: 'stories', messages: [{ role: 'user', content: prompts[3] }], temperature: 0, max_tokens: 400,
      ignore_eos: true, stream: true }, { signal: controller.signal });
  const survivor = (async () => {
    const s = await chat(prompts[2], { max_tokens: 200, stream: true });
    let text = '';
    for await (const c of s) text += c.choices[0]?.delta?.content || '';
    return text;
  })();
  let n = 0;
  try {
    for await (const c of doomed) { if (++n === 3) controller.abort(); }
  } catch (e) { /* aborted */ }
  const t0 = Date.now();
  let freed = false;
  while (Date.now() - t0 < 1000) {
    if ((await metric('swiftcpp_requests_running')) <= 1 && (await metric('swiftcpp_requests_waiting')) === 0) {
      freed = true;
      break;
    }
    await new Promise((res) => setTimeout(res, 20));
  }
  assert.equal(await survivor, other);
  assert.ok(freed, 'the aborted request still holds its slot after 1 s');
});

// A non-streamed request whose client goes away is cancelled as a streamed one is: 10 abandoned requests of 400
// tokens (2 running, 8 waiting) would generate 4,000 tokens; cancelled, their rows are free within 1 s and a few
// hundred tokens at most are generated after the clients left.
await check('abandoned non-streamed requests are cancelled within 1 s', async () => {
  const controllers = Array.from({ length: 10 }, () => new AbortController());
  const pending = controllers.map((c, i) => fetch(`${server.base}/v1/completions`, {
    method: 'POST', signal: c.signal, headers: { 'Content-Type': 'application/json', Authorization: `Bearer ${key}` },
    body: JSON.stringify({ prompt: prompts[i % prompts.length], max_tokens: 400, ignore_eos: true, temperature: 0 }) })
    .catch(() => null));
  const t0 = Date.now();
  while (Date.now() - t0 < 5000 && (await metric('swiftcpp_requests_running')) < 2) {
    await new Promise((res) => setTimeout(res, 5));
  }
  const before = await metric('swiftcpp_generation_tokens_total');
  for (const c of controllers) c.abort();
  await Promise.all(pending);
  const t1 = Date.now();
  let freed = false;
  while (Date.now() - t1 < 1000) {
    if ((await metric('swiftcpp_requests_running')) === 0 && (await metric('swiftcpp_requests_waiting')) === 0) {
      freed = true;
      break;
    }
    await new Promise((res) => setTimeout(res, 20));
  }
  await new Promise((res) => setTimeout(res, 300));
  const after = await metric('swiftcpp_generation_tokens_total');
  assert.ok(freed, `abandoned requests still run after 1 s: ${await metric('swiftcpp_requests_running')} running`);
  assert.ok(after - before < 2000, `${after - before} tokens generated after the clients left`);
});

await check('malformed requests are answered with their status and no crash', async () => {
  const post = (path, body, headers = {}) => fetch(`${server.base}${path}`, {
    method: 'POST', headers: { 'Content-Type': 'application/json', Authorization: `Bearer ${key}`, ...headers }, body });
  const msg = (extra) => JSON.stringify({ messages: [{ role: 'user', content: 'hi' }], max_tokens: 4, ...extra });
  const cases = [
    ['truncated JSON', () => post('/v1/chat/completions', '{"messages": [{"role": "user"'), 400],
    ['{}', () => post('/v1/chat/completions', '{}'), 400],
    ['empty messages', () => post('/v1/chat/completions', '{"messages": []}'), 400],
    ['unknown role', () => post('/v1/chat/completions', JSON.stringify({ messages: [{ role: 'wizard', content: 'x' }] })), 400],
    ['content a number', () => post('/v1/chat/completions', JSON.stringify({ messages: [{ role: 'user', content: 5 }] })), 400],
    ['temperature a string', () => post('/v1/chat/completions', msg({ temperature: 'hot' })), 400],
    ['temperature 3', () => post('/v1/chat/completions', msg({ temperature: 3 })), 400],
    ['top_p 0', () => post('/v1/chat/completions', msg({ top_p: 0 })), 400],
    ['max_tokens -1', () => post('/v1/chat/completions', msg({ max_tokens: -1 })), 400],
    ['max_tokens 1.5', () => post('/v1/chat/completions', msg({ max_tokens: 1.5 })), 400],
    ['n 0', () => post('/v1/chat/completions', msg({ n: 0 })), 400],
    ['n 100', () => post('/v1/chat/completions', msg({ n: 100 })), 400],
    ['100 stop strings', () => post('/v1/chat/completions', msg({ stop: Array.from({ length: 100 }, (_, i) => `s${i}`) })), 400],
    ['top_logprobs 21', () => post('/v1/chat/completions', msg({ logprobs: true, top_logprobs: 21 })), 400],
    ['stream not a bool', () => post('/v1/chat/completions', msg({ stream: 'yes' })), 400],
    ['response_format json', () => post('/v1/chat/completions', msg({ response_format: { type: 'json_object' } })), 400],
    ['tools', () => post('/v1/chat/completions', msg({ tools: [{ type: 'function', function: { name: 'f' } }] })), 400],
    ['prompt longer than the context', () => post('/v1/completions', JSON.stringify({ prompt: 'word '.repeat(2000), max_tokens: 4 })), 400],
    ['unknown model', () => post('/v1/chat/completions', msg({ model: 'gpt-5' })), 404],
    ['body over 1 MiB', () => post('/v1/chat/completions', msg({ pad: 'x'.repeat(1100000) })), 413],
    ['wrong method', () => fetch(`${server.base}/v1/chat/completions`, { headers: { Authorization: `Bearer ${key}` } }), 405],
    ['wrong route', () => post('/v1/engines', msg({})), 404],
    ['missing key', () => post('/v1/chat/completions', msg({}), { Authorization: '' }), 401],
    ['wrong key', () => post('/v1/chat/completions', msg({}), { Authorization: 'Bearer nope' }), 401],
    ['invalid UTF-8', () => post('/v1/chat/completions', Buffer.concat([Buffer.from('{"messages": [{"role": "user", "content": "'),
                                                                        Buffer.from([0xc3, 0x28]), Buffer.from('"}]}')])), 400],
    ['unknown fields are ignored', () => post('/v1/chat/completions', msg({ frobnicate: true, user: 'x' })), 200],
    // Token ids outside the vocabulary, also those that wrap to -1 in 64 bits: 400, never a library's text.
    ['token id -1', () => post('/v1/completions', JSON.stringify({ prompt: [1, -1], max_tokens: 2 })), 400],
    ['token id 2^64 - 1', () => post('/v1/completions', '{"prompt": [18446744073709551615], "max_tokens": 2}'), 400],
    ['token id 2^63', () => post('/v1/completions', '{"prompt": [9223372036854775808], "max_tokens": 2}'), 400],
    ['token id past the vocabulary', () => post('/v1/completions', JSON.stringify({ prompt: [512], max_tokens: 2 })), 400],
  ];
  for (const [name, send, status] of cases) {
    const r = await send();
    const body = await r.text();
    assert.equal(r.status, status, `${name}: ${body.slice(0, 200)}`);
    if (status !== 200) {
      const e = JSON.parse(body).error;
      assert.ok(e && typeof e.message === 'string' && 'type' in e && 'param' in e && 'code' in e, `${name}: ${body}`);
      assert.ok(!/frame #|Exception raised|c10::/.test(e.message), `${name}: library text in ${body.slice(0, 300)}`);
    }
  }
  // The body limit holds however the body arrives: chunked (no length to check first) is 411, compressed 415;
  // the headers together are bounded (431). Each with an OpenAI error body.
  const http = await import('node:http');
  const zlib = await import('node:zlib');
  const raw = (headers, chunks) => new Promise((resolve, reject) => {
    const req = http.request(`${server.base}/v1/chat/completions`, {
      method: 'POST', agent: false, headers: { 'Content-Type': 'application/json', Authorization: `Bearer ${key}`, ...headers } },
    (res) => {
      let body = '';
      res.on('data', (d) => { body += d; });
      res.on('end', () => resolve({ status: res.statusCode, body }));
    });
    req.on('error', reject);
    for (const c of chunks) req.write(c);
    req.end();
  });
  const body = msg({});
  const gz = zlib.gzipSync(Buffer.from(body));
  const limits = [
    ['chunked body', await raw({}, [body.slice(0, 10), body.slice(10)]), 411],
    ['gzip body', await raw({ 'Content-Encoding': 'gzip', 'Content-Length': gz.length }, [gz]), 415],
    ['80 KB of headers', await raw(Object.fromEntries(Array.from({ length: 20 }, (_, i) => [`X-Pad-${i}`, 'x'.repeat(4000)])),
                                   [body]), 431],
  ];
  for (const [name, r, status] of limits) {
    assert.equal(r.status, status, `${name}: ${r.body.slice(0, 200)}`);
    const e = JSON.parse(r.body).error;
    assert.ok(e && typeof e.message === 'string', `${name}: ${r.body}`);
  }
  assert.equal((await fetch(`${server.base}/health`)).status, 200);
});

await check('20 requests against --max-queue 4: the overflow gets 503 with Retry-After', async () => {
  const small = await startServer(['--parallel', '2', '--max-queue', '4']);
  try {
    const send = () => fetch(`${small.base}/v1/completions`, {
      method: 'POST', headers: { 'Content-Type': 'application/json' },
      body: JSON.stringify({ prompt: 'Once upon a time', max_tokens: 400, ignore_eos: true, temperature: 0 }) });
    const answers = await Promise.all(Array.from({ length: 20 }, send));
    const statuses = answers.map((r) => r.status);
    await Promise.all(answers.map((r) => r.text()));
    const ok = statuses.filter((s) => s === 200).length, busy = statuses.filter((s) => s === 503).length;
    assert.equal(ok + busy, 20, statuses.join(','));
    assert.ok(ok >= 6 && busy >= 1, statuses.join(','));
    assert.ok(answers.filter((r) => r.status === 503).every((r) => r.headers.get('retry-after') === '1'));
    assert.equal((await fetch(`${small.base}/health`)).status, 200);
  } finally {
    small.child.kill('SIGKILL');
  }
});

await check('200 sequential requests: RSS grows under 32 MiB, no fd or thread leak', async () => {
  const pid = server.child.pid;
  const one = (i) => client.completions.create({ model: 'stories', prompt: prompts[i % 8], max_tokens: 16, temperature: 0 });
  for (let i = 0; i < 20; i++) await one(i);
  const rss0 = rssKiB(pid), fd0 = fdCount(pid), th0 = threadCount(pid);
  for (let i = 0; i < 200; i++) await one(i);
  await new Promise((res) => setTimeout(res, 300));
  const rss1 = rssKiB(pid), fd1 = fdCount(pid), th1 = threadCount(pid);
  assert.ok(rss1 - rss0 < 32 * 1024, `RSS ${rss0} -> ${rss1} KiB`);
  assert.ok(fd1 <= fd0 + 2, `fds ${fd0} -> ${fd1}`);
  assert.ok(th1 <= th0 + 2, `threads ${th0} -> ${th1}`);
});

await check('--adapters: a request picks its LoRA adapter by name; adapter and base requests share a batch', async () => {
  const out = join(work, 'train');
  const t = spawnSync(bin, ['--threads', threads, 'train', `model=${model}`,
    `dataset=${join(root, 'tests/data/sft/alpaca_en_demo.json')}#32`, `output_dir=${out}`, 'template=default',
    'max_length=128', 'per_device_train_batch_size=4', 'max_steps=3', 'save_steps=3', 'lora_rank=4',
    'lora_alpha=16', 'learning_rate=0.05', 'warmup_steps=0', 'seed=5', 'split_dataset_ratio=0'], { encoding: 'utf8' });
  assert.equal(t.status, 0, t.stderr);
  const run = readdirSync(out).filter((d) => !d.startsWith('.'))[0];
  const ckpt = join(out, run, 'checkpoint-3');
  writeFileSync(join(work, 'ap.jsonl'), prompts.slice(0, 4).map((p) => JSON.stringify({ prompt: p })).join('\n') + '\n');
  const expect = (extra) => {
    infer(['--template', 'raw', '--prompts-file', join(work, 'ap.jsonl'), '--output', join(work, 'ap-out.jsonl'),
           '--overwrite', '--temperature', '0', '--max-new-tokens', '30', ...extra]);
    return readFileSync(join(work, 'ap-out.jsonl'), 'utf8').trim().split('\n').map((l) => JSON.parse(l).response);
  };
  const base = expect([]), tuned = expect(['--adapters', ckpt]);
  assert.notDeepEqual(tuned, base);
  const srv = await startServer(['--parallel', '4', '--adapters', `tuned=${ckpt}`, '--served-model-name', 'base']);
  try {
    const c = new OpenAI({ baseURL: `${srv.base}/v1`, apiKey: 'none', maxRetries: 0 });
    assert.deepEqual((await c.models.list()).data.map((m) => [m.id, m.parent ?? null]), [['base', null], ['tuned', 'base']]);
    const ask = (m, p) => c.completions.create({ model: m, prompt: p, max_tokens: 30, temperature: 0 })
      .then((r) => r.choices[0].text);
    const got = await Promise.all(prompts.slice(0, 4).flatMap((p) => [ask('tuned', p), ask('base', p)]));
    assert.deepEqual(got.filter((_, i) => i % 2 === 0), tuned);
    assert.deepEqual(got.filter((_, i) => i % 2 === 1), base);
    const r = await fetch(`${srv.base}/v1/completions`, { method: 'POST', headers: { 'Content-Type': 'application/json' },
                                                         body: JSON.stringify({ model: 'other', prompt: 'x' }) });
    assert.equal(r.status, 404);
  } finally {
    srv.child.kill('SIGKILL');
  }
});

// Images over the API on the tiny Qwen2-VL of ../shared (skipped with the reason when absent): a data URL, a
// loopback http URL and an allowed local file answer exactly as `swiftcpp infer --image`; n: 2 shares the images;
// requests with and without images share the engine; each bad part is a 400 naming it.
const qwen = join(root, '..', 'shared', 'assets', 'reference', 'qwen2_vl', 'tiny-qwen2-vl');
const imageDir = join(root, '..', 'shared', 'assets', 'images');
await check('image parts (data URL, loopback URL, allowed file) answer as infer --image; bad parts are 400s naming them', async () => {
  if (!existsSync(join(qwen, 'config.json')) || !existsSync(join(imageDir, 'coffee.jpg'))) {
    console.log(`  skipped: ${qwen} or ${imageDir} absent (../shared/assets)`);
    return;
  }
  const http = await import('node:http');
  const media = http.createServer((req, res) => {
    if (req.url === '/coffee.jpg') {
      res.writeHead(200, { 'Content-Type': 'image/jpeg' });
      res.end(readFileSync(join(imageDir, 'coffee.jpg')));
    } else if (req.url === '/moved') {
      res.writeHead(302, { Location: '/coffee.jpg' });
      res.end();
    } else if (req.url === '/elsewhere') {
      res.writeHead(302, { Location: 'ftp://127.0.0.1/coffee.jpg' });
      res.end();
    } else {
      res.writeHead(404);
      res.end();
    }
  });
  await new Promise((resolve) => media.listen(0, '127.0.0.1', resolve));
  const mediaBase = `http://127.0.0.1:${media.address().port}`;
  const srv = await startServer(['--parallel', '3', '--allowed-local-media-path', imageDir, '--allow-remote-media',
                                 '--max-images-per-request', '2'], qwen);
  try {
    const question = 'What is in the picture?';
    const rows = ['coffee.jpg', 'camera.png'].map((f) => JSON.stringify(
      { messages: [{ role: 'user', content: `<image>${question}` }], images: [join(imageDir, f)] })).join('\n');
    writeFileSync(join(work, 'images.jsonl'), rows + '\n');
    const r = spawnSync(bin, ['--threads', threads, 'infer', '--model', qwen, '--prompts-file', join(work, 'images.jsonl'),
                              '--output', join(work, 'images.out.jsonl'), '--temperature', '0', '--max-new-tokens', '12',
                              '--batch-size', '1'],
                        { encoding: 'utf8' });
    assert.equal(r.status, 0, r.stderr);
    const [coffee, camera] = readFileSync(join(work, 'images.out.jsonl'), 'utf8').trim().split('\n').map((l) => JSON.parse(l));
    const c = new OpenAI({ baseURL: `${srv.base}/v1`, apiKey: 'none', maxRetries: 0 });
    const ask = (url, extra = {}) => c.chat.completions.create({
      model: 'tiny-qwen2-vl', temperature: 0, max_tokens: 12, ...extra,
      messages: [{ role: 'user', content: [{ type: 'image_url', image_url: { url } }, { type: 'text', text: question }] }] });
    const dataUrl = `data:image/jpeg;base64,${readFileSync(join(imageDir, 'coffee.jpg')).toString('base64')}`;
    const [viaData, viaHttp, viaFile, viaRedirect, text] = await Promise.all([
      ask(dataUrl), ask(`${mediaBase}/coffee.jpg`), ask(`file://${join(imageDir, 'camera.png')}`), ask(`${mediaBase}/moved`),
      c.chat.completions.create({ model: 'tiny-qwen2-vl', temperature: 0, max_tokens: 12,
                                  messages: [{ role: 'user', content: question }] })]);
    for (const [got, want, what] of [[viaData, coffee, 'data URL'], [viaHttp, coffee, 'loopback URL'],
                                     [viaRedirect, coffee, 'redirected URL'], [viaFile, camera, 'allowed file']]) {
      assert.equal(got.choices[0].message.content, want.response, what);
      assert.equal(got.usage.prompt_tokens, want.prompt_tokens, what);
    }
    assert.ok(text.usage.prompt_tokens < coffee.prompt_tokens);
    const two = await ask(dataUrl, { n: 2 });
    assert.deepEqual(two.choices.map((ch) => ch.message.content), [coffee.response, coffee.response]);

    const post = (messages) => fetch(`${srv.base}/v1/chat/completions`, {
      method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify({ messages, max_tokens: 2 }) });
    const part = (url) => ({ type: 'image_url', image_url: { url } });
    const cases = [
      [[{ role: 'user', content: [{ type: 'text', text: 'x' }, part('file:///etc/passwd')] }], 'messages[0].content[1]', 'outside'],
      [[{ role: 'user', content: [part('data:image/png;base64,%%%')] }], 'messages[0].content[0]', 'base64'],
      [[{ role: 'user', content: [part(dataUrl), part(dataUrl), part(dataUrl)] }], 'messages[0].content[2]', 'more than the 2'],
      [[{ role: 'user', content: [part(`${mediaBase}/elsewhere`)] }], 'messages[0].content[0]', 'not http(s)'],
      [[{ role: 'user', content: [part(`${mediaBase}/absent.png`)] }], 'messages[0].content[0]', 'HTTP 404'],
      [[{ role: 'user', content: [part('data:image/gif;base64,R0lGODlhAQABAAAAACw=')] }], 'messages[0].content[0]', 'GIF'],
      [[{ role: 'assistant', content: [part(dataUrl)] }, { role: 'user', content: 'x' }], 'messages[0].content[0]', 'user messages'],
    ];
    for (const [messages, param, words] of cases) {
      const res = await post(messages);
      const body = await res.json();
      assert.equal(res.status, 400, JSON.stringify(body));
      assert.equal(body.error.param, param, JSON.stringify(body));
      assert.ok(body.error.message.includes(words), `${words}: ${body.error.message}`);
    }
    const after = await ask(dataUrl);  // still serving
    assert.equal(after.choices[0].message.content, coffee.response);
  } finally {
    srv.child.kill('SIGKILL');
    media.close();
  }
});

await check('soak: concurrent clients with random valid and invalid requests; every answer well-formed, /health 200, memory flat', async () => {
  // SWIFTCPP_SOAK_SECONDS (default 20 in the suite; 60 for the full soak) of 6 clients against --parallel 2 and
  // --max-queue 8, each sending one request after another, picked by a seeded generator from valid ones (chat,
  // streamed chat, completions with n 2, token-id prompts) and invalid ones (malformed JSON, a token id past the
  // vocabulary, n 100, a negative temperature, a broken data URL, a wrong key, a wrong route). Every answer must be
  // its expected status (a valid request may also meet a full queue: 503) with a well-formed body: a completion
  // with choices, a stream of data: lines ending in [DONE], or an OpenAI error object without library text.
  const seconds = Number(process.env.SWIFTCPP_SOAK_SECONDS || 20);
  const pid = server.child.pid;
  let state = 20261207;
  const rand = () => { state = (state * 1103515245 + 12345) % 2147483648; return state / 2147483648; };
  const body = (extra) => JSON.stringify({ model: 'stories', messages: [{ role: 'user', content: prompts[Math.floor(rand() * 8)] }],
                                           max_tokens: 8, temperature: 0, ...extra });
  const kinds = [
    ['chat', () => ['/v1/chat/completions', body({})], 200],
    ['stream', () => ['/v1/chat/completions', body({ stream: true, stream_options: { include_usage: true } })], 200],
    ['completions n 2', () => ['/v1/completions', JSON.stringify({ prompt: prompts[Math.floor(rand() * 8)], max_tokens: 6, n: 2, seed: 3 })], 200],
    ['token ids', () => ['/v1/completions', JSON.stringify({ prompt: [1, 100, 200], max_tokens: 4 })], 200],
    ['malformed JSON', () => ['/v1/chat/completions', '{"messages": [{"role": "user", "content": "hi"'], 400],
    ['token id past the vocabulary', () => ['/v1/completions', JSON.stringify({ prompt: [1, 99999], max_tokens: 2 })], 400],
    ['n 100', () => ['/v1/chat/completions', body({ n: 100 })], 400],
    ['negative temperature', () => ['/v1/chat/completions', body({ temperature: -1 })], 400],
    ['broken data URL', () => ['/v1/chat/completions', JSON.stringify({ messages: [{ role: 'user', content: [
      { type: 'image_url', image_url: { url: 'data:image/png;base64,AAAA' } }] }] })], 400],
    ['wrong key', () => ['/v1/chat/completions', body({}), 401, 'Bearer nope'], 401],
    ['wrong route', () => ['/v1/engines', body({})], 404],
  ];
  const send = async () => {
    const [name, make, expected] = kinds[Math.floor(rand() * kinds.length)];
    const [path, payload, , auth] = make();
    const r = await fetch(`${server.base}${path}`, { method: 'POST', body: payload,
      headers: { 'Content-Type': 'application/json', Authorization: auth ?? `Bearer ${key}` } });
    const text = await r.text();
    const ok = r.status === expected || (expected === 200 && r.status === 503);
    assert.ok(ok, `${name}: status ${r.status}, expected ${expected}: ${text.slice(0, 200)}`);
    if (r.status !== 200) {
      const e = JSON.parse(text).error;
      assert.ok(e && typeof e.message === 'string' && 'type' in e, `${name}: ${text.slice(0, 200)}`);
      assert.ok(!/frame #|Exception raised|c10::/.test(e.message), `${name}: library text in ${text.slice(0, 300)}`);
    } else if (text.startsWith('data: ')) {
      const events = text.split('\n\n').filter((x) => x.length);
      assert.equal(events[events.length - 1], 'data: [DONE]', `${name}: ${text.slice(-200)}`);
      for (const ev of events.slice(0, -1)) JSON.parse(ev.slice(6));
    } else {
      const j = JSON.parse(text);
      assert.ok(Array.isArray(j.choices) && j.choices.length >= 1 && j.usage, `${name}: ${text.slice(0, 200)}`);
    }
    return name;
  };
  const client_loop = async (until, counts) => {
    while (Date.now() < until) counts.push(await send());
  };
  // Warm-up round, then the memory baseline.
  await client_loop(Date.now() + 2000, []);
  const rss0 = rssKiB(pid), fd0 = fdCount(pid), th0 = threadCount(pid);
  const counts = [];
  const until = Date.now() + seconds * 1000;
  let healthWorst = 0, healthChecks = 0;
  const health = (async () => {
    while (Date.now() < until) {
      const t0 = Date.now();
      const h = await fetch(`${server.base}/health`);
      await h.text();
      assert.equal(h.status, 200, '/health during the soak');
      healthWorst = Math.max(healthWorst, Date.now() - t0);
      healthChecks += 1;
      await new Promise((res) => setTimeout(res, 200));
    }
  })();
  await Promise.all([...Array.from({ length: 6 }, () => client_loop(until, counts)), health]);
  await new Promise((res) => setTimeout(res, 300));
  const rss1 = rssKiB(pid), fd1 = fdCount(pid), th1 = threadCount(pid);
  console.log(`     soak: ${counts.length} requests in ${seconds} s, ${healthChecks} health checks (worst ${healthWorst} ms), ` +
              `RSS ${rss0} -> ${rss1} KiB, fds ${fd0} -> ${fd1}, threads ${th0} -> ${th1}`);
  assert.ok(counts.length >= 6 * seconds / 2, `only ${counts.length} requests in ${seconds} s`);
  assert.ok(rss1 - rss0 < 48 * 1024, `RSS ${rss0} -> ${rss1} KiB`);
  assert.ok(fd1 <= fd0 + 2, `fds ${fd0} -> ${fd1}`);
  assert.ok(th1 <= th0 + 2, `threads ${th0} -> ${th1}`);
});

await check('SIGTERM exits cleanly', async () => {
  const code = await new Promise((resolve) => {
    server.child.on('exit', (c, sig) => resolve(c ?? sig));
    server.child.kill('SIGTERM');
    setTimeout(() => resolve('timeout'), 15000);
  });
  assert.equal(code, 0, server.log().slice(-2000));
});

if (server.child.exitCode === null) server.child.kill('SIGKILL');
rmSync(work, { recursive: true, force: true });
const failed = results.filter((r) => r[1] !== 'ok');
console.log(`${results.length - failed.length}/${results.length} passed`);
process.exit(failed.length ? 1 : 0);
