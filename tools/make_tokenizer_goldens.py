#!/usr/bin/env python3
"""Builds the tokenizer test data under tests/data/tokenizers/ from real vocabularies.

* qwen2.5/: tokenizer.json built by transformers (AutoTokenizer on vocab.json + merges.txt +
  tokenizer_config.json of /work/shared/models/tokenizers/qwen2.5, then save_pretrained), plus
  that directory's tokenizer_config.json, generation_config.json and config.json.
* llama2/: tokenizer.json converted by transformers' LlamaTokenizer from the sentencepiece
  tokenizer.model, with transformers' default behaviour (transformers 5: legacy=False, i.e. a
  Metaspace pre-tokenizer with prepend_scheme "first" and no normalizer), and a
  tokenizer_config.json as Llama-2-7b-hf's (bos <s>, eos </s>, add_bos_token true).
* goldens_*.json: for each corpus text, the ids of tokenizers.Tokenizer.encode(text,
  add_special_tokens=False) and decode(ids) with and without skip_special_tokens, for
  qwen2.5, llama2, llama2-legacy (llama2's tokenizer.json patched in memory to the legacy
  Llama-2-7b-hf form: Prepend("▁") + Replace(" ", "▁") normalizer, no pre-tokenizer, unk <unk>;
  test_tokenizer.cpp applies the same patch), llama2-metaspace (Metaspace pre-tokenizer with
  prepend_scheme "always" and split, Metaspace decoder) and gsm (models/gsm-synth-llama/tokenizer.json).

Usage: python3 tools/make_tokenizer_goldens.py  (needs tokenizers, transformers, sentencepiece,
protobuf). Texts with invalid UTF-8 cannot go through HF (it takes str only); the C++ tests cover
them directly.
"""
import json
import os
import shutil
import sys
import tempfile

import tokenizers
import transformers
from tokenizers import Tokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = "/work/shared/models/tokenizers"
OUT = os.path.join(ROOT, "tests", "data", "tokenizers")

CORPUS = [
    "Hello world",
    "The quick brown fox jumps over the lazy dog.",
    "It's a truth universally acknowledged, that a single man in possession of a good fortune, "
    "must be in want of a wife. I'm sure you'll agree; we'd all say they've done it.",
    " leading space",
    "   three leading spaces",
    "trailing spaces   ",
    "multiple    spaces   between     words",
    "\ttab\tseparated\t\tvalues\t",
    "line one\nline two\n\nline four\n\n\n",
    "\n\n\nleading newlines",
    "mixed \t \n \r\n whitespace  \n\t runs",
    " ",
    "",
    "\n",
    "1234567890 3.14159 -42 1,000,000 2024-06-01 0x1F 1e-9",
    "Numbers: 12345678901234567890123456789",
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    "for (int i = 0; i < 10; ++i) { sum += a[i] * b[i]; }  // dot\n",
    "<html><body class=\"x\">&amp; &lt;tag&gt;</body></html>",
    "if (x != y && z >= 0) { return x->y ?: nullptr; }",
    "Emoji: 😀 👍🏽 🇫🇷 ❤️ 🙂",
    "Family: 👨‍👩‍👧‍👦 and 🏳️‍🌈 ZWJ sequences",
    "中文测试：你好，世界！这是一个句子。",
    "日本語のテキストとカタカナ、ひらがな。",
    "한국어 텍스트 테스트",
    "العربية: مرحبا بالعالم",
    "Ελληνικά και русский текст",
    "Accents: café naïve résumé über façade São Paulo Ångström",
    "Special tokens: <|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|>",
    "text<|endoftext|>more text",
    "a <|endoftext|> b",
    "<s>[INST] Hello [/INST]</s>",
    "<s> leading bos",
    "x</s>y",
    "Unknown-ish chars: \u2028 \u00a0 \u3000 \ufeff end",
    "Math: ∑ ∫ √ ∞ ≠ ≤ ≥ ± × ÷ π",
    "Quotes: “smart” ‘single’ «guillemets» — dashes – …",
    "Mixed: abc123def 456ghi _under_score CamelCase snake_case kebab-case",
    "URL https://example.com/path?q=1&r=two#frag and email a.b@c.org",
    "'s 't 're 've 'm 'll 'd 'S 'T 'RE",
    "!!!??? ... --- *** ### @@@",
    "a\u0301 combining acute is NFD only in the non-NFC tokenizers",
    "▁ literal metaspace ▁▁ chars",
    "Ġ literal byte-level chars Ċ",
    "<0x41> literal byte token text",
    "    indented code\n\tand tab\n",
    "Question: Dan has 35 coins. Then they give away 27 coins. How many coins does Dan have now?\nAnswer:",
]

# Texts that the Qwen NFC normalizer (implemented in qspec for text already in NFC only) refuses.
NOT_NFC = {"a\u0301 combining acute is NFD only in the non-NFC tokenizers"}


