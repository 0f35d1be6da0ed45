// Runs a GGUF file in llama.cpp (through the node-llama-cpp package's prebuilt libllama, CPU only) and prints JSON:
// for the given token ids, the next-token probabilities at every position (full vocabulary), and the greedy
// continuation of `new_tokens` tokens. Used by tests/unit/test_gguf.cpp's interop test.
//
//   node tests/interop/llama_cpp_eval.mjs MODEL.gguf "1,403,407" 16
import {getLlama, LlamaLogLevel} from "node-llama-cpp";

const [modelPath, idsText, newTokensText] = process.argv.slice(2);
const ids = idsText.split(",").map(Number);
const newTokens = Number(newTokensText ?? "0");

const llama = await getLlama({gpu: false, build: "never", logLevel: LlamaLogLevel.error});
const model = await llama.loadModel({modelPath});
// An F32 K/V cache and no flash attention, so f32 files compute in f32 end to end (the default cache is F16).
const context = await model.createContext({contextSize: 256, batchSize: 256, sequences: 1, threads: 1, flashAttention: false,
  experimentalKvCacheKeyType: "F32", experimentalKvCacheValueType: "F32"});
const sequence = context.getSequence();
const input = ids.map((t) => [t, {generateNext: {token: true, probabilities: true, options: {temperature: 0}}}]);
const out = await sequence.controlledEvaluate(input);
const vocab = model.tokens.vocabularySize ?? model.fileInfo?.metadata?.tokenizer?.ggml?.tokens?.length;
const probabilities = out.map((o) => {
  const row = new Array(vocab).fill(0);
  for (const [token, p] of o.next.probabilities) row[token] = p;
  return row;
});
// Greedy continuation: the first token comes from the last position above, the rest from llama.cpp's own
// generation loop at temperature 0.
const generated = [];
if (newTokens > 0) {
  generated.push(out[out.length - 1].next.token);
  if (newTokens > 1) {
    for await (const token of sequence.evaluate([generated[0]], {temperature: 0})) {
      generated.push(token);
      if (generated.length >= newTokens) break;
    }
  }
}
process.stdout.write(JSON.stringify({vocab, probabilities, generated}) + "\n");
await context.dispose();
await model.dispose();
await llama.dispose();
