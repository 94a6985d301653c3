#!/usr/bin/env node
// Prints the general category that HF tokenizers' regex engine (Oniguruma, as Split patterns
// use it) gives each code point, as ranges "FIRST..LAST Xx", one a line; code points in no
// category (Cn) and surrogates are left out.
// Usage: NODE_PATH=DIR/node_modules node hf-unicode-categories.js > hf-unicode-categories.txt
// where DIR holds `npm install @anush008/tokenizers@0.6.0` (the Rust library, 0.22.2).
const { Tokenizer } = require("@anush008/tokenizers");

const categories = ["Lu", "Ll", "Lt", "Lm", "Lo", "Mn", "Mc", "Me", "Nd", "Nl", "No",
  "Pc", "Pd", "Ps", "Pe", "Pi", "Pf", "Po", "Sm", "Sc", "Sk", "So", "Zs", "Zl", "Zp",
  "Cc", "Cf", "Co"];

// splitter returns the pre-tokenizer of a tokenizer whose only Split pattern is re.
function splitter(re) {
  return Tokenizer.fromString(JSON.stringify({
    version: "1.0", truncation: null, padding: null, added_tokens: [], normalizer: null,
    pre_tokenizer: { type: "Split", pattern: { Regex: re }, behavior: "Isolated", invert: false },
    post_processor: null, decoder: null,
    model: { type: "WordLevel", vocab: { "[UNK]": 0 }, unk_token: "[UNK]" },
  })).getPreTokenizer();
}

const category = new Map(); // code point -> category
for (const cat of categories) {
  const split = splitter(`\\p{${cat}}`);
  // Each code point is followed by a separator outside the category, so a code point in it
  // is a piece of its own and one outside it joins its separators in a longer piece.
  const sep = cat === "Cc" ? "a" : "\x01";
  for (let base = 0; base < 0x110000; base += 0x10000) {
    const text = [];
    for (let cp = base; cp < base + 0x10000; cp++) {
      if (cp < 0xd800 || cp > 0xdfff) text.push(String.fromCodePoint(cp), sep);
    }
    for (const [piece] of split.preTokenizeString(text.join(""))) {
      const cps = [...piece];
      if (cps.length !== 1 || cps[0] === sep) continue;
      const cp = cps[0].codePointAt(0);
      if (category.has(cp)) throw new Error(`U+${cp.toString(16)} is in ${category.get(cp)} and ${cat}`);
      category.set(cp, cat);
    }
  }
}

const hex = (cp) => cp.toString(16).toUpperCase().padStart(4, "0");
const lines = [];
let first = -1, last = -1, cur = "";
for (let cp = 0; cp <= 0x110000; cp++) {
  const cat = cp < 0x110000 ? category.get(cp) || "" : "";
  if (cat === cur && cat !== "") { last = cp; continue; }
  if (cur !== "") lines.push(`${hex(first)}..${hex(last)} ${cur}`);
  first = last = cp; cur = cat;
}
process.stdout.write(lines.join("\n") + "\n");
