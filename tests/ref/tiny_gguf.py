"""Tiny random-weight GGUF models for the reference tests (rope_ref.py,
arch_ref.py): the hyper-parameters given, the tokenizer of a real GGUF (our
loader needs a real one), the tensors given."""
from gguf import GGUFReader, GGUFValueType, GGUFWriter
from gguf.quants import quantize


def vocab_size(src):
    return len(GGUFReader(src).fields["tokenizer.ggml.tokens"].contents())


def write_gguf(path, src, arch, hp, tensors, kv=(), extra_control=(), chat_template=None):
    """hp: {"block_count", "context_length", "embedding_length", "feed_forward_length", "head_count",
    "head_count_kv", "rope_freq_base", "layer_norm_rms_eps", "rope_dimension_count"} and optionally
    "key_length"; kv: (key, value, GGUFValueType) written as they are; tensors: {name: numpy array};
    extra_control: tokens added at the vocabulary's end as control tokens; chat_template: in place of src's."""
    r = GGUFReader(src)
    w = GGUFWriter(path, arch)
    w.add_name("%s-test" % arch)
    w.add_block_count(hp["block_count"])
    w.add_context_length(hp["context_length"])
    w.add_embedding_length(hp["embedding_length"])
    w.add_feed_forward_length(hp["feed_forward_length"])
    w.add_head_count(hp["head_count"])
    w.add_head_count_kv(hp["head_count_kv"])
    w.add_rope_freq_base(hp["rope_freq_base"])
    w.add_layer_norm_rms_eps(hp["layer_norm_rms_eps"])
    w.add_rope_dimension_count(hp["rope_dimension_count"])
    if "key_length" in hp:
        w.add_key_length(hp["key_length"])
        w.add_value_length(hp["key_length"])
    for k, v, t in kv:
        w.add_key_value(k, v, t)
    for name, f in r.fields.items():
        if not name.startswith("tokenizer.") or (name == "tokenizer.chat_template" and chat_template):
            continue
        t = f.types[0]
        if t == GGUFValueType.ARRAY:
            v = f.contents()
            if name == "tokenizer.ggml.tokens":
                v = v + list(extra_control)
            elif name == "tokenizer.ggml.token_type":
                v = v + [3] * len(extra_control)
            w.add_key_value(name, v, t, sub_type=f.types[-1])
        else:
            w.add_key_value(name, f.contents(), t)
    if chat_template:
        w.add_key_value("tokenizer.chat_template", chat_template, GGUFValueType.STRING)
    for name, a in tensors.items():
        if isinstance(a, tuple):  # (float array, GGMLQuantizationType): stored quantized by the gguf package
            q = quantize(a[0], a[1])
            w.add_tensor(name, q, raw_shape=q.shape, raw_dtype=a[1])
        else:
            w.add_tensor(name, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
