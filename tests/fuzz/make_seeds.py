#!/usr/bin/env python3
"""Writes the committed seed corpora of the fuzz targets (tests/fuzz/corpus/).
Run it again after changing a format; the seeds are small on purpose: the
fuzzers and the replay driver grow them."""
import json, os, struct

HERE = os.path.dirname(os.path.abspath(__file__))


def put(target, name, data):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


# ---- OpenAI request bodies (fuzz_oai: first byte picks completion or chat)
comp = [
    {"model": "m", "prompt": "Hello", "max_tokens": 8},
    {"prompt": [1, 2, 3], "max_tokens": 4, "temperature": 0, "logprobs": 2, "echo": True},
    {"prompt": "x", "stop": ["\n", "END"], "stop_token_ids": [2], "logit_bias": {"5": -100, "7": 3.5},
     "n": 2, "seed": 7, "top_k": 5, "top_p": 0.9, "min_p": 0.1, "presence_penalty": 0.5,
     "frequency_penalty": 0.2, "repetition_penalty": 1.1, "min_tokens": 1, "ignore_eos": True,
     "priority": 1, "cache_salt": "t", "user": "u", "stream": True, "stream_options": {"include_usage": True}},
    {"prompt": "a\u0000b", "max_tokens": 1},
    # a batch refused inside an entry whose ids were already allocated (libFuzzer found them leaking)
    {"prompt": [[-3], -3], "": {}},
    {"prompt": [[1, 2], [3, -1]]},
]
chat = [
    {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
    {"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": [
        {"type": "text", "text": "one"}, {"type": "text", "text": "two"}]},
        {"role": "assistant", "content": None}, {"role": "developer", "content": "d"}],
     "max_completion_tokens": 3, "logprobs": True, "top_logprobs": 2, "add_generation_prompt": False},
    {"messages": [{"role": "user", "content": "x"}], "tools": [], "tool_choice": "auto", "response_format": {"type": "text"}},
]
for i, b in enumerate(comp):
    put("oai", "completion-%d" % i, b"c" + json.dumps(b).encode())
for i, b in enumerate(chat):
    put("oai", "chat-%d" % i, b"h" + json.dumps(b).encode())

# ---- chat templates (fuzz_chat): byte 0 the family, byte 1 flags, then
# messages as role byte + text, separated by 0x01; after 0x02, a template text
put("chat", "chatml", b"\x00\x01" + b"s be kind\x01u hello\x01a hi there\x01u more")
put("chat", "llama3", b"\x02\x00" + b"u what?\x01a this\x02{{ bos_token }}<|start_header_id|>")
put("chat", "smollm-template", b"\x00\x01u hi\x02{% if messages[0]['role'] != 'system' %}<|im_start|>system\n"
    b"You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n{% endif %}")
put("chat", "gemma", b"\x04\x01s sys\x01u a\x01u b\x01a c")
# model outputs with tool calls, in the three formats (the same bytes are parsed as an output)
put("chat", "tools-hermes", b"\x00\x00a<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>")
put("chat", "tools-llama3", b"\x02\x00<|python_tag|>{\"name\": \"add\", \"parameters\": {\"a\": 1}}; "
    b"{\"name\": \"get_weather\", \"parameters\": {}}")
put("chat", "tools-mistral", b"\x03\x00[TOOL_CALLS] [{\"name\": \"add\", \"arguments\": {\"a\": [1, 2]}, \"id\": \"a1b2c3d4e\"}]")

# ---- tokenizer inputs (fuzz_tokenizer: byte 0 bit 0 = parse special tokens)
for name, text in [("plain", "The quick brown fox jumps over the lazy dog."),
                   ("specials", "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"),
                   ("digits", "1234567890 3.14159 2026-12-01"),
                   ("mixed", "Жук 中文 العربية emoji 🚀 tabs\t\tnewlines\n\n"),
                   ("spaces", "a" + " " * 200 + "b"),
                   ("punct", "!?!?" * 50)]:
    put("tokenizer", name, b"\x01" + text.encode())


