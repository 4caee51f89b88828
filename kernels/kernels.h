/* kernels.h - the CPU backend: weight preparation, matmul and the small ops
 * of a llama-family forward pass.
 *
 * Matmul convention: y[B, N] = x[B, K] . W[N, K]^T, W stored as GGUF stores
 * it (N rows of K, quantized in blocks of 32 along K).
 *
 * Quantized weights (Q4_0, Q4_1, Q8_0; Q5_0, Q5_1 and the K-quants Q2_K to
 * Q6_K through cm_unpack32's form) are repacked once at load time into
 * an interleaved layout of 16 rows per group so one SIMD register holds one
 * int32 partial sum per row: no horizontal sums in the inner loop, and each
 * weight group is loaded once for every activation row of a batch (a real
 * GEMM for B > 1). Activations are quantized per row to int8 blocks of 32
 * with a float scale; dot products are integer (VNNI vpdpbusd on AVX-512,
 * vpmaddubsw+vpmaddwd on AVX2, plain C elsewhere) with one float scale per
 * block and row. Every SIMD path has a scalar reference in kn_ref.c. */
#ifndef KERNELS_H
#define KERNELS_H

#include <stddef.h>
#include <stdint.h>

#define KN_ROWS 16 /* rows per interleaved group */

enum { KN_PACK_NONE = 0, KN_PACK_Q4 = 1, KN_PACK_Q8 = 2, KN_PACK_Q8H = 3, KN_PACK_Q4H = 4, KN_PACK_Q6H = 5, KN_PACK_Q4S = 6,
       KN_PACK_Q6S = 7 };

/* Interleaved group-block of a 4-bit matrix: 16 rows x 32 elements.
 * chunk c (0..3), byte r*4+i: low nibble = row r element 8c+i,
 * high nibble = row r element 8c+4+i. w = d*q + m (Q4_0: m = -8d). */
typedef struct {
    uint16_t d[KN_ROWS], m[KN_ROWS]; /* fp16 */
    uint8_t qs[4][64];
} kn_pq4;
/* Q4_0's (m = -8d, so no m stored): 288 bytes a block, not 320, the file's 0.5625 bytes a weight; decode
 * streams 10% fewer bytes. The kernels take m as d * -8, which in float is exactly the fp16 -8d kn_pq4
 * would hold, so the two layouts give the same sums bit for bit. */
typedef struct {
    uint16_t d[KN_ROWS]; /* fp16 */
    uint8_t qs[4][64];
} kn_pq4s;
/* 8-bit: chunk c (0..7), byte r*4+i = row r element 4c+i, stored as q+128. */
typedef struct {
    uint16_t d[KN_ROWS];
    uint8_t qs[8][64];
} kn_pq8;

/* Unsigned integers (0..63) with an affine map per half block of 16:
 * w = d[h]*u + m[h]. Q5_0, Q5_1, Q2_K, Q3_K, Q5_K, Q6_K (Q4_K, whose
 * sub-blocks are 32 long and 4-bit, goes to kn_pq4). Chunk c (0..7), byte
 * r*4+i = row r element 4c+i: chunks 0-3 are half 0, 4-7 half 1. */
typedef struct {
    uint16_t d[2][KN_ROWS], m[2][KN_ROWS]; /* fp16 */
    uint8_t qs[8][64];
} kn_pq8h;
/* The same for u 0..15 (Q2_K, Q3_K): 6 bits a weight, not 10. Byte j of
 * qs[c] (c 0..3) holds byte j of kn_pq8h's chunk c in its low nibble and of
 * chunk c+4 in its high one: one load gives a half-0 and a half-1 chunk.
 * d and m lie where kn_pq8h has them (the kernels share the code). */
typedef struct {
    uint16_t d[2][KN_ROWS], m[2][KN_ROWS]; /* fp16 */
    uint8_t qs[4][64];
} kn_pq4h;
/* And for u 0..63 (Q5_0, Q5_1, Q5_K, Q6_K): 8 bits a weight. The low four
 * bits as kn_pq4h's; bits 2c'..2c'+1 of byte j of qh[e] are the top two of
 * byte j of chunk 4e+c' (c' 0..3). */
typedef struct {
    uint16_t d[2][KN_ROWS], m[2][KN_ROWS]; /* fp16 */
    uint8_t qs[4][64];
    uint8_t qh[2][64];
} kn_pq6h;
/* Q6_K's (m = -32d: no m stored; 448 bytes a block, not 512, 0.875 bytes a weight to the file's 0.82). The
 * kernels take m as d * -32, exact in float and in fp16, so an expanded kn_pq8h block holds the same m. */
typedef struct {
    uint16_t d[2][KN_ROWS]; /* fp16 */
    uint8_t qs[4][64];
    uint8_t qh[2][64];
} kn_pq6s;

typedef struct kn_weight {
    int type;            /* enum cm_dtype of raw */
    int64_t n, k;        /* rows, row length */
    const void *raw;     /* GGUF layout, [n][k] in blocks */
    int pack;            /* KN_PACK_* */
    void *packed;        /* [ceil(n/16)][k/32] kn_pq4, kn_pq4s, kn_pq8, kn_pq8h, kn_pq4h, kn_pq6h or kn_pq6s, owned */
    const int32_t *perm; /* [k] or NULL: the rows hold input perm[j] at j (act-order GPTQ); the
                          * caller gathers x[perm[j]] before the matmul, the kernels never look */
} kn_weight;

