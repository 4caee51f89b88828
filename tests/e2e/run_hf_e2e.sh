#!/usr/bin/env bash
# Hugging Face checkpoints and tokenizers against the reference library.
# Unigram tokenizer.json files trained here with `tokenizers` (plain, byte
# fallback, a template adding </s>): tokjson_test compares our ids with its.
# Llama-family: the default GGUF written as an F16 and a BF16 Hugging Face
# directory by tests/ref/gguf_to_hf.py (the `gguf`, `safetensors` and
# `tokenizers` packages, in a venv of their own), then hf_test compares each
# with the GGUF (tokenizer against `tokenizers`, logits, greedy tokens) and
# `llmserve generate` runs the F16 one.
#   run_hf_e2e.sh BUILD_DIR MODEL
# Exit 77 (skipped) when the model or the packages cannot be had.
set -uo pipefail
BUILD=$1
MODEL=$2
HERE=$(cd "$(dirname "$0")" && pwd)
[ -f "$MODEL" ] || { echo "model $MODEL not found: run tools/setup.sh"; exit 77; }
. "$HERE/ref_venv.sh"
ref_venv "$BUILD"
OUT=$(mktemp -d "$BUILD/hf-e2e.XXXXXX")
trap 'rm -rf "$OUT"' EXIT
rc=0
# Unigram: models trained here with `tokenizers` (plain; with byte fallback; with a template adding </s>)
"$VENV/bin/python" - "$HERE/../data/paraphrase_pairs.jsonl" "$OUT" <<'PY' || exit 1
import json, sys
from tokenizers import Tokenizer, models, pre_tokenizers, decoders, trainers, processors
pairs = [json.loads(l) for l in open(sys.argv[1]) if '"a"' in l]
corpus = [p["a"] for p in pairs] + [p["b"] for p in pairs]
tok = Tokenizer(models.Unigram())
tok.pre_tokenizer = pre_tokenizers.Metaspace()
tok.decoder = decoders.Metaspace()
tok.train_from_iterator(corpus, trainers.UnigramTrainer(vocab_size=600, special_tokens=["<unk>", "<s>", "</s>"],
                                                        unk_token="<unk>"))
texts = ["What is the capital of France?", "How do I reset my password?", "Hello world, the cafe is open now!",
         "  two leading spaces", "tabs\tand\nnewlines", "Ünïcödé naïve café 東京 🤖", "xyzzy qwerty zxcvb",
         "numbers 1234567 and 3.14159", "<s> specials </s> in text", "a", "", "multiple     spaces"]
def dump(t, name, specials):
    t.save("%s/%s.json" % (sys.argv[2], name))
    json.dump([{"text": s, "ids": t.encode(s, add_special_tokens=bool(specials)).ids} for s in texts],
              open("%s/%s.ids.json" % (sys.argv[2], name), "w"))
dump(tok, "unigram", 0)
j = json.loads(tok.to_str())  # byte fallback: 256 byte pieces, the rarest of all
j["model"]["byte_fallback"] = True
low = min(s for _, s in j["model"]["vocab"]) - 1
j["model"]["vocab"] += [["<0x%02X>" % b, low] for b in range(256)]
dump(Tokenizer.from_str(json.dumps(j)), "unigram-bytes", 0)
tok.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 2)])
dump(tok, "unigram-eos", 1)
PY
for u in unigram:0 unigram-bytes:0 unigram-eos:1; do
    "$BUILD/tests/tokjson_test" "$OUT/${u%%:*}.json" "$OUT/${u%%:*}.ids.json" "${u##*:}" || rc=1
done
for dt in f16 bf16; do
    "$VENV/bin/python" "$HERE/../ref/gguf_to_hf.py" "$MODEL" "$OUT/$dt" --dtype "$dt" || exit 1
    "$VENV/bin/python" - "$OUT/$dt/tokenizer.json" "$OUT/ids.json" <<'PY'
import json, sys
from tokenizers import Tokenizer
t = Tokenizer.from_file(sys.argv[1])
texts = ["Hello world", "The capital of France is Paris.", "  leading spaces and\ttabs\n\nnewlines",
         "Numbers 1234567 and 3.14159, dates 2026-12-02", "def f(x):\n    return x ** 2  # square",
         "Ünïcödé: naïve café, 東京, 서울, emoji 🤖", "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
         "don't won't it's I'm we'll they've", "URL https://example.org/a?b=c&d=e", "a" * 300,
         "   ", "multiple     spaces between     words"]
json.dump([{"text": s, "ids": t.encode(s, add_special_tokens=False).ids} for s in texts], open(sys.argv[2], "w"))
PY
    "$BUILD/tests/hf_test" "$MODEL" "$OUT/$dt" "$OUT/ids.json" || rc=1
    if [ $dt = f16 ]; then
        a=$("$BUILD/llmserve" generate --model "$MODEL" --prompt "The capital of France is" -n 8 --temperature 0 --threads 2 2>/dev/null)
        b=$("$BUILD/llmserve" generate --model "$OUT/f16" --prompt "The capital of France is" -n 8 --temperature 0 --threads 2 2>/dev/null)
        echo "generate: GGUF '$a' / Hugging Face F16 '$b'"
        [ -n "$b" ] || { echo "FAIL: generate from the Hugging Face directory printed nothing"; rc=1; }
    fi
    rm -rf "$OUT/$dt"
done
exit $rc
