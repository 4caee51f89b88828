/* cm_tokenizer.h - tokenizers read from model metadata.
 *
 * Three families: byte-level BPE (GPT-2 style; merges by rank, with the
 * pre-tokenizer the GGUF names: gpt2, llama3, qwen2, smollm),
 * SentencePiece-style BPE (llama; merges by score, byte fallback) and
 * WordPiece (BERT: its normalizer, whitespace and punctuation splits, greedy
 * longest match; encoding with add_bos wraps the text in [CLS] ... [SEP],
 * which are bos and eos). All split
 * special tokens out of the text first (a trie walk: linear in the text).
 * Encoding is O(n log n) in the length of each pre-token and linear in the
 * number of pre-tokens, so hostile inputs cannot make it quadratic. */
#ifndef CM_TOKENIZER_H
#define CM_TOKENIZER_H

#include "cm_gguf.h"

#include <stddef.h>
#include <stdint.h>

typedef struct cm_tokenizer cm_tokenizer;

enum { CM_TOK_BPE = 1, CM_TOK_SPM = 2, CM_TOK_WPM = 3 /* WordPiece (BERT) */, CM_TOK_UNI = 4 /* Unigram */ };
enum { CM_PRE_GPT2 = 0, CM_PRE_LLAMA3, CM_PRE_QWEN2, CM_PRE_SMOLLM };
/* GGUF token types */
enum { CM_TT_NORMAL = 1, CM_TT_UNKNOWN = 2, CM_TT_CONTROL = 3, CM_TT_USER = 4, CM_TT_UNUSED = 5,
       CM_TT_BYTE = 6 };

int cm_tok_from_gguf(const cm_gguf *g, cm_tokenizer **out, char *err, size_t errlen);
/* A Hugging Face tokenizer.json (cm_tok_hf.c): WordPiece models with the
 * BertNormalizer, BertPreTokenizer and a [CLS] A [SEP] post-processor, and
 * byte-level BPE with the pre-tokenizers above (GPT-2, SmolLM/StarCoder,
 * Llama 3, Qwen2); any other model, normalizer or pre-tokenizer is refused
 * by name. */
int cm_tok_from_hf_json(const char *path, cm_tokenizer **out, char *err, size_t errlen);
/* A checkpoint directory's tokenizer.json with its tokenizer_config.json
 * (when present): BOS / EOS, add_bos_token, the chat template. */
int cm_tok_from_hf_dir(const char *dir, cm_tokenizer **out, char *err, size_t errlen);
/* The same over a file's bytes (tests, fuzzing). */
int cm_tok_from_hf_json_mem(const char *data, size_t len, cm_tokenizer **out, char *err, size_t errlen);
/* llama2.c tokenizer.bin (SentencePiece pieces with scores); vocab from the model. */
int cm_tok_from_llama2c(const char *path, uint32_t vocab, cm_tokenizer **out, char *err,
                        size_t errlen);
/* A stand-in for models without one (dummy weights): <unk> <s> </s>, 256
 * byte tokens, the SentencePiece space, placeholders to vocab (>= 260). */
int cm_tok_synthetic(uint32_t vocab, cm_tokenizer **out);
void cm_tok_free(cm_tokenizer *t);

/* Encodes text[0..len) into a malloc'd array (*ids, *n). add_bos follows the
 * metadata when -1. parse_special: match control tokens written in the text
 * (user-defined tokens always match). */
int cm_tok_encode(const cm_tokenizer *t, const char *text, size_t len, int add_bos,
                  int parse_special, int32_t **ids, size_t *n);
/* The same, stopping once more than max_ids ids would come out: then
 * LLM_ERANGE, *ids NULL and *n a lower bound of the count (> max_ids). A text
 * longer than max_ids times the longest token is refused before any work. */
int cm_tok_encode_limit(const cm_tokenizer *t, const char *text, size_t len, int add_bos,
                        int parse_special, size_t max_ids, int32_t **ids, size_t *n);
/* The tokenizer as a tensor-less GGUF (vocabulary, types, scores, merges by
 * rank, pre-tokenizer, BOS/EOS/UNK, flags, chat template) in a malloc'd
 * buffer: what a worker hands gateways so they need no model file. */
int cm_tok_export(const cm_tokenizer *t, uint8_t **out, size_t *len);
/* Builds a tokenizer from an exported (or any tokenizer-bearing) GGUF in
 * memory; untrusted input is checked as any GGUF file is. */
int cm_tok_import(const void *data, size_t len, cm_tokenizer **out, char *err, size_t errlen);
/* XXH3 of the export (never 0): equal tokenizers have equal fingerprints. */
uint64_t cm_tok_fingerprint(const cm_tokenizer *t);
uint32_t cm_tok_max_token_bytes(const cm_tokenizer *t);
/* Bytes a token stands for; control tokens give "" unless render_special. */
int cm_tok_piece(const cm_tokenizer *t, int32_t id, int render_special, const char **bytes,
                 size_t *len);
/* Decodes a whole sequence into a malloc'd NUL-terminated string. */
char *cm_tok_decode(const cm_tokenizer *t, const int32_t *ids, size_t n, int render_special);

int32_t cm_tok_vocab(const cm_tokenizer *t);
int32_t cm_tok_bos(const cm_tokenizer *t);
int32_t cm_tok_eos(const cm_tokenizer *t);
int32_t cm_tok_unk(const cm_tokenizer *t); /* what a byte outside the vocabulary becomes; -1: none */
int cm_tok_type(const cm_tokenizer *t, int32_t id);
int cm_tok_kind(const cm_tokenizer *t);
int cm_tok_pre(const cm_tokenizer *t);
/* End of generation: EOS, EOT/<|im_end|>-like control tokens the metadata names. */
int cm_tok_is_eog(const cm_tokenizer *t, int32_t id);
/* Id of a token whose text is exactly s, or -1. */
int32_t cm_tok_lookup(const cm_tokenizer *t, const char *s);
/* The metadata's chat template text, or NULL. */
const char *cm_tok_chat_template(const cm_tokenizer *t);

/* Incremental detokenizer: push ids one at a time, get only whole UTF-8
 * characters out; the rest waits for the next token (or flush). */
typedef struct {
    char pend[32];
    size_t npend;
    int first;           /* strip the SentencePiece leading space of the first piece */
} cm_detok;
void cm_detok_init(cm_detok *d, const cm_tokenizer *t);
/* Appends the text now complete to out (cap bytes, >= 64 recommended); returns bytes written. */
size_t cm_detok_push(cm_detok *d, const cm_tokenizer *t, int32_t id, char *out, size_t cap);
size_t cm_detok_flush(cm_detok *d, char *out, size_t cap);

#endif