/* Activations quantized for integer dot products. */
typedef struct kn_act {
    int64_t k, nblk;     /* row length, k/32 */
    int rows, cap;       /* rows in use, capacity */
    int8_t *qs;          /* [cap][k] */
    float *d;            /* [cap][nblk] scale */
    float *ds;           /* [cap][nblk] scale * sum(qs of block) */
    float *hs;           /* [cap][2*nblk] scale * sum(qs of each half block of 16) */
} kn_act;

typedef struct kn_pool kn_pool;
typedef void (*kn_task_fn)(void *ctx, int ith, int nth);

/* ---- set-up -------------------------------------------------------------- */
/* Picks the SIMD path: LLMSERVE_ISA=scalar|avx2|avx512|neon|neon-dotprod if set and present; else the
 * CPU's best, and where it has both AVX-512 and AVX2, the one a short GEMM measures faster. */
void kn_init(void);
const char *kn_isa_name(void);
/* Why kn_init chose the path (for the start-up log line). */
const char *kn_isa_reason(void);
/* Forces a path for tests (a name above); LLM_EUNSUP if the CPU lacks it. */
int kn_set_isa(const char *name);
/* Takes another process's choice (kn_isa_name, kn_amx_active there), so that a worker group's ranks
 * compute with the same kernels and so the same bits: whose says where it came from (for the start-up
 * line). LLM_EUNSUP, nothing changed, where this CPU lacks that path. */
int kn_follow_isa(const char *name, int amx, const char *whose);
/* AMX int8 tiles under the AVX-512 path for batches of 16 rows and more (on where the CPU and kernel allow
 * it, unless LLMSERVE_AMX=0): on 1 / off 0; LLM_EUNSUP if this machine cannot. Results are the same bits
 * either way. Returns 0 on success. kn_amx_active: whether they are in use now. */
int kn_set_amx(int on);
int kn_amx_active(void);

/* A fixed pool of n threads (the caller is thread 0), created once. */
int kn_pool_create(int n, kn_pool **out);
void kn_pool_destroy(kn_pool *p);
int kn_pool_size(const kn_pool *p);
/* Runs fn(ctx, i, n) on every thread i and returns when all are done. */
void kn_pool_run(kn_pool *p, kn_task_fn fn, void *ctx);

/* Reference mode: quantized weights are dequantized row by row and multiplied
 * with float activations (slow; no int8 rounding). The int8 path is chaotic
 * over many layers (a 1e-6 change flips roundings that cascade), so golden
 * tests against an independent float forward use this mode. Global. */
void kn_set_act_f32(int on);
/* Whether a matmul with w reads its input as kn_act (quantized) blocks. */
int kn_weight_wants_act(const kn_weight *w);

/* Checks the type is supported and repacks quantized types. */
int kn_weight_init(kn_weight *w, int type, int64_t n, int64_t k, const void *raw);
void kn_weight_free(kn_weight *w);

int kn_act_init(kn_act *a, int64_t k, int cap);
void kn_act_free(kn_act *a);

/* Rows r0.. of a as a kn_act of their own (the same memory): threads
 * quantize their share of a batch into it. */
kn_act kn_act_view(const kn_act *a, int r0);

/* ---- ops --------------------------------------------------------------- */
/* x [rows, k] float -> a. */
void kn_quantize_act(kn_act *a, const float *x, int rows);
/* Several matmuls sharing one input, spread over the pool in one pass:
 * y_i[B, w_i->n] = x[B, K] . w_i^T. a must hold x quantized when any w_i is
 * quantized (kn_matmul quantizes for you). */
void kn_matmul_multi(kn_pool *p, int nw, const kn_weight *const *w, float *const *y,
                     const float *x, const kn_act *a, int B);
/* Quantizes x into a (if needed) and multiplies. */
void kn_matmul(kn_pool *p, const kn_weight *w, float *y, const float *x, kn_act *a, int B);

/* y[b * ldy + r] = w[r] . x[b] for r < n, b < B, on the calling thread:
 * float [n][k] against float [B][k] (the encoder's attention: scores and
 * the weighted sum of values as two small GEMMs per head). */
void kn_gemm_f32(const float *w, int64_t k, int64_t n, const float *x, int B, float *y, int64_t ldy);

/* Dequantizes row r of w into out[k] (embedding lookup). */
void kn_get_row(const kn_weight *w, int64_t r, float *out);

/* LoRA on one adapter's factors for nr rows, on the calling thread (Punica's shrink and expand):
 * t[r][k] = scale * x[r] . A[k] for k < ldr, with at A transposed ([in][ldr]; ldr a multiple of 16, the
 * columns past the rank zero), t [nr][ldr]; then y[r][o] += t[r][0..rk) . bt[0..rk)[o], bt B transposed
 * ([rk][out]), t's rows ldt apart. Factors are F32, or F16 when half. A row's result is the same wherever
 * it sits among the nr. */
