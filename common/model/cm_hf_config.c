/* cm_hf_config.c - a Hugging Face config.json into a cm_model_config, for
 * the HF loader (cm_hf.c) and for shapes without weights (cm_model_dummy.c). */
#include "cm_error.h"
#include "cm_model.h"
#include "cm_rope.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

static uint32_t jint(json_t *o, const char *k, uint32_t def) {
    json_t *v = json_object_get(o, k);
    return json_is_integer(v) && json_integer_value(v) > 0 && json_integer_value(v) < (1 << 30)
               ? (uint32_t)json_integer_value(v)
               : def;
}

static double jnum(json_t *o, const char *k, double def) {
    json_t *v = json_object_get(o, k);
    return json_is_number(v) && json_number_value(v) > 0 ? json_number_value(v) : def;
}

/* config.json keys of a decoder (llama, mistral, qwen2): honoured by this
 * parser or the loaders, or known not to change the math (names, ids,
 * training settings). Any other key whose value is not null or false
 * changes the model in a way this engine does not implement, and refuses
 * it by name: sliding windows, soft-capping, biases the loader does not
 * read, a hidden_act other than silu, ... */
static const char *const HF_KEYS[] = {
    /* honoured */
    "model_type", "num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
    "intermediate_size", "vocab_size", "max_position_embeddings", "tie_word_embeddings", "attention_bias",
    "rope_theta", "rms_norm_eps", "rope_scaling", "partial_rotary_factor", "hidden_act", "quantization_config",
    "use_sliding_window", "sliding_window", "max_window_layers", "mlp_bias", "pretraining_tp",
    /* no effect on the math */
    "architectures", "_name_or_path", "transformers_version", "torch_dtype", "dtype", "bos_token_id",
    "eos_token_id", "pad_token_id", "initializer_range", "use_cache", "attention_dropout", "hidden_dropout",
    "hidden_dropout_prob", "attention_probs_dropout_prob", "embd_pdrop", "resid_pdrop", "output_attentions",
    "output_hidden_states", "return_dict", "auto_map", "unsloth_version", "_attn_implementation",
    "tokenizer_class", "use_return_dict", "keys_to_ignore_at_inference", "chunk_size_feed_forward",
    "is_encoder_decoder", "is_decoder", "add_cross_attention", "tie_encoder_decoder", "task_specific_params",
    "problem_type", "id2label", "label2id", "finetuning_task", "prefix", "sep_token_id", "decoder_start_token_id",
    "rope_interleaved" /* (false only: see below) */, "layer_types", NULL};

/* Mixtral's and Qwen3-MoE's: honoured (the experts; decoder_sparse_step and mlp_only_layers only as every
 * layer sparse), or training settings */
static const char *const HF_KEYS_MOE[] = {"num_local_experts", "num_experts", "num_experts_per_tok",
    "moe_intermediate_size", "norm_topk_prob", "decoder_sparse_step", "mlp_only_layers", "output_router_logits",
    "router_aux_loss_coef", "router_jitter_noise", NULL};

/* gpt-oss's: honoured (experts_per_token only as num_experts_per_tok; initial_context_length is the YaRN's
 * original context, which rope_scaling gives), or training settings */
static const char *const HF_KEYS_OSS[] = {"num_local_experts", "num_experts_per_tok", "experts_per_token",
    "swiglu_limit", "initial_context_length", "output_router_logits", "router_aux_loss_coef", NULL};

static int listed_key(const char *const *l, const char *key) {
    for (; *l; l++)
        if (!strcmp(*l, key)) return 1;
    return 0;
}

/* The experts of a mixtral / qwen3_moe config: every layer sparse, as vLLM runs them. */
static int moe_keys(json_t *o, const char *path, const char *mt, cm_model_config *c, char *err, size_t errlen) {
    int q3 = !strcmp(mt, "qwen3_moe");
    c->n_expert = jint(o, q3 ? "num_experts" : "num_local_experts", 0);
    c->n_expert_used = jint(o, "num_experts_per_tok", 0);
    json_t *nt = json_object_get(o, "norm_topk_prob");
    c->expert_norm = q3 ? !json_is_false(nt) : 1; /* Mixtral always renormalises; Qwen3-MoE says (default true) */
    if (!q3 && json_is_false(nt)) {
        snprintf(err, errlen, "%s: norm_topk_prob = false: Mixtral's experts' weights are always renormalised", path);
        return LLM_EUNSUP;
    }
    if (q3) c->hidden = jint(o, "moe_intermediate_size", 0);
    json_t *step = json_object_get(o, "decoder_sparse_step"), *dense = json_object_get(o, "mlp_only_layers");
    if ((step && !json_is_null(step) && !(json_is_integer(step) && json_integer_value(step) == 1)) ||
        (json_is_array(dense) && json_array_size(dense))) {
        snprintf(err, errlen, "%s: %s: dense layers among the sparse ones are not supported (every layer sparse)", path,
                 json_is_array(dense) && json_array_size(dense) ? "mlp_only_layers" : "decoder_sparse_step");
        return LLM_EUNSUP;
    }
    if (!c->n_expert || !c->n_expert_used || !c->hidden) {
        snprintf(err, errlen, "%s: a %s config needs %s, num_experts_per_tok%s", path, mt,
                 q3 ? "num_experts" : "num_local_experts", q3 ? " and moe_intermediate_size" : "");
        return LLM_EFORMAT;
    }
    return 0;
}

