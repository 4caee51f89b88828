/* tl_common.h - what the llmserve subcommands share. */
#ifndef TL_COMMON_H
#define TL_COMMON_H

#include <stddef.h>
#include <stdint.h>

int tl_generate_main(int argc, char **argv);
int tl_perplexity_main(int argc, char **argv);
int tl_embed_main(int argc, char **argv);
int tl_serve_main(int argc, char **argv);
int tl_run_batch_main(int argc, char **argv);
int tl_plan_main(int argc, char **argv);
int tl_cost_main(int argc, char **argv);
int tl_bench_main(int argc, char **argv);
int tl_quantize_main(int argc, char **argv);
int tl_eval_main(int argc, char **argv);
int tl_imatrix_main(int argc, char **argv);

struct wk_model;
struct wk_engine_opts;
/* --batch: runs a JSONL file of completion requests through the engine. */
int tl_batch_run(struct wk_model *m, const struct wk_engine_opts *eo, const char *path, const char *model_name);

/* A whole file ('-': stdin) into a malloc'd buffer (not NUL-terminated); NULL when it cannot be read. */
char *tl_read_file(const char *path, size_t *len);

#endif
