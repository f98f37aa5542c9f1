// The reference for the chat-template tests: @huggingface/jinja's rendering of each {template, context} of a JSON
// array. usage: node jinja_render.mjs NODE_MODULES_DIR IN.json OUT.json   (OUT: a JSON array of strings, or
// {"error": message} where the package refuses).
import fs from 'fs';
const {Template} = await import(process.argv[2] + '/@huggingface/jinja/dist/index.js');
const cases = JSON.parse(fs.readFileSync(process.argv[3], 'utf8'));
fs.writeFileSync(process.argv[4], JSON.stringify(cases.map(c => {
  try {
    return new Template(c.template).render(c.context);
  } catch (e) {
    return {error: String(e.message)};
  }
})));