/* gpt-oss: experts with biases, the clamped SwiGLU, every other layer local (sliding first), as its
 * config.json spells it and as its code fixes it (alpha 1.702) */
static int oss_keys(json_t *o, const char *path, cm_model_config *c, char *err, size_t errlen) {
    c->gpt_oss = 1;
    c->n_expert = jint(o, "num_local_experts", 0);
    c->n_expert_used = jint(o, "num_experts_per_tok", jint(o, "experts_per_token", 0));
    c->expert_norm = 1;
    c->swiglu_alpha = 1.702f;
    c->swiglu_limit = (float)jnum(o, "swiglu_limit", 7.0);
    c->swa_window = jint(o, "sliding_window", 0);
    c->swa_period = 2;
    uint32_t ept = jint(o, "experts_per_token", c->n_expert_used);
    if (!c->n_expert || !c->n_expert_used || ept != c->n_expert_used || !c->swa_window) {
        snprintf(err, errlen, "%s: a gpt_oss config needs num_local_experts, num_experts_per_tok (experts_per_token "
                 "the same) and sliding_window", path);
        return LLM_EFORMAT;
    }
    json_t *lt = json_object_get(o, "layer_types");
    for (size_t i = 0; json_is_array(lt) && i < json_array_size(lt); i++) {
        const char *t = json_string_value(json_array_get(lt, i)), *want = i % 2 ? "full_attention" : "sliding_attention";
        if (!t || strcmp(t, want)) {
            snprintf(err, errlen, "%s: layer_types[%zu] = '%.32s': gpt-oss's layers alternate sliding_attention and "
                     "full_attention, starting with sliding_attention", path, i, t ? t : "?");
            return LLM_EUNSUP;
        }
    }
    if (json_is_array(lt) && json_array_size(lt) != c->n_layer) {
        snprintf(err, errlen, "%s: layer_types has %zu entries for %u layers", path, json_array_size(lt), c->n_layer);
        return LLM_EFORMAT;
    }
    return 0;
}

static int decoder_keys(json_t *o, const char *path, cm_model_config *c, char *err, size_t errlen) {
    const char *key;
    json_t *v;
    json_object_foreach(o, key, v) {
        int known = listed_key(HF_KEYS, key) || (c->n_expert && !c->gpt_oss && listed_key(HF_KEYS_MOE, key)) ||
                    (c->gpt_oss && listed_key(HF_KEYS_OSS, key));
        if (!known && !json_is_null(v) && !json_is_false(v)) {
            char *d = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
            snprintf(err, errlen, "%s: %.60s = %.60s changes the model in a way this engine does not implement: refused "
                     "rather than computed wrong", path, key, d ? d : "?");
            free(d);
            return LLM_EUNSUP;
        }
    }
    const char *act = json_string_value(json_object_get(o, "hidden_act"));
    if (act && strcmp(act, "silu")) {
        snprintf(err, errlen, "%s: hidden_act '%.32s' is not supported (silu)", path, act);
        return LLM_EUNSUP;
    }
    if (json_is_true(json_object_get(o, "mlp_bias")) || json_is_true(json_object_get(o, "rope_interleaved"))) {
        snprintf(err, errlen, "%s: %s = true is not supported", path,
                 json_is_true(json_object_get(o, "mlp_bias")) ? "mlp_bias" : "rope_interleaved");
        return LLM_EUNSUP;
    }
    json_t *lt = json_object_get(o, "layer_types"); /* every layer full attention, or refused (gpt-oss: oss_keys) */
    for (size_t i = 0; !c->gpt_oss && json_is_array(lt) && i < json_array_size(lt); i++) {
        const char *t = json_string_value(json_array_get(lt, i));
        if (!t || strcmp(t, "full_attention")) {
            snprintf(err, errlen, "%s: layer_types[%zu] = '%.32s' is not supported (full_attention)", path, i,
                     t ? t : "?");
            return LLM_EUNSUP;
        }
    }
    /* a sliding window: Qwen2 says whether it is used; Mistral's applies whenever it is set */
    json_t *sw = json_object_get(o, "sliding_window");
    json_t *use = json_object_get(o, "use_sliding_window");
    int windowed = !c->gpt_oss && json_is_integer(sw) && (use ? json_is_true(use) : 1);
    if (windowed && json_integer_value(sw) < (json_int_t)c->ctx_len) {
        snprintf(err, errlen, "%s: sliding_window %lld (shorter than max_position_embeddings %u) is not supported for "
                 "%s: sliding-window attention runs only for gemma3", path, (long long)json_integer_value(sw), c->ctx_len,
                 c->arch);
        return LLM_EUNSUP;
    }
    json_t *pr = json_object_get(o, "partial_rotary_factor");
    if (pr && !json_is_null(pr)) {
        double f = json_is_number(pr) ? json_number_value(pr) : -1;
        uint32_t rd = (uint32_t)(c->head_dim * f + 0.5);
        if (!(f > 0 && f <= 1) || rd == 0 || rd % 2 || fabs(rd - c->head_dim * f) > 1e-6) {
            snprintf(err, errlen, "%s: partial_rotary_factor %g does not give an even number of rotated dims of %u",
                     path, f, c->head_dim);
            return LLM_EUNSUP;
        }
        c->rope_dim = rd;
    }
    return cm_rope_from_json(json_object_get(o, "rope_scaling"), c, path, err, errlen);
}

