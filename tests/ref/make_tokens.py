#!/usr/bin/env python3
"""Reference tokenizations of the default model, made by an independent
implementation: Hugging Face `tokenizers` (Rust) built from the GGUF's own
vocabulary and merges with SmolLM2's published pre-tokenizer (individual
digits, then GPT-2 byte-level regex) and its special tokens.

    python3 tests/ref/make_tokens.py MODEL.gguf > tests/data/smollm2_tokens.json
"""
import json
import sys

from gguf import GGUFReader
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

CASES = [
    "", " ", "  ", "   ", "\t", "\n", "\n\n", "\n\n\n", "\t\n", "Hello world", " Hello world",
    "Hello World", " Hello World", " Hello World!", "Hello, world!", " this is 🦙.cpp",
    "w048 7tuijk dsdfhu", "нещо на Български", "កាន់តែពិសេសអាចខលចេញ", "🚀 (normal) 😶‍🌫️ (multiple emojis concatenated) ✅ (only emoji that has its own token)",
    "Hello", " Hello", "  Hello", "   Hello", "    Hello", "    Hello\n    Hello", " (", "\n =",
    "' era", "Hello, y'all! How are you 😁 ?我想在apple工作1314151天～", "!!!!!!", "3", "33", "333", "3333",
    "33333", "333333", "3333333", "33333333", "333333333", "Cửa Việt", " discards", "12.5% of 1,234,567",
    "I've been 'there' and they'll say we're done, don't they? It's 'd",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n-1) + fibonacci(n-2)\n",
    "int main(void) { printf(\"%d\\n\", 42); return 0; }", "  \t  mixed \u00a0 spaces\u3000and\u2003more  ",
    "naïve café résumé façade", "Ελληνικά και Русский и 日本語のテキスト", "مرحبا بالعالم", "שלום עולם",
    "emoji: 👍🏽👨‍👩‍👧‍👦🇫🇷", "URL https://example.com/path?q=1&r=2#frag", "email a.b+c@d.co.uk",
    "<|im_start|>user\nHi<|im_end|>\n", "text<|endoftext|>more", "<|im_start|><|im_end|>",
    "The capital of France is",
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
    "def fibonacci(n):\n    ", "Once upon a time, in a small village by the sea,",
    "trailing spaces   ", "   leading spaces", "a\r\nb\rc", "ALLCAPS and MiXeD CaSe", "x" * 300,
    "1234567890" * 5, "$$$ ### @@@ %%% ^^^", "\u200b zero width\u200d joiner", "\ufeffBOM at start",
]


def main():
    r = GGUFReader(sys.argv[1])
    f = {k: v for k, v in r.fields.items()}
    toks = f["tokenizer.ggml.tokens"].contents()
    types = f["tokenizer.ggml.token_type"].contents()
    merges = [tuple(m.split(" ", 1)) for m in f["tokenizer.ggml.merges"].contents()]
    vocab = {t: i for i, t in enumerate(toks)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t, ty in zip(toks, types) if ty == 3])
    cases = []
    for c in CASES:
        ids = tok.encode(c, add_special_tokens=False).ids
        cases.append({"text": c, "ids": ids})
    json.dump({"made_by": "tests/ref/make_tokens.py (HF tokenizers %s)" % __import__("tokenizers").__version__,
               "model_sha256": "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
               "cases": cases}, sys.stdout, ensure_ascii=False, indent=0)


if __name__ == "__main__":
    main()
