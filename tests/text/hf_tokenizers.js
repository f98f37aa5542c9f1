// The reference for the tokenizer.json tests: Hugging Face's tokenizers (the npm binding of its Rust library) on
// each string of a JSON array: the ids without and with the post-processor's special tokens, and the decoded ids; an
// array of ids in place of a string: its decoding alone.
// usage: node hf_tokenizers.js NODE_MODULES_DIR TOKENIZER_JSON IN.json OUT.json
//   (OUT: a JSON array of {"ids": [...], "with_special": [...], "decoded": "..."}, {"decoded": "..."} for ids)
const fs = require('fs');
const {Tokenizer} = require(process.argv[2] + '/tokenizers');
(async () => {
  const tok = Tokenizer.fromFile(process.argv[3]);
  const texts = JSON.parse(fs.readFileSync(process.argv[4], 'utf8'));
  const out = [];
  for (const t of texts) {
    if (Array.isArray(t)) {
      out.push({decoded: await tok.decode(t, false)});
      continue;
    }
    const ids = (await tok.encode(t, null, {addSpecialTokens: false})).getIds();
    const withSpecial = (await tok.encode(t, null, {addSpecialTokens: true})).getIds();
    out.push({ids, with_special: withSpecial, decoded: await tok.decode(ids, false)});
  }
  fs.writeFileSync(process.argv[5], JSON.stringify(out));
})().catch(e => {
  console.error(e);
  process.exit(1);
});
