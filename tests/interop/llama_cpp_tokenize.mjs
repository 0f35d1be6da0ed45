// Tokenizes texts with a GGUF file's own vocabulary in llama.cpp (node-llama-cpp's prebuilt libllama, CPU) and
// prints JSON: one id list per text, special-token strings treated as text, no BOS added. The texts come as
// llama.cpp's tokenizer test vectors lay them out (each followed by "\n__ggml_vocab_test__\n"). Used by
// tests/unit/test_gguf.cpp's interop test.
//
//   node tests/interop/llama_cpp_tokenize.mjs MODEL.gguf TEXTS.inp
import {readFileSync} from "node:fs";
import {getLlama, LlamaLogLevel} from "node-llama-cpp";

const [modelPath, inputPath] = process.argv.slice(2);
const separator = "\n__ggml_vocab_test__\n";
const texts = readFileSync(inputPath, "utf8").split(separator).slice(0, -1);
const llama = await getLlama({gpu: false, build: "never", logLevel: LlamaLogLevel.error});
const model = await llama.loadModel({modelPath, vocabOnly: true});
const ids = texts.map((t) => Array.from(model.tokenize(t, false)));
process.stdout.write(JSON.stringify(ids) + "\n");
await model.dispose();
await llama.dispose();
