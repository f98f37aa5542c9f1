// The reference for chat data with a Hugging Face tokenizer: each {template, context, tokenizer} of a JSON array
// rendered by @huggingface/jinja and the text encoded by Hugging Face's tokenizers (its npm binding, no special
// tokens added: the template writes them). usage: node chat_tokens.mjs NODE_MODULES_DIR IN.json OUT.json
//   (OUT: a JSON array of {"text": rendered, "ids": [...], "starts": [each token's first byte in the UTF-8 text]})
import fs from 'fs';
import {createRequire} from 'module';
const modules = process.argv[2];
const {Template} = await import(modules + '/@huggingface/jinja/dist/index.js');
const {Tokenizer} = createRequire(import.meta.url)(modules + '/tokenizers');
const cases = JSON.parse(fs.readFileSync(process.argv[3], 'utf8'));
const out = [];
for (const c of cases) {
  const text = new Template(c.template).render(c.context);
  const enc = await Tokenizer.fromFile(c.tokenizer).encode(text, null, {addSpecialTokens: false});
  // The package's offsets count characters (code points): to bytes of the UTF-8 text.
  const bytes = [0];
  for (const ch of Array.from(text)) bytes.push(bytes[bytes.length - 1] + Buffer.byteLength(ch, 'utf8'));
  out.push({text, ids: Array.from(enc.getIds()), starts: enc.getOffsets().map(([b]) => bytes[b])});
}
fs.writeFileSync(process.argv[4], JSON.stringify(out));
