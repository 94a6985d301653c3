#!/usr/bin/env node
// Prints the code points that HF tokenizers takes for word characters where it checks a
// single_word added token's boundaries, as ranges "FIRST..LAST", one a line. It asks the Rust
// library, for every code point c, whether the single_word token "kqz" matches in c + "kqz"
// and in "kqz" + c (between two tokens "<D>" that cut the text into one question each).
// Usage: NODE_PATH=DIR/node_modules node hf-word-chars.js QWEN3_TOKENIZER_JSON > hf-word-chars.txt
// where DIR holds `npm install @anush008/tokenizers@0.6.0` (the Rust library, 0.22.2).
const { Tokenizer } = require("@anush008/tokenizers");
const fs = require("fs");

const j = JSON.parse(fs.readFileSync(process.argv[2], "utf8"));
j.normalizer = null;
const added = (id, content, more) => ({ id, content, single_word: false, lstrip: false, rstrip: false,
  normalized: false, special: false, ...more });
const word = 151669, cut = 151670;
j.added_tokens.push(added(word, "kqz", { single_word: true }), added(cut, "<D>"));
const tok = Tokenizer.fromString(JSON.stringify(j));

(async () => {
  const cps = [];
  for (let c = 0; c <= 0x10ffff; c++) if (c < 0xd800 || c > 0xdfff) cps.push(c);
  const isWord = new Map(); // code point -> [before, after]
  for (const side of [0, 1]) {
    for (let i = 0; i < cps.length; i += 2000) {
      const chunk = cps.slice(i, i + 2000);
      const text = "<D>" + chunk.map((c) => (side === 0 ? String.fromCodePoint(c) + "kqz" : "kqz" + String.fromCodePoint(c)) + "<D>").join("");
      const ids = Array.from((await tok.encode(text, null, { addSpecialTokens: false })).getIds());
      const pieces = [];
      let cur = null;
      for (const id of ids) {
        if (id === cut) {
          if (cur) pieces.push(cur);
          cur = [];
        } else cur.push(id);
      }
      if (pieces.length !== chunk.length) throw new Error(`${pieces.length} answers for ${chunk.length} questions at ${i}`);
      chunk.forEach((c, k) => {
        const a = isWord.get(c) || [false, false];
        a[side] = !pieces[k].includes(word);
        isWord.set(c, a);
      });
    }
  }
  const hex = (c) => c.toString(16).toUpperCase().padStart(4, "0");
  const lines = [];
  let first = -1, last = -2;
  for (const c of cps) {
    const [before, after] = isWord.get(c);
    if (before !== after) throw new Error(`U+${hex(c)} is a word character on one side only`);
    if (!before) continue;
    if (c === last + 1) { last = c; continue; }
    if (first >= 0) lines.push(`${hex(first)}..${hex(last)}`);
    first = last = c;
  }
  if (first >= 0) lines.push(`${hex(first)}..${hex(last)}`);
  process.stdout.write(lines.join("\n") + "\n");
})();
