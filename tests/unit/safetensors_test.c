/* safetensors reader and Hugging Face checkpoint directories: valid files,
 * and truncated, inconsistent and hostile ones, which must give errors (the
 * buffers are exact-size heap copies, so an ASan build catches any
 * over-read). Then tiny BERT and llama directories written here: tensors
 * renamed the GGUF way, the sentence-transformers pooling read, and the
 * refusals (unknown model types, shard and module names that leave the
 * directory, weights of types that do not load). */
#include "cm_dtype.h"
#include "cm_error.h"
#include "cm_model.h"
#include "cm_safetensors.h"
#include "cm_tokenizer.h"
#include "tst.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* A safetensors image: the header padded with spaces to pad bytes (0: to a multiple of 8), then data_len bytes. */
static uint8_t *image(const char *hdr, size_t pad, size_t data_len, size_t *n) {
    size_t hl = strlen(hdr), H = pad ? (pad > hl ? pad : hl) : (hl + 7) / 8 * 8; /* writers pad to 8 */
    *n = 8 + H + data_len;
    uint8_t *p = malloc(*n);
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)((uint64_t)H >> (8 * i));
    memcpy(p + 8, hdr, hl);
    memset(p + 8 + hl, ' ', H - hl);
    for (size_t i = 0; i < data_len; i++) p[8 + H + i] = (uint8_t)i;
    return p;
}

static int try_open(const char *hdr, size_t pad, size_t data_len) {
    size_t n;
    uint8_t *p = image(hdr, pad, data_len, &n);
    cm_safetensors *s = NULL;
    char err[400] = "";
    int rc = cm_st_open_mem(p, n, &s, err, sizeof err);
    if (rc) printf("  refused: %s\n", err);
    cm_st_close(s);
    free(p);
    return rc;
}