def goldens(tokenizer, texts):
    cases = []
    for text in texts:
        ids = tokenizer.encode(text, add_special_tokens=False).ids
        cases.append({
            "text": text,
            "ids": ids,
            "decoded": tokenizer.decode(ids, skip_special_tokens=False),
            "decoded_skip_special": tokenizer.decode(ids, skip_special_tokens=True),
        })
    return cases


def write_json(path, obj):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, ensure_ascii=False, indent=1)
        f.write("\n")


def compact_copy(src, out_dir):
    """Copies a tokenizer.json without indentation (same content, a third smaller)."""
    with open(src, encoding="utf-8") as f:
        data = json.load(f)
    with open(os.path.join(out_dir, os.path.basename(src)), "w", encoding="utf-8") as f:
        json.dump(data, f, ensure_ascii=False, separators=(",", ":"))


def legacy_llama(llama_json):
    d = json.loads(llama_json)
    d["normalizer"] = {"type": "Sequence", "normalizers": [
        {"type": "Prepend", "prepend": "\u2581"},
        {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]}
    d["pre_tokenizer"] = None
    d["model"]["unk_token"] = "<unk>"
    return json.dumps(d, ensure_ascii=False)


def metaspace_llama(llama_json):
    d = json.loads(llama_json)
    d["pre_tokenizer"] = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always",
                          "split": True}
    d["decoder"] = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always",
                    "split": True}
    return json.dumps(d, ensure_ascii=False)


def main():
    os.makedirs(OUT, exist_ok=True)
    tmp = tempfile.mkdtemp()
    versions = {"tokenizers": tokenizers.__version__, "transformers": transformers.__version__}

    # Qwen2.5
    qwen_out = os.path.join(OUT, "qwen2.5")
    os.makedirs(qwen_out, exist_ok=True)
    qwen = transformers.AutoTokenizer.from_pretrained(os.path.join(SHARED, "qwen2.5"))
    qwen.save_pretrained(os.path.join(tmp, "qwen"))
    compact_copy(os.path.join(tmp, "qwen", "tokenizer.json"), qwen_out)
    for name in ("tokenizer_config.json", "generation_config.json", "config.json"):
        shutil.copyfile(os.path.join(SHARED, "qwen2.5", name), os.path.join(qwen_out, name))

    # Llama 2
    llama_out = os.path.join(OUT, "llama2")
    os.makedirs(llama_out, exist_ok=True)
    src = os.path.join(tmp, "llama_src")
    os.makedirs(src)
    shutil.copy(os.path.join(SHARED, "llama2", "tokenizer.model"), src)
    llama = transformers.LlamaTokenizer.from_pretrained(src)
    legacy_flag = getattr(llama, "legacy", None)
    llama.save_pretrained(os.path.join(tmp, "llama"))
    compact_copy(os.path.join(tmp, "llama", "tokenizer.json"), llama_out)
    write_json(os.path.join(llama_out, "tokenizer_config.json"), {
        "add_bos_token": True, "add_eos_token": False, "bos_token": "<s>", "eos_token": "</s>",
        "unk_token": "<unk>", "clean_up_tokenization_spaces": False, "legacy": legacy_flag,
        "tokenizer_class": "LlamaTokenizer"})

    qwen_tok = Tokenizer.from_file(os.path.join(qwen_out, "tokenizer.json"))
    llama_path = os.path.join(llama_out, "tokenizer.json")
    llama_tok = Tokenizer.from_file(llama_path)
    with open(llama_path, encoding="utf-8") as f:
        llama_text = f.read()
    legacy_tok = Tokenizer.from_str(legacy_llama(llama_text))
    metaspace_tok = Tokenizer.from_str(metaspace_llama(llama_text))
    gsm_tok = Tokenizer.from_file(os.path.join(ROOT, "models", "gsm-synth-llama", "tokenizer.json"))

    qwen_texts = [t for t in CORPUS if t not in NOT_NFC]
    for name, tok, texts in (("qwen2.5", qwen_tok, qwen_texts), ("llama2", llama_tok, CORPUS),
                             ("llama2-legacy", legacy_tok, CORPUS),
                             ("llama2-metaspace", metaspace_tok, CORPUS), ("gsm", gsm_tok, CORPUS)):
        write_json(os.path.join(OUT, "goldens_%s.json" % name), {
            "tokenizer": name, "versions": versions, "llama_legacy_flag": legacy_flag,
            "cases": goldens(tok, texts)})
        print("wrote goldens_%s.json (%d cases)" % (name, len(texts)))
    with open(os.path.join(OUT, "corpus.txt"), "w", encoding="utf-8") as f:
        f.write("# The golden corpus (one JSON string per line); see tools/make_tokenizer_goldens.py\n")
        for text in CORPUS:
            f.write(json.dumps(text, ensure_ascii=False) + "\n")
    shutil.rmtree(tmp)
    return 0


if __name__ == "__main__":
    sys.exit(main())