#define KN_LORA_ALIGN 16
void kn_lora_shrink(const void *at, int half, int in, int ldr, const float *const *x, int nr, float scale,
                    float *t);
void kn_lora_expand(const void *bt, int half, int rk, int out, const float *t, int ldt, int nr,
                    float *const *y);

void kn_rmsnorm(float *out, const float *x, const float *w, int n, float eps);
/* Rotates n_heads heads of x [n_heads][head_dim] at position pos. inv_freq
 * has rope_dim/2 entries. */
void kn_rope(float *x, int n_heads, int head_dim, int rope_dim, int type, int pos,
             const float *inv_freq);
void kn_silu_mul(float *a, const float *b, int n); /* a = silu(a) * b */
void kn_gelu_mul(float *a, const float *b, int n); /* a = gelu(a) * b, GELU's tanh form (GeGLU) */
void kn_softmax(float *x, int n);
/* out[i] = exp((x[i] - mx) * scale), exactly 0 where (x[i] - mx) * scale is
 * below -87 (a masked logit, -inf, has probability 0); returns their sum.
 * mx >= every x[i]. The sampler's softmax over the vocabulary. */
float kn_exp_sum(const float *x, int n, float mx, float scale, float *out);

/* KV cache element types. F16 (or BF16, the range of f32) halves what
 * decode attention reads per token; FP8 (E4M3, no scale, as vLLM's default
 * fp8 cache) halves it again. */
enum { KN_KV_F32 = 0, KN_KV_F16 = 1, KN_KV_FP8 = 2, KN_KV_BF16 = 3 };
size_t kn_kv_elem_bytes(int kv_type);
/* dst[n] of kv_type <- src[n] (F16: round to nearest even). */
void kn_kv_store(int kv_type, void *dst, const float *src, int n);

/* Paged causal attention over several sequences in one call.
 *
 * The cache of one layer is a pool of blocks; a block holds 2^block_shift
 * positions of [n_kv][hd] elements (of kv_type) for K, and the same for V.
 * Position j of a sequence lives in block blocks[j >> block_shift], row
 * j & (2^block_shift - 1); kc/vc point at block 0 of the layer and
 * block_stride is the byte distance between blocks. A contiguous cache is the
 * special case blocks = 0, 1, 2, ...
 *
 * Sequence s has T tokens at positions pos0..pos0+T-1, whose queries are rows
 * row..row+T-1 of q [rows][n_head][hd]; their outputs go to the same rows of
 * out. Each token attends to positions 0..its own, or to the last `window`
 * of them (Gemma's and gpt-oss's local layers) (K/V of the new tokens must
 * already be stored). Decode is T = 1 for many sequences of different lengths;
 * prefill of a chunk over a cached prefix is pos0 > 0, T > 1. Work units
 * (token x KV head) are split over the pool by cost (positions read).
 * Scores and softmax in fp32; the result of a token does not depend on which
 * other sequences share the call or on how the pool splits the work. */
typedef struct {
    int T, pos0, row;
    const int32_t *blocks;
} kn_attn_seq;

typedef struct {
    int n_seq;
    const kn_attn_seq *seq;
    int n_head, n_kv, hd, kv_type, block_shift;
    int max_len;           /* >= pos0 + T of every sequence (sizes the scratch) */
    const float *q;
    float *out;
    const void *kc, *vc;
    size_t block_stride;   /* bytes */
    float *scratch;        /* kn_attention_scratch(max_len) floats per pool thread */
    int window;            /* sliding window: a token at p attends to p-window+1..p; 0: all before it */
    const float *sinks;    /* [n_head] attention sinks (gpt-oss): a learned logit per head that joins the
                            * softmax's max and denominator without a value, or NULL */
} kn_attn_args;
/* The first position a token at pos attends to under the args' window. */
static inline int kn_attn_first(const kn_attn_args *a, int pos) {
    return a->window > 0 && pos >= a->window ? pos - a->window + 1 : 0;
}
size_t kn_attention_scratch(int max_len);
void kn_attention(kn_pool *p, const kn_attn_args *a);

/* ---- scalar references (kn_ref.c), for tests --------------------------- */
float kn_ref_dequant(int type, const void *row, int64_t i);
/* y[B,N] in float64 accumulation from the raw (unpacked) weights. */
void kn_ref_matmul(const kn_weight *w, float *y, const float *x, int B);
void kn_ref_attention(const kn_attn_args *a);
/* The activation quantization rule for one block of 32 (every path matches it). */
void kn_ref_quant_block(const float *x, int8_t *q, float *d, float *ds);
/* FP8 E4M3 (the "fn" variant: no infinities, 448 the largest, 0x7f NaN):
 * round to nearest even, saturating at +-448; and back. The reference of
 * the CUDA backend's FP8 weights and activations. */
uint8_t kn_ref_f32_to_e4m3(float f);
float kn_ref_e4m3_to_f32(uint8_t v);
/* E4M3 code -> float, the FP8 KV cache's loads (a constant table). */
extern float kn_e4m3_lut[256];

#endif
