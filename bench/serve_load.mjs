// Load generator for OpenAI-compatible servers (swiftcpp deploy, llama.cpp's llama-server): CONCURRENCY clients
// each send streamed /v1/completions requests back to back until REQUESTS have been sent in all; every request asks
// for exactly MAX_TOKENS tokens (ignore_eos) after a prompt of about PROMPT_WORDS words. Prints one JSON object:
// aggregate completion tokens/s over the whole run, and the p50/p99 time to first token.
//   node bench/serve_load.mjs --url http://127.0.0.1:8000 --concurrency 8 --requests 32 --max-tokens 128
// With --chat (or --image FILE) the requests go to /v1/chat/completions as one user message; --image FILE (a JPEG or
// PNG) puts that image before the text as a base64 data URL, read once here, so every request carries it.
import http from 'node:http';
import { readFileSync } from 'node:fs';

const args = Object.fromEntries(process.argv.slice(2).reduce((acc, a, i, all) => {
  if (a.startsWith('--')) acc.push([a.slice(2), all[i + 1]]);
  return acc;
}, []));
const url = args.url ?? 'http://127.0.0.1:8000';
const concurrency = Number(args.concurrency ?? 1);
const requests = Number(args.requests ?? concurrency * 4);
const maxTokens = Number(args['max-tokens'] ?? 128);
const promptWords = Number(args['prompt-words'] ?? 100);
const model = args.model ?? '';
const imageFile = args.image;
const chat = imageFile !== undefined || args.chat !== undefined;
const imageUrl = imageFile === undefined ? null
  : `data:image/${imageFile.endsWith('.png') ? 'png' : 'jpeg'};base64,${readFileSync(imageFile).toString('base64')}`;
for (const [k, v] of [['concurrency', concurrency], ['requests', requests], ['max-tokens', maxTokens]]) {
  if (!Number.isInteger(v) || v < 1) { console.error(`--${k} must be a positive integer`); process.exit(2); }
}
const words = ['once', 'upon', 'a', 'time', 'there', 'was', 'little', 'girl', 'named', 'lily', 'she', 'liked', 'to',
               'play', 'in', 'the', 'park', 'with', 'her', 'dog'];
const prompt = (i) => Array.from({ length: promptWords }, (_, k) => words[(k * 7 + i * 3) % words.length]).join(' ');

// One streamed request on a connection of its own (no keep-alive: llama-server and undici disagree on reusing one).
function one(i) {
  return new Promise((resolve, reject) => {
    const t0 = performance.now();
    const content = imageUrl === null ? prompt(i)
      : [{ type: 'image_url', image_url: { url: imageUrl } }, { type: 'text', text: prompt(i) }];
    const body = JSON.stringify({ model, ...(chat ? { messages: [{ role: 'user', content }] } : { prompt: prompt(i) }),
                                  max_tokens: maxTokens, temperature: 0, ignore_eos: true,
                                  stream: true, stream_options: { include_usage: true } });
    const req = http.request(`${url}/v1/${chat ? 'chat/completions' : 'completions'}`, {
      method: 'POST', agent: false,
      headers: { 'Content-Type': 'application/json', 'Content-Length': Buffer.byteLength(body) } }, (res) => {
      if (res.statusCode !== 200) {
        let text = '';
        res.on('data', (d) => { text += d; });
        res.on('end', () => reject(new Error(`HTTP ${res.statusCode}: ${text}`)));
        return;
      }
      let ttft = null, tokens = 0, chunks = 0, buffer = '';
      res.setEncoding('utf8');
      res.on('data', (part) => {
        buffer += part;
        let cut;
        while ((cut = buffer.indexOf('\n\n')) >= 0) {
          const event = buffer.slice(0, cut).trim();
          buffer = buffer.slice(cut + 2);
          if (!event.startsWith('data: ') || event === 'data: [DONE]') continue;
          const chunk = JSON.parse(event.slice(6));
          if (chunk.usage && chunk.usage.completion_tokens) tokens = chunk.usage.completion_tokens;
          if (chunk.choices?.[0]?.text || chunk.choices?.[0]?.delta?.content) {
            if (ttft === null) ttft = performance.now() - t0;
            chunks++;
          }
        }
      });
      res.on('end', () => resolve({ ttft, tokens: tokens || chunks, ms: performance.now() - t0 }));
      res.on('error', reject);
    });
    req.on('error', reject);
    req.end(body);
  });
}

let next = 0;
const results = [];
const t0 = performance.now();
await Promise.all(Array.from({ length: concurrency }, async () => {
  while (next < requests) results.push(await one(next++));
}));
const wall = (performance.now() - t0) / 1000;
const ttfts = results.map((r) => r.ttft).filter((x) => x !== null).sort((a, b) => a - b);
const pct = (p) => ttfts[Math.min(ttfts.length - 1, Math.floor(p * ttfts.length))];
const tokens = results.reduce((s, r) => s + r.tokens, 0);
console.log(JSON.stringify({ url, concurrency, requests, max_tokens: maxTokens, prompt_words: promptWords,
                             chat, image: imageFile ?? null,
                             wall_s: wall, completion_tokens: tokens, tokens_per_s: tokens / wall,
                             ttft_p50_ms: pct(0.5), ttft_p99_ms: pct(0.99) }));
