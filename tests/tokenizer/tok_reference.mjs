// tok_reference.mjs: the reference side of tok_reference.sh: the ids
// @huggingface/tokenizers (tokenizers.js) gives, one line per file.
//   node tok_reference.mjs MODULE_DIR TOKENIZER_DIR [--no-special] FILE...
//   node tok_reference.mjs MODULE_DIR TOKENIZER_DIR --decode [--no-special] FILE...
// (--decode: after each line of ids the hex of their decoding as UTF-8,
// special tokens kept, without transformers' clean-up of spaces, which
// the Rust library does not do)
// The bytes of each file become a string as the WHATWG TextDecoder makes
// them (each maximal invalid UTF-8 sequence is one U+FFFD): a JavaScript
// tokenizer only ever sees strings.
import fs from "node:fs";
import path from "node:path";
import { pathToFileURL } from "node:url";

const [moddir, tokdir, ...rest] = process.argv.slice(2);
const { Tokenizer } = await import(
  pathToFileURL(path.join(moddir, "@huggingface/tokenizers/dist/tokenizers.mjs")).href);
const json = JSON.parse(fs.readFileSync(path.join(tokdir, "tokenizer.json"), "utf8"));
const cfgPath = path.join(tokdir, "tokenizer_config.json");
const cfg = fs.existsSync(cfgPath) ? JSON.parse(fs.readFileSync(cfgPath, "utf8")) : {};
const tok = new Tokenizer(json, cfg);
let special = true, decode = false, bench = 0;
let files = rest;
for (;;) {
  if (files[0] === "--no-special") { special = false; files = files.slice(1); }
  else if (files[0] === "--decode") { decode = true; files = files.slice(1); }
  else if (files[0] === "--bench") { bench = Number(files[1]); files = files.slice(2); }
  else break;
}
const dec = new TextDecoder("utf-8");
const texts = files.map((f) => dec.decode(fs.readFileSync(f)));
if (bench > 0) {
  const bytes = files.reduce((s, f) => s + fs.statSync(f).size, 0);
  let done = 0, ntok = 0;
  const t0 = process.hrtime.bigint();
  let dt = 0;
  do {
    for (const t of texts) ntok += tok.encode(t, { add_special_tokens: false }).ids.length;
    done += bytes;
    dt = Number(process.hrtime.bigint() - t0) / 1e9;
  } while (dt < bench);
  console.log(`${(done / dt / 1e6).toFixed(2)} MB/s ${(ntok / dt).toFixed(0)} tokens/s`);
} else {
  for (const t of texts) {
    const ids = tok.encode(t, { add_special_tokens: special }).ids;
    console.log(ids.join(" "));
    if (decode) {
      const text = ids.length ? tok.decode(ids, { skip_special_tokens: false,
                                                 clean_up_tokenization_spaces: false }) : "";
      console.log(Buffer.from(text, "utf8").toString("hex"));
    }
  }
}