static void reader(void) {
    const char *ok = "{\"__metadata__\":{\"format\":\"pt\"},\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]},"
                     "\"b\":{\"dtype\":\"F16\",\"shape\":[4],\"data_offsets\":[24,32]},"
                     "\"ids\":{\"dtype\":\"I64\",\"shape\":[1,2],\"data_offsets\":[32,48]}}";
    size_t n;
    uint8_t *p = image(ok, 256, 48, &n);
    cm_safetensors *s = NULL;
    char err[400] = "";
    CHECK_RC(cm_st_open_mem(p, n, &s, err, sizeof err), 0);
    if (!s) printf("  %s\n", err);
    if (s) {
        CHECK_INT(s->n_tensors, 3);
        const cm_st_tensor *a = cm_st_find(s, "a"), *b = cm_st_find(s, "b"), *ids = cm_st_find(s, "ids");
        CHECK(a && b && ids && !cm_st_find(s, "__metadata__"));
        if (a && b && ids) {
            CHECK_INT(a->type, CM_F32);
            CHECK_INT(a->n_dims, 2);
            CHECK_INT(a->ne[0], 3); /* the last dimension is the contiguous one */
            CHECK_INT(a->ne[1], 2);
            CHECK(a->data == p + 8 + 256);
            CHECK_INT(b->type, CM_F16);
            CHECK_INT(b->nbytes, 8);
            CHECK(b->data == p + 8 + 256 + 24);
            CHECK_INT(ids->type, CM_I64);
        }
    }
    cm_st_close(s);
    free(p);
    /* hostile and broken files */
    CHECK_RC(try_open(ok, 256, 40), LLM_ETRUNC);   /* a tensor runs past the buffer */
    CHECK_RC(try_open(ok, 256, 56), LLM_EFORMAT);  /* bytes no tensor covers */
    CHECK_RC(try_open("not json at all", 0, 0), LLM_EFORMAT);
    CHECK_RC(try_open("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}", 0, 8), LLM_EFORMAT); /* cut JSON */
    CHECK_RC(try_open("[1,2,3]", 0, 0), LLM_EFORMAT);
    CHECK_RC(try_open("{\"a\":{\"dtype\":\"Q4\",\"shape\":[2],\"data_offsets\":[0,8]}}", 0, 8), LLM_EFORMAT);
    CHECK_RC(try_open("{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 0, 8), LLM_EFORMAT);
    CHECK_RC(try_open("{\"a\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 0, 8), LLM_EFORMAT);
    CHECK_RC(try_open("{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,2],\"data_offsets\":[0,8]}}", 0, 8), LLM_EUNSUP);
    CHECK_RC(try_open("{\"a\":{\"dtype\":\"F32\",\"shape\":[1099511627776,1099511627776],\"data_offsets\":[0,8]}}", 0, 8),
             LLM_EFORMAT);
    CHECK_RC(try_open("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", 0, 8), LLM_EFORMAT);
    CHECK_RC(try_open("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0]}}", 0, 8), LLM_EFORMAT);
    CHECK_RC(try_open("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                      "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 0, 12), LLM_EFORMAT); /* overlap */
    CHECK_RC(try_open("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                      "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[12,20]}}", 0, 20), LLM_EFORMAT); /* gap */
    CHECK_RC(try_open("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                      "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}", 0, 16), LLM_EFORMAT); /* twice */
    CHECK_RC(try_open("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 63, 8), LLM_EFORMAT); /* misaligned */
    CHECK_RC(try_open("{\"__metadata__\":[1],\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 0, 8),
             LLM_EFORMAT);
    CHECK_RC(try_open("{\"a\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]}}", 0, 0), 0); /* empty is fine */
    uint8_t tiny[5] = {1, 0, 0, 0, 0};
    cm_safetensors *t = NULL;
    CHECK_RC(cm_st_open_mem(tiny, sizeof tiny, &t, NULL, 0), LLM_ETRUNC);
    uint8_t huge[16] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f, '{', '}'};
    CHECK_RC(cm_st_open_mem(huge, sizeof huge, &t, NULL, 0), LLM_EFORMAT);
    uint8_t longer[12] = {100, 0, 0, 0, 0, 0, 0, 0, '{', '}'};
    CHECK_RC(cm_st_open_mem(longer, sizeof longer, &t, NULL, 0), LLM_ETRUNC);
}

/* ---- Hugging Face directories ------------------------------------------- */

typedef struct { const char *name, *dtype; uint64_t shape[2]; int nd; } spec;

static void write_file(const char *dir, const char *name, const char *text) {
    char p[600];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "w");
    fputs(text, f);
    fclose(f);
}

/* model.safetensors with the given tensors, small values from a counter. */
static void write_st(const char *dir, const char *file, const spec *t, int n) {
    char hdr[16384] = "{";
    size_t off = 0, o = 1;
    for (int i = 0; i < n; i++) {
        uint64_t cnt = t[i].shape[0] * (t[i].nd > 1 ? t[i].shape[1] : 1);
        uint64_t sz = cnt * (!strcmp(t[i].dtype, "F16") ? 2 : !strcmp(t[i].dtype, "I64") ? 8 : 4);
        char shape[64];
        if (t[i].nd > 1) snprintf(shape, sizeof shape, "[%llu,%llu]", (unsigned long long)t[i].shape[0], (unsigned long long)t[i].shape[1]);
        else snprintf(shape, sizeof shape, "[%llu]", (unsigned long long)t[i].shape[0]);
        o += (size_t)snprintf(hdr + o, sizeof hdr - o, "%s\"%s\":{\"dtype\":\"%s\",\"shape\":%s,\"data_offsets\":[%zu,%zu]}",
                              i ? "," : "", t[i].name, t[i].dtype, shape, off, off + sz);
        off += sz;
    }
    snprintf(hdr + o, sizeof hdr - o, "}");
    size_t H = (strlen(hdr) + 7) / 8 * 8, n_img;
    uint8_t *img = image(hdr, H, off, &n_img);
    for (size_t i = 8 + H; i + 4 <= n_img; i += 4) { /* floats near 1: any F32 data is plausible */
        float v = 0.5f + (float)((i / 4) % 7) * 0.01f;
        memcpy(img + i, &v, 4);
    }
    char p[600];
    snprintf(p, sizeof p, "%s/%s", dir, file);
    FILE *f = fopen(p, "wb");
    fwrite(img, 1, n_img, f);
    fclose(f);
    free(img);
}

static const char *bert_config = "{\"model_type\":\"bert\",\"hidden_size\":32,\"num_attention_heads\":2,"
                                 "\"num_hidden_layers\":1,\"intermediate_size\":64,\"vocab_size\":8,"
                                 "\"max_position_embeddings\":16,\"type_vocab_size\":2,\"hidden_act\":\"gelu\","
                                 "\"layer_norm_eps\":1e-12}";

static int bert_specs(spec *s) {
    static const char *top[][2] = {{"embeddings.word_embeddings.weight", "8"}, {"embeddings.position_embeddings.weight", "16"},
                                   {"embeddings.token_type_embeddings.weight", "2"}};
    int n = 0;
    for (int i = 0; i < 3; i++) s[n++] = (spec){top[i][0], "F32", {(uint64_t)atoi(top[i][1]), 32}, 2};
    s[n++] = (spec){"embeddings.LayerNorm.weight", "F32", {32}, 1};
    s[n++] = (spec){"embeddings.LayerNorm.bias", "F16", {32}, 1};
    static const char *mats[][3] = {{"attention.self.query", "32", "32"}, {"attention.self.key", "32", "32"},
                                    {"attention.self.value", "32", "32"}, {"attention.output.dense", "32", "32"},
                                    {"intermediate.dense", "64", "32"}, {"output.dense", "32", "64"}};
    static char names[64][96];
    int k = 0;
    for (int i = 0; i < 6; i++) {
        snprintf(names[k], 96, "encoder.layer.0.%s.weight", mats[i][0]);
        s[n++] = (spec){names[k++], "F32", {(uint64_t)atoi(mats[i][1]), (uint64_t)atoi(mats[i][2])}, 2};
        snprintf(names[k], 96, "encoder.layer.0.%s.bias", mats[i][0]);
        s[n++] = (spec){names[k++], "F32", {(uint64_t)atoi(mats[i][1])}, 1};
    }
    static const char *lns[] = {"attention.output.LayerNorm", "output.LayerNorm"};
    for (int i = 0; i < 2; i++) {
        snprintf(names[k], 96, "encoder.layer.0.%s.gamma", lns[i]); /* the old spelling */
        s[n++] = (spec){names[k++], "F32", {32}, 1};
        snprintf(names[k], 96, "encoder.layer.0.%s.beta", lns[i]);
        s[n++] = (spec){names[k++], "F32", {32}, 1};
    }
    s[n++] = (spec){"embeddings.position_ids", "I64", {1, 16}, 2}; /* not a weight: skipped */
    s[n++] = (spec){"pooler.dense.weight", "F32", {32, 32}, 2};
    return n;
}

static const char *wp_tokenizer =
    "{\"model\":{\"type\":\"WordPiece\",\"unk_token\":\"[UNK]\",\"continuing_subword_prefix\":\"##\","
    "\"max_input_chars_per_word\":100,\"vocab\":{\"[PAD]\":0,\"[UNK]\":1,\"[CLS]\":2,\"[SEP]\":3,\"hello\":4,"
    "\"world\":5,\"##s\":6,\",\":7}},\"added_tokens\":[{\"id\":2,\"content\":\"[CLS]\",\"special\":true},"
    "{\"id\":3,\"content\":\"[SEP]\",\"special\":true}],\"normalizer\":{\"type\":\"BertNormalizer\","
    "\"clean_text\":true,\"handle_chinese_chars\":true,\"strip_accents\":null,\"lowercase\":true},"
    "\"pre_tokenizer\":{\"type\":\"BertPreTokenizer\"},\"post_processor\":{\"type\":\"TemplateProcessing\","
    "\"single\":[{\"SpecialToken\":{\"id\":\"[CLS]\",\"type_id\":0}},{\"Sequence\":{\"id\":\"A\",\"type_id\":0}},"
    "{\"SpecialToken\":{\"id\":\"[SEP]\",\"type_id\":0}}]}}";

static int open_dir(const char *dir) {
    cm_model_file *m = NULL;
    char err[600] = "";
    int rc = cm_model_open(dir, &m, err, sizeof err);
    if (rc) printf("  refused: %s\n", err);
    cm_model_close(m);
    return rc;
}

static void hf_dirs(void) {
    char dir[] = "/tmp/llmserve-hf-XXXXXX";
    if (!mkdtemp(dir)) {
        CHECK(0);
        return;
    }
    spec s[64];
    int n = bert_specs(s);
    write_file(dir, "config.json", bert_config);
    write_st(dir, "model.safetensors", s, n);
    write_file(dir, "tokenizer.json", wp_tokenizer);
    cm_model_file *m = NULL;
    char err[600] = "";
    CHECK_RC(cm_model_open(dir, &m, err, sizeof err), 0);
    if (m) {
        CHECK_INT(m->format, CM_FMT_HF);
        CHECK(!strcmp(m->cfg.arch, "bert") && m->cfg.encoder);
        CHECK_INT(m->cfg.n_types, 2);
        CHECK_INT(m->cfg.pooling, CM_POOL_CLS); /* no modules.json: CLS, normalised */
        CHECK_INT(m->cfg.normalize, 1);
        const char *want[] = {"token_embd.weight", "position_embd.weight", "token_types.weight", "token_embd_norm.bias",
                              "blk.0.attn_q.weight", "blk.0.attn_output.bias", "blk.0.attn_output_norm.weight",
                              "blk.0.ffn_up.weight", "blk.0.ffn_down.bias", "blk.0.layer_output_norm.bias"};
        for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) CHECK(cm_model_tensor(m, want[i]) != NULL);
        const cm_tensor_ref *up = cm_model_tensor(m, "blk.0.ffn_up.weight");
        if (up) CHECK(up->ne[0] == 32 && up->ne[1] == 64);
        CHECK_INT(m->n_tensors, n - 2); /* position_ids and the pooler are not used */
        cm_model_close(m);
    }
    cm_tokenizer *t = NULL;
    char tp[600];
    snprintf(tp, sizeof tp, "%s/tokenizer.json", dir);
    CHECK_RC(cm_tok_from_hf_json(tp, &t, err, sizeof err), 0);
    if (t) {
        int32_t *ids = NULL;
        size_t nid = 0;
        CHECK_RC(cm_tok_encode(t, "HELLO, worlds!", 14, 1, 1, &ids, &nid), 0);
        int32_t want[] = {2, 4, 7, 5, 6, 1, 3}; /* [CLS] hello , world ##s [UNK](!) [SEP] */
        CHECK(nid == 7 && ids && !memcmp(ids, want, sizeof want));
        free(ids);
        cm_tok_free(t);
    }
    /* sentence-transformers: mean pooling, normalised, shorter inputs */
    char sub[600];
    snprintf(sub, sizeof sub, "%s/1_Pooling", dir);
    mkdir(sub, 0755);
    write_file(dir, "modules.json", "[{\"type\":\"sentence_transformers.models.Transformer\",\"path\":\"\"},"
                                    "{\"type\":\"sentence_transformers.models.Pooling\",\"path\":\"1_Pooling\"},"
                                    "{\"type\":\"sentence_transformers.models.Normalize\",\"path\":\"2_Normalize\"}]");
    write_file(sub, "config.json", "{\"pooling_mode_mean_tokens\":true,\"pooling_mode_cls_token\":false}");
    write_file(dir, "sentence_bert_config.json", "{\"max_seq_length\":12}");
    CHECK_RC(cm_model_open(dir, &m, err, sizeof err), 0);
    if (m) {
        CHECK_INT(m->cfg.pooling, CM_POOL_MEAN);
        CHECK_INT(m->cfg.normalize, 1);
        CHECK_INT(m->cfg.max_seq, 12);
        cm_model_close(m);
    }
    write_file(sub, "config.json", "{\"pooling_mode_max_tokens\":true}");
    CHECK_RC(open_dir(dir), LLM_EUNSUP);
    write_file(dir, "modules.json", "[{\"type\":\"sentence_transformers.models.Pooling\",\"path\":\"../../etc\"}]");
    CHECK_RC(open_dir(dir), LLM_EFORMAT);
    write_file(dir, "modules.json", "[]");
    /* refusals */
    write_file(dir, "config.json", "{\"model_type\":\"gpt2\",\"hidden_size\":32}");
    CHECK_RC(open_dir(dir), LLM_EUNSUP);
    write_file(dir, "config.json", "{\"model_type\":\"bert\",\"hidden_size\":32,\"num_attention_heads\":2,"
                                   "\"num_hidden_layers\":1,\"intermediate_size\":64,\"vocab_size\":8,\"hidden_act\":\"relu\"}");
    CHECK_RC(open_dir(dir), LLM_EUNSUP);
    write_file(dir, "config.json", "{\"model_type\": ");
    CHECK_RC(open_dir(dir), LLM_EFORMAT);
    write_file(dir, "config.json", bert_config);
    write_file(dir, "model.safetensors.index.json", "{\"weight_map\":{\"a\":\"../../outside.safetensors\"}}");
    CHECK_RC(open_dir(dir), LLM_EFORMAT);
    write_file(dir, "model.safetensors.index.json", "{\"weight_map\":{\"a\":\"model.safetensors\"}}");
    CHECK_RC(open_dir(dir), 0); /* an index naming the one file */
    s[0].dtype = "I32"; /* a weight of a type that does not load */
    write_st(dir, "model.safetensors", s, n);
    CHECK_RC(open_dir(dir), LLM_EUNSUP);
    /* a llama-family directory: rotate-halves RoPE, tied when lm_head is absent */
    write_file(dir, "config.json", "{\"model_type\":\"llama\",\"hidden_size\":32,\"num_attention_heads\":2,"
                                   "\"num_key_value_heads\":1,\"num_hidden_layers\":1,\"intermediate_size\":64,"
                                   "\"vocab_size\":8,\"rms_norm_eps\":1e-5,\"tie_word_embeddings\":true}");
    spec l[] = {{"model.embed_tokens.weight", "F16", {8, 32}, 2}, {"model.norm.weight", "F32", {32}, 1},
                {"model.layers.0.self_attn.q_proj.weight", "F16", {32, 32}, 2},
                {"model.layers.0.self_attn.k_proj.weight", "F16", {16, 32}, 2},
                {"model.layers.0.self_attn.v_proj.weight", "F16", {16, 32}, 2},
                {"model.layers.0.self_attn.o_proj.weight", "F16", {32, 32}, 2},
                {"model.layers.0.mlp.gate_proj.weight", "F16", {64, 32}, 2},
                {"model.layers.0.mlp.up_proj.weight", "F16", {64, 32}, 2},
                {"model.layers.0.mlp.down_proj.weight", "F16", {32, 64}, 2},
                {"model.layers.0.input_layernorm.weight", "F32", {32}, 1},
                {"model.layers.0.post_attention_layernorm.weight", "F32", {32}, 1}};
    write_st(dir, "model.safetensors", l, (int)(sizeof l / sizeof l[0]));
    CHECK_RC(cm_model_open(dir, &m, err, sizeof err), 0);
    if (m) {
        CHECK(!m->cfg.encoder && m->cfg.tied);
        CHECK_INT(m->cfg.rope_type, CM_ROPE_NEOX);
        CHECK_INT(m->cfg.n_kv_head, 1);
        CHECK(cm_model_tensor(m, "blk.0.ffn_gate.weight") && cm_model_tensor(m, "output_norm.weight") &&
              cm_model_tensor(m, "blk.0.attn_k.weight"));
        cm_model_close(m);
    }
    const char *files[] = {"config.json", "model.safetensors", "tokenizer.json", "modules.json",
                           "sentence_bert_config.json", "model.safetensors.index.json", "1_Pooling/config.json"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        char p[700];
        snprintf(p, sizeof p, "%s/%s", dir, files[i]);
        unlink(p);
    }
    rmdir(sub);
    rmdir(dir);
}

static void served_names(void) {
    char n[64];
    cm_model_served_name("models/all-MiniLM-L6-v2/", NULL, n, sizeof n);
    CHECK(!strcmp(n, "all-MiniLM-L6-v2"));
    cm_model_served_name("/abs/models/x.gguf", NULL, n, sizeof n);
    CHECK(!strcmp(n, "x"));
    cm_model_served_name("dir", NULL, n, sizeof n);
    CHECK(!strcmp(n, "dir"));
}

int main(void) {
    served_names();
    reader();
    hf_dirs();
    return tst_done("safetensors_test");
}