# ---- GGUF (fuzz_gguf): a tiny llama with a tokenizer
def gguf(kv, tensors, align=32):
    out = bytearray(b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kv)))
    def s(x):
        b = x.encode()
        return struct.pack("<Q", len(b)) + b
    for k, (t, v) in kv.items():
        out += s(k) + struct.pack("<I", t)
        if t == 8:
            out += s(v)
        elif t == 4:
            out += struct.pack("<I", v)
        elif t == 6:
            out += struct.pack("<f", v)
        elif t == 7:
            out += struct.pack("<B", v)
        elif t == 9:
            et, items = v
            out += struct.pack("<IQ", et, len(items))
            for it in items:
                out += s(it) if et == 8 else struct.pack("<i" if et == 5 else "<f", it)
    off, datas = 0, []
    for name, dims, data in tensors:
        out += s(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
        out += struct.pack("<IQ", 0, off)  # F32
        datas.append((off, data))
        off += (len(data) + align - 1) // align * align
    while len(out) % align:
        out += b"\0"
    base = len(out)
    out += b"\0" * off
    for o, d in datas:
        out[base + o:base + o + len(d)] = d
    return bytes(out)


D, H, V, C = 8, 16, 32, 16
toks = ["<unk>", "<s>", "</s>"] + ["<0x%02X>" % i for i in range(16)] + ["\u2581a", "b", "c", "ab", "\u2581ab",
                                                                       "d", "e", "de", "\u2581", "x", "y", "z", "xy"]
kv = {"general.architecture": (8, "llama"), "general.name": (8, "tiny"), "llama.context_length": (4, C),
      "llama.embedding_length": (4, D), "llama.feed_forward_length": (4, H), "llama.block_count": (4, 1),
      "llama.attention.head_count": (4, 2), "llama.attention.head_count_kv": (4, 1),
      "llama.attention.layer_norm_rms_epsilon": (6, 1e-5), "llama.rope.freq_base": (6, 10000.0),
      "tokenizer.ggml.model": (8, "llama"), "tokenizer.ggml.tokens": (9, (8, toks)),
      "tokenizer.ggml.scores": (9, (6, [float(-i) for i in range(len(toks))])),
      "tokenizer.ggml.token_type": (9, (5, [2, 3, 3] + [6] * 16 + [1] * (len(toks) - 19))),
      "tokenizer.ggml.bos_token_id": (4, 1), "tokenizer.ggml.eos_token_id": (4, 2),
      "tokenizer.chat_template": (8, "{{ '<|im_start|>' }}")}
f32 = lambda n: struct.pack("<%df" % n, *[((i * 37) % 17 - 8) / 64 for i in range(n)])
KV = D // 2
tensors = [("token_embd.weight", [D, V], f32(D * V)), ("output_norm.weight", [D], f32(D)),
           ("blk.0.attn_norm.weight", [D], f32(D)), ("blk.0.attn_q.weight", [D, D], f32(D * D)),
           ("blk.0.attn_k.weight", [D, KV], f32(D * KV)), ("blk.0.attn_v.weight", [D, KV], f32(D * KV)),
           ("blk.0.attn_output.weight", [D, D], f32(D * D)), ("blk.0.ffn_norm.weight", [D], f32(D)),
           ("blk.0.ffn_gate.weight", [D, H], f32(D * H)), ("blk.0.ffn_up.weight", [D, H], f32(D * H)),
           ("blk.0.ffn_down.weight", [H, D], f32(H * D))]
put("gguf", "tiny-llama", gguf(kv, tensors))
kv2 = dict(kv)
kv2["tokenizer.ggml.model"] = (8, "gpt2")
kv2["tokenizer.ggml.merges"] = (9, (8, ["a b", "d e", "x y"]))
kv2["tokenizer.ggml.pre"] = (8, "smollm")
put("gguf", "tiny-bpe", gguf(kv2, tensors[:2]))

# ---- llama2.c (fuzz_gguf takes these too: cm_model_open_mem tells them apart)
hdr = struct.pack("<7i", D, H, 1, 2, 2, -V, C)
n = D * V + D + D * D * 2 + D * D * 2 + D + D * H * 3 + D + C * (D // 2 // 2) * 2 + D * V
put("gguf", "tiny-llama2c", hdr + f32(n))
print("seeds written under", os.path.join(HERE, "corpus"))


# ---- raw HTTP to the gateway (fuzz_http): whole requests as a client sends them
def http(method, path, body=None, headers=None, key="fuzzkey", version="HTTP/1.1"):
    h = ["%s %s %s" % (method, path, version), "Host: localhost"]
    if key:
        h.append("Authorization: Bearer " + key)
    for k, v in (headers or {}).items():
        h.append("%s: %s" % (k, v))
    b = b""
    if body is not None:
        b = body if isinstance(body, bytes) else json.dumps(body).encode()
        if not any(k.lower() in ("content-length", "transfer-encoding") for k in (headers or {})):
            h.append("Content-Length: %d" % len(b))
        h.append("Content-Type: application/json")
    return ("\r\n".join(h) + "\r\n\r\n").encode() + b


put("http", "health", http("GET", "/health", key=None))
put("http", "models", http("GET", "/v1/models"))
put("http", "metrics", http("GET", "/metrics", key=None))
put("http", "chat", http("POST", "/v1/chat/completions", chat[0]))
put("http", "chat-stream", http("POST", "/v1/chat/completions", dict(chat[1], stream=True)))
put("http", "completion", http("POST", "/v1/completions", comp[2]))
put("http", "completion-ids", http("POST", "/v1/completions", comp[1]))
put("http", "no-key", http("POST", "/v1/completions", comp[0], key=None))
put("http", "wrong-method", http("DELETE", "/v1/completions", comp[0]))
put("http", "http10", http("POST", "/v1/completions", comp[0], version="HTTP/1.0"))
body = json.dumps(comp[0]).encode()
chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
put("http", "chunked", http("POST", "/v1/completions", chunked, {"Transfer-Encoding": "chunked"}))
put("http", "pipelined", http("GET", "/v1/models") + http("POST", "/v1/chat/completions", chat[2]) +
    http("GET", "/health", key=None))
put("http", "keepalive-close", http("POST", "/v1/completions", comp[3], {"Connection": "close"}))
put("http", "two-lengths", http("POST", "/v1/completions", body, {"Content-Length": "%d" % len(body),
                                                                   "content-length": "%d" % len(body)}))
put("http", "short-body", http("POST", "/v1/completions", body[:10], {"Content-Length": "%d" % len(body)}))
put("http", "bad-json", http("POST", "/v1/chat/completions", b'{"messages": [{"role": "user", "content": 5}'))

# ---- grammars (fuzz_grammar): byte 0 the kind (0 GBNF, 1 schema, 2 regex), the text, 0x00, bytes to feed
put("grammar", "gbnf-list", b"\x00" + b'root ::= "[" (item ("," item)*)? "]"\nitem ::= [0-9]+ | root' + b"\x00[1,[2,3],[]]")
put("grammar", "gbnf-utf8", b"\x00" + b'root ::= [^a-z\\u00e9]{1,3} "!"? # c\n' + b"\x00\xc3\xa8\xe6\x97\xa5!")
put("grammar", "gbnf-repeat", b"\x00" + b'root ::= x{2,5} ("a" | "b")* \nx ::= "xy"?' + b"\x00xyxyab")
put("grammar", "schema-person", b"\x01" + json.dumps({
    "type": "object", "properties": {"name": {"type": "string", "maxLength": 8}, "age": {"type": "integer"},
                                     "tags": {"type": "array", "items": {"enum": ["a", 1, None]}, "maxItems": 2}},
    "required": ["name"], "additionalProperties": False}).encode() + b'\x00{"name":"bo","age":-3,"tags":["a",1]}')
put("grammar", "schema-ref", b"\x01" + json.dumps({
    "$defs": {"n": {"anyOf": [{"type": "null"}, {"type": "object", "properties": {"next": {"$ref": "#/$defs/n"}}}]}},
    "$ref": "#/$defs/n"}).encode() + b'\x00{"next":{"next":null}}')
put("grammar", "schema-formats", b"\x01" + json.dumps({"type": "array", "prefixItems": [
    {"type": "string", "format": "date-time"}, {"type": "string", "format": "uuid"}], "items": False}).encode() +
    b'\x00["2024-01-01T00:00:00Z"]')
put("grammar", "regex", b"\x02" + b"^(?:[a-z]+\\.)*\\d{2,3}[^\\s]?$" + b"\x00ab.cd.12x")

# ---- Hugging Face files (fuzz_hf): a safetensors file and a WordPiece tokenizer.json
def safetensors(tensors):
    hdr, data = {"__metadata__": {"format": "pt"}}, b""
    for name, dtype, shape, size, *given in tensors:
        hdr[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + size]}
        data += given[0] if given else bytes(i % 251 for i in range(size))
    h = json.dumps(hdr).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + data


put("hf", "tiny-st", safetensors([("a", "F32", [2, 3], 24), ("b", "F16", [4], 8), ("ids", "I64", [1, 2], 16),
                                   ("e", "BF16", [0], 0)]))
# a GPTQ layer of 64 inputs, 8 outputs, groups of 32 (valid under the 4-bit g32 config), and an AWQ one
put("hf", "gptq-layer", safetensors([("l.qweight", "I32", [8, 8], 256), ("l.qzeros", "I32", [2, 1], 8),
                                     ("l.scales", "F16", [2, 8], 32), ("l.g_idx", "I32", [64], 256,
                                      struct.pack("<64i", *[(k * 5 + 3) % 64 // 32 for k in range(64)]))]))
put("hf", "awq-layer", safetensors([("l.qweight", "I32", [64, 1], 256), ("l.qzeros", "I32", [2, 1], 8),
                                    ("l.scales", "F16", [2, 8], 32)]))
put("hf", "tiny-wordpiece", json.dumps({
    "model": {"type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##",
              "max_input_chars_per_word": 100,
              "vocab": {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "hello": 4, "world": 5, "##s": 6, ",": 7,
                        "caf": 8, "##e": 9, "数": 10}},
    "added_tokens": [{"id": 2, "content": "[CLS]", "special": True}, {"id": 3, "content": "[SEP]", "special": True}],
    "normalizer": {"type": "BertNormalizer", "clean_text": True, "handle_chinese_chars": True,
                   "strip_accents": None, "lowercase": True},
    "pre_tokenizer": {"type": "BertPreTokenizer"},
    "post_processor": {"type": "TemplateProcessing", "single": [
        {"SpecialToken": {"id": "[CLS]", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
        {"SpecialToken": {"id": "[SEP]", "type_id": 0}}]}}))


# ---- KV disk tier block files (fuzz_kvblock: first byte odd makes a valid file of the rest, then damages it)
put("kvblock", "valid", bytes([1]) + bytes(range(7, 7 + 40)))
put("kvblock", "valid-damaged", bytes([3]) + bytes(range(40)) + bytes([70, 0, 0x10]))
put("kvblock", "raw-junk", bytes([0]) + b"LLMSKVB1" + bytes(120))