int cm_model_config_json(const char *path, cm_model_config *c, char *err, size_t errlen) {
    memset(c, 0, sizeof *c);
    json_error_t je;
    json_t *o = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
    if (!o || !json_is_object(o)) {
        snprintf(err, errlen, "%s: not a JSON object%s%s", path, o ? "" : ": ", o ? "" : je.text);
        json_decref(o);
        return LLM_EFORMAT;
    }
    const char *mt = json_string_value(json_object_get(o, "model_type"));
    if (!mt) mt = "";
    int q3 = !strcmp(mt, "qwen3") || !strcmp(mt, "qwen3_moe"), moe = !strcmp(mt, "mixtral") || !strcmp(mt, "qwen3_moe");
    int oss = !strcmp(mt, "gpt_oss");
    snprintf(c->arch, sizeof c->arch, "%s",
             !strcmp(mt, "qwen2") ? "qwen2" : !strcmp(mt, "qwen3") ? "qwen3" : !strcmp(mt, "qwen3_moe") ? "qwen3moe"
                                                                     : oss ? "gpt-oss" : "llama");
    c->qk_norm = q3;
    snprintf(c->name, sizeof c->name, "%s", path);
    c->n_layer = jint(o, "num_hidden_layers", 0);
    c->dim = jint(o, "hidden_size", 0);
    c->n_head = jint(o, "num_attention_heads", 0);
    c->n_kv_head = jint(o, "num_key_value_heads", c->n_head);
    c->head_dim = jint(o, "head_dim", c->n_head ? c->dim / c->n_head : 0);
    c->rope_dim = c->head_dim;
    c->hidden = jint(o, "intermediate_size", 0);
    c->vocab = jint(o, "vocab_size", 0);
    c->ctx_len = jint(o, "max_position_embeddings", 4096);
    c->tied = json_is_true(json_object_get(o, "tie_word_embeddings"));
    c->qkv_bias = !strcmp(c->arch, "qwen2") || json_is_true(json_object_get(o, "attention_bias"));
    c->rope_theta = (float)jnum(o, "rope_theta", 10000);
    c->norm_eps = (float)jnum(o, "rms_norm_eps", 1e-5);
    c->rope_type = c->qkv_bias || q3 || oss ? CM_ROPE_NEOX : CM_ROPE_NORM;
    if (strcmp(mt, "bert")) {
        int rc = moe ? moe_keys(o, path, mt, c, err, errlen) : oss ? oss_keys(o, path, c, err, errlen) : 0;
        if (!rc) rc = decoder_keys(o, path, c, err, errlen);
        if (rc) {
            json_decref(o);
            return rc;
        }
    }
    if (!strcmp(mt, "bert")) {
        snprintf(c->arch, sizeof c->arch, "bert");
        c->encoder = 1;
        c->n_kv_head = c->n_head;
        c->n_types = jint(o, "type_vocab_size", 0);
        c->ctx_len = c->max_seq = jint(o, "max_position_embeddings", 512);
        c->norm_eps = (float)jnum(o, "layer_norm_eps", 1e-12);
        c->qkv_bias = 1;
        const char *act = json_string_value(json_object_get(o, "hidden_act"));
        const char *pe = json_string_value(json_object_get(o, "position_embedding_type"));
        if (act && !strcmp(act, "gelu")) c->gelu_tanh = 0;
        else if (act && (!strcmp(act, "gelu_new") || !strcmp(act, "gelu_pytorch_tanh"))) c->gelu_tanh = 1;
        else {
            snprintf(err, errlen, "%s: hidden_act '%.32s' is not supported (gelu, gelu_new)", path, act ? act : "");
            json_decref(o);
            return LLM_EUNSUP;
        }
        if (pe && strcmp(pe, "absolute")) {
            snprintf(err, errlen, "%s: position_embedding_type '%.32s' is not supported (absolute)", path, pe);
            json_decref(o);
            return LLM_EUNSUP;
        }
    }
    json_decref(o);
    if (!c->n_layer || !c->dim || !c->n_head || !c->head_dim || !c->hidden || !c->vocab) {
        snprintf(err, errlen,
                 "%s: needs num_hidden_layers, hidden_size, num_attention_heads, intermediate_size and vocab_size", path);
        return LLM_EFORMAT;
    }
    return 0;
}
