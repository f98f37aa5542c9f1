// The reference for the GPT-2 tokenizer tests: gpt-3-encoder's `encode` of each string of a JSON array.
// usage: node gpt3_encoder.js NODE_MODULES_DIR IN.json OUT.json   (OUT: a JSON array of token arrays)
const fs = require('fs');
const {encode} = require(process.argv[2] + '/gpt-3-encoder');
const texts = JSON.parse(fs.readFileSync(process.argv[3], 'utf8'));
fs.writeFileSync(process.argv[4], JSON.stringify(texts.map(t => encode(t))));
