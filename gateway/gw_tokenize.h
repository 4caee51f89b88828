/* gw_tokenize.h - vLLM's tokenizer endpoints, which lm-evaluation-harness's
 * remote tokenizer and prefix-aware routers call:
 *   POST /tokenize    {prompt, add_special_tokens (true), return_token_strs}
 *                     or {messages, add_generation_prompt, add_special_tokens}
 *                     -> {count, max_model_len, tokens, token_strs}
 *   POST /detokenize  {tokens} -> {prompt}
 *   GET  /tokenizer_info -> bos/eos/pad/unk tokens, chat_template, sizes
 * Messages are rendered and tokenized exactly as /v1/chat/completions does,
 * so the count is what a chat request would cost. The work runs on the
 * tokenizer threads (gw_tokq), never on the loop. */
#ifndef GW_TOKENIZE_H
#define GW_TOKENIZE_H

#include "gw.h"
#include "gw_http.h"

enum { GW_TOK_TOKENIZE = 1, GW_TOK_DETOKENIZE, GW_TOK_INFO };

/* After authentication: answers r (through the pool, or 503 when it is full). */
void gw_tokenize_handle(gw *g, gw_http_req *r, int which);

#endif
