// Token perplexity as llama.cpp computes the model (node-llama-cpp's prebuilt libllama, CPU), over exactly the
// windows and token ids `swiftcpp eval --tasks perplexity --dump-requests FILE` scored: each JSON line holds a
// window's context ids and its continuation ids; the input is context + continuation minus its last token, and
// every continuation token is predicted once. Prints JSON {tokens, nll, token_perplexity}. Run from
// third_party/llama-interop (where the package resolves); bench/run_quant.sh does.
//
//   node llama_cpp_perplexity.mjs MODEL.gguf REQUESTS.jsonl CONTEXT_SIZE [THREADS]
import {readFileSync} from "node:fs";
import {getLlama, LlamaLogLevel} from "node-llama-cpp";

const [modelPath, requestsPath, contextText, threadsText] = process.argv.slice(2);
const windows = readFileSync(requestsPath, "utf8").split("\n").filter((l) => l.trim()).map((l) => JSON.parse(l));
const L = Number(contextText);
const threads = Number(threadsText ?? "2");

const llama = await getLlama({gpu: false, build: "never", logLevel: LlamaLogLevel.error});
const model = await llama.loadModel({modelPath});
// F32 K/V and no flash attention, so the weights' format is the only difference from the float model.
const context = await model.createContext({contextSize: L, batchSize: Math.min(L, 512), sequences: 1, threads,
  flashAttention: false, experimentalKvCacheKeyType: "F32", experimentalKvCacheValueType: "F32"});
const sequence = context.getSequence();
// Temperature 1 and no top-k / top-p / min-p filtering: the model's own softmax.
const full = {generateNext: {probabilities: true, options: {temperature: 1, topK: 0, topP: 1, minP: 0}}};
const piece = 128;  // positions evaluated per call: the vocabulary-sized maps of one piece at a time
let nll = 0;
let scored = 0;
for (const w of windows) {
  const target = w.continuations[0];
  const tokens = [...w.context, ...target];
  const first = w.context.length - 1;  // position first + j predicts target[j]
  await sequence.clearHistory();
  for (let p0 = 0; p0 < tokens.length - 1; p0 += piece) {
    const p1 = Math.min(tokens.length - 1, p0 + piece);
    const items = [];
    for (let p = p0; p < p1; ++p) items.push(p >= first ? [tokens[p], full] : tokens[p]);
    const out = await sequence.controlledEvaluate(items);
    for (let p = Math.max(p0, first); p < p1; ++p) {
      nll -= Math.log(out[p - p0].next.probabilities.get(tokens[p + 1]) ?? 0);
      ++scored;
    }
  }
}
process.stdout.write(JSON.stringify({tokens: scored, nll, token_perplexity: Math.exp(nll / scored)}) + "\n");
await context.dispose();
await model.dispose();
await llama.dispose();
