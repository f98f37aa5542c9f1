// llama.cpp (the npm package node-llama-cpp, its prebuilt CPU binary) on a GGUF file: the oracle of castor export
// --format gguf. Usage: node gguf_llama_cpp.mjs NODE_MODULES REQUESTS.json; prints a JSON array, one object a request
// (one node start for several files). A request: {"model": path, "context": n, "prompt": [ids], "steps": n,
// "forced": [ids], "texts": [strings], "lora": adapter path (optional: a GGUF LoRA adapter loaded onto the model's
// context at scale 1, as llama-cli --lora does)}
//   greedy: llama.cpp's own greedy continuation of `prompt` for `steps` tokens (fewer when it draws a token that
//     ends a generation, EOS or EOT, which it does not yield);
//   forced: `prompt` followed by `forced` fed in one go (teacher forcing): at each position from the prompt's last,
//     llama.cpp's most likely next token and its probability of the next token of `forced` (softmax of the logits:
//     temperature 0 reports them unscaled);
//   tokens: llama.cpp's tokenization of each text (no BOS added; special tokens parsed as text, or as tokens with
//     "special": true, as Hugging Face's tokenizers always matches added tokens).
// Float32 KV cache (the default F16 cache alone moves log-probabilities by ~1e-2), flash attention off, 2 threads.
import { readFileSync } from 'node:fs';
import { pathToFileURL } from 'node:url';
import path from 'node:path';

const [modules, requestPath] = process.argv.slice(2);
const { getLlama } = await import(pathToFileURL(path.join(modules, 'node-llama-cpp/dist/index.js')).href);
const requests = JSON.parse(readFileSync(requestPath, 'utf8'));
const llama = await getLlama({ gpu: false, build: 'never', skipDownload: true, logLevel: 'error' });
const results = [];
for (const req of requests) {
  const model = await llama.loadModel({ modelPath: req.model });
  const context = await model.createContext({
    contextSize: req.context, sequences: 2, threads: 2, batchSize: req.context, flashAttention: false,
    experimentalKvCacheKeyType: 'F32', experimentalKvCacheValueType: 'F32',
    ...(req.lora ? { lora: req.lora } : {}),
  });
  const result = {};
  if (req.steps > 0) {
    const greedy = [];
    for await (const t of context.getSequence().evaluate(req.prompt, { temperature: 0 })) {
      greedy.push(t);
      if (greedy.length >= req.steps) break;
    }
    result.greedy = greedy;
  }
  if (req.forced && req.forced.length > 0) {
    const ids = [...req.prompt, ...req.forced.slice(0, -1)];
    const ask = { generateNext: { token: true, probabilities: true, options: { temperature: 0 } } };
    const out = await context.getSequence().controlledEvaluate(
      ids.map((t, i) => (i >= req.prompt.length - 1 ? [t, ask] : t)));
    result.forced = [];
    for (let i = req.prompt.length - 1; i < ids.length; ++i) {
      const next = out[i].next;
      const want = req.forced[i - req.prompt.length + 1];
      result.forced.push({ token: next.token, p: next.probabilities.get(want) ?? 0 });
    }
  }
  result.tokens = (req.texts ?? []).map((s) => model.tokenize(s, req.special ?? false));
  results.push(result);
  await context.dispose();
  await model.dispose();
}
console.log(JSON.stringify(results));
await llama.dispose();
