/* One decode step of the reference engine's Llama model in C (reference_engine/decode_native.py).
 *
 * The math is decode_numpy.py's, step for step: RMSNorm, RoPE (rotate_half), grouped-query
 * attention over the valid cached positions, the gated MLP (SiLU(gate) * up), the same block
 * bypass (a bypassed block still writes its K/V, then the stream passes unchanged or through its
 * low-rank map h + (h @ down) @ up), the residual stream written at every block boundary. Only
 * the summation order inside the dot products differs (16-wide partial sums), so logits agree
 * with the exact torch path to float32 rounding, not bit for bit.
 *
 * Why C: at batch 1 a decode step reads ~538 MB of fp32 weights through 121 matrix-vector
 * products. A whole step is one call here: one OpenMP parallel region, rows of every matrix split
 * across the threads, six barriers per block, no Python and no allocation per op.
 *
 * Units (ABI 2): attention and MLP of a block are kept or bypassed apart (keep_attn / keep_mlp), and
 * the unit gate (gate_bypass below) decides them inside this call from each unit's normalised
 * input, so the per-token router adds no Python per block.
 *
 * Unit maps (ABI 3): a bypassed unit may take its own low-rank stand-in, h += (h @ down) @ up from
 * the stream entering it (unit_down / unit_up / unit_rank, [2L] each, NULL entries for none). When
 * unit maps are given they replace the whole-block map in the unit path.
 *
 * Share controller (ABI 6): rsp_router carries a per-row log factor on the threshold, steered after
 * each step towards a target of bytes not read (router.UnitRouter's docstring).
 * Router state (ABI 4): with an rsp_router (rsp_router.h, included below) the unit router's
 * thresholds, norms, entropy and counters are computed in this call too, and timed.
 *
 * Verify (ABI 4): rsp_verify_step (rsp_verify.h, included at the end) runs S positions of one
 * sequence for lossless mode, bit-identical to S single-token steps.
 *
 * Weights are row-major [N, K] (y = W x), contiguous. The KV cache is [B, KV, T, hd] per layer.
 * Built by decode_native.py with the system C compiler; -march=native picks AVX-512 or AVX2 paths,
 * anything else takes the portable loop.
 */
#define _POSIX_C_SOURCE 199309L /* clock_gettime under -std=c11 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#endif

typedef struct {
    int64_t n_layers, D, F, H, KV, hd, V, max_positions;
    float eps;
    const float *embed, *final_norm, *lm_head, *cos, *sin;  /* cos, sin: [max_positions, hd] */
    const float *const *attn_norm, *const *wqkv, *const *wo, *const *mlp_norm, *const *w_gate_up,
        *const *w_down;
} rsp_model;

int rsp_abi_version(void) { return 6; }

int rsp_simd_width(void) {
#if defined(__AVX512F__)
    return 16;
#elif defined(__AVX2__) && defined(__FMA__)
    return 8;
#else
    return 1;
#endif
}

int rsp_openmp(void) {
#ifdef _OPENMP
    return 1;
#else
    return 0;
#endif
}

#if !defined(__AVX512F__) && defined(__AVX2__) && defined(__FMA__)
/* The AVX2 reduction of a dot product's two accumulators; dot_rows and dot_tile43 share it, so
 * that the tile's sums are the one-row loop's bits. */
static inline float hsum_pair(__m256 a, __m256 b) {
    a = _mm256_add_ps(a, b);
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
}
#endif

/* dot products of rows W[n..n+R) (R <= 4) with x, length K */
static inline void dot_rows(const float *W, int64_t K, int R, const float *x, float *out) {
#if defined(__AVX512F__)
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps(), a2 = _mm512_setzero_ps(),
           a3 = _mm512_setzero_ps();
    const float *w0 = W, *w1 = W + K, *w2 = W + 2 * K, *w3 = W + 3 * K;
    int64_t k = 0;
    if (R == 4) {
        for (; k + 16 <= K; k += 16) {
            __m512 xv = _mm512_loadu_ps(x + k);
            a0 = _mm512_fmadd_ps(_mm512_loadu_ps(w0 + k), xv, a0);
            a1 = _mm512_fmadd_ps(_mm512_loadu_ps(w1 + k), xv, a1);
            a2 = _mm512_fmadd_ps(_mm512_loadu_ps(w2 + k), xv, a2);
            a3 = _mm512_fmadd_ps(_mm512_loadu_ps(w3 + k), xv, a3);
        }
        if (k < K) {
            __mmask16 m = (__mmask16)((1u << (K - k)) - 1u);
            __m512 xv = _mm512_maskz_loadu_ps(m, x + k);
            a0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, w0 + k), xv, a0);
            a1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, w1 + k), xv, a1);
            a2 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, w2 + k), xv, a2);
            a3 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, w3 + k), xv, a3);
        }
        out[0] = _mm512_reduce_add_ps(a0);
        out[1] = _mm512_reduce_add_ps(a1);
        out[2] = _mm512_reduce_add_ps(a2);
        out[3] = _mm512_reduce_add_ps(a3);
        return;
    }
    for (int r = 0; r < R; r++) {
        const float *w = W + r * K;
        __m512 a = _mm512_setzero_ps();
        for (k = 0; k + 16 <= K; k += 16)
            a = _mm512_fmadd_ps(_mm512_loadu_ps(w + k), _mm512_loadu_ps(x + k), a);
        if (k < K) {
            __mmask16 m = (__mmask16)((1u << (K - k)) - 1u);
            a = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, w + k), _mm512_maskz_loadu_ps(m, x + k), a);
        }
        out[r] = _mm512_reduce_add_ps(a);
    }
#elif defined(__AVX2__) && defined(__FMA__)
    for (int r = 0; r < R; r++) {
        const float *w = W + r * K;
        __m256 a = _mm256_setzero_ps(), b = _mm256_setzero_ps();
        int64_t k = 0;
        for (; k + 16 <= K; k += 16) {
            a = _mm256_fmadd_ps(_mm256_loadu_ps(w + k), _mm256_loadu_ps(x + k), a);
            b = _mm256_fmadd_ps(_mm256_loadu_ps(w + k + 8), _mm256_loadu_ps(x + k + 8), b);
        }
        for (; k + 8 <= K; k += 8)
            a = _mm256_fmadd_ps(_mm256_loadu_ps(w + k), _mm256_loadu_ps(x + k), a);
        float t = hsum_pair(a, b);
        for (; k < K; k++) t += w[k] * x[k];
        out[r] = t;
    }
#else
    for (int r = 0; r < R; r++) {
        const float *w = W + r * K;
        float t = 0.0f;
#pragma omp simd reduction(+ : t)
        for (int64_t k = 0; k < K; k++) t += w[k] * x[k];
        out[r] = t;
    }
#endif
}

/* y[b*ys + n] (+)= W[n] . x[b*xs], rows n in [n0, n1); accumulate adds to y (the residual) */
static void gemv_rows(const float *W, int64_t K, int64_t n0, int64_t n1, const float *x, int64_t xs,
                      int64_t B, float *y, int64_t ys, int accumulate) {
    float o[4];
    for (int64_t n = n0; n < n1; n += 4) {
        int R = (int)(n1 - n < 4 ? n1 - n : 4);
        for (int64_t b = 0; b < B; b++) {
            dot_rows(W + n * K, K, R, x + b * xs, o);
            float *yb = y + b * ys + n;
            if (accumulate)
                for (int r = 0; r < R; r++) yb[r] += o[r];
            else
                for (int r = 0; r < R; r++) yb[r] = o[r];
        }
    }
}

/* gemv_rows for several x rows at once (batched decode steps, the verify pass, rsp_gemv):
 * y[b*ys + n] (+)= W[n] . x[b*xs].
 * With AVX-512, 4 weight rows meet up to 4 x rows in one pass over k (16 independent accumulators,
 * each weight vector loaded once for all x rows): an S-row product then costs about what one row
 * does while the weights stream from DRAM. Each (row, x) accumulator takes exactly dot_rows's
 * AVX-512 sequence (16-wide FMAs in k order, the same masked tail, _mm512_reduce_add_ps), so every
 * output is bit-identical to gemv_rows's. AVX2 builds take dot_tile43 (below), others gemv_rows itself. */
#if defined(__AVX512F__)
#ifndef RSP_PF_GROUPS
#define RSP_PF_GROUPS 2
#endif
#ifndef RSP_PF_HINT
#define RSP_PF_HINT _MM_HINT_T0
#endif
static inline __attribute__((always_inline)) void dot_multi(const float *W, int64_t K, const float *x, int64_t xs,
                                                            const int NB, const float *pf, float *o /* [4][4] */) {
    __m512 acc[4][4];
    for (int r = 0; r < 4; r++)
        for (int b = 0; b < NB; b++) acc[r][b] = _mm512_setzero_ps();
    int64_t k = 0;
    for (; k + 16 <= K; k += 16) {
        __m512 xv[4];
        for (int b = 0; b < NB; b++) xv[b] = _mm512_loadu_ps(x + b * xs + k);
        if (pf)
            for (int r = 0; r < 4; r++) _mm_prefetch((const char *)(pf + r * K + k), RSP_PF_HINT);
        for (int r = 0; r < 4; r++) {
            __m512 wv = _mm512_loadu_ps(W + r * K + k);
            for (int b = 0; b < NB; b++) acc[r][b] = _mm512_fmadd_ps(wv, xv[b], acc[r][b]);
        }
    }
    if (k < K) {
        __mmask16 m = (__mmask16)((1u << (K - k)) - 1u);
        __m512 xv[4];
        for (int b = 0; b < NB; b++) xv[b] = _mm512_maskz_loadu_ps(m, x + b * xs + k);
        for (int r = 0; r < 4; r++) {
            __m512 wv = _mm512_maskz_loadu_ps(m, W + r * K + k);
            for (int b = 0; b < NB; b++) acc[r][b] = _mm512_fmadd_ps(wv, xv[b], acc[r][b]);
        }
    }
    for (int r = 0; r < 4; r++)
        for (int b = 0; b < NB; b++) o[r * 4 + b] = _mm512_reduce_add_ps(acc[r][b]);
}
#endif

#if !defined(__AVX512F__) && defined(__AVX2__) && defined(__FMA__)
/* dot_rows's AVX2 sequence for 4 weight rows against NB (1 to 3) x rows. dot_rows keeps two
 * chains per output (a: the first 8 lanes of each 16-wide block of k, b: the second 8); here the
 * k loop runs twice, once per chain, so a pass needs one accumulator per (row, x) pair: 12
 * accumulators, 3 x vectors and 1 weight vector fill the 16 ymm registers. The empty asm
 * statements keep the loaded vectors in registers: without them GCC folds every load into its
 * FMA, 15 loads for 12 FMAs, and the loop waits on the load ports (31 against 40 G lanes/s with
 * the tile in L1 on the 2-core AVX2 EPYC). Each accumulator takes dot_rows's FMAs in dot_rows's
 * k order, then its tail and hsum_pair, so every output is bit-identical to gemv_rows's.
 * pf: the weight tile RSP_TILE_PF_AHEAD tiles ahead, or NULL; pfr: which of its rows this call's
 * chain 0 (pfr[0], pfr[1]) and chain 1 (pfr[2], pfr[3]) passes prefetch. gemv_multi spreads the
 * four rows over every pass a tile gets (2 per x chunk): issued all in the first pass, 144 line
 * prefetches in ~200 cycles filled the L1's miss buffers and that pass waited on them. With the 2 x 2
 * tile it replaces, the 2-thread product of the 49152 x 576 head took 7.4 ms for 8 x rows; this tile
 * with every prefetch in the first pass 5.6-6.1 ms, spread over the passes 5.1-5.2 ms (4 x rows:
 * 4.1-4.8 against 3.8-3.9; 1 x row takes gemv_rows; 2026-12-07, the 2-core AVX2 EPYC, standalone
 * over random weights, bit-identical outputs). */
#ifndef RSP_TILE_PF_AHEAD
#define RSP_TILE_PF_AHEAD 3
#endif
static inline __attribute__((always_inline)) void dot_tile43(const float *W, int64_t K, const float *x, int64_t xs,
                                                             const int NB, const float *pf, const int *pfr,
                                                             float *o /* [4][3] */) {
    __m256 a[4][3], b[4][3];
    const int64_t K16 = K & ~(int64_t)15;
    for (int chain = 0; chain < 2; chain++) {
        __m256 acc[4][3];
        for (int r = 0; r < 4; r++)
            for (int j = 0; j < NB; j++) acc[r][j] = _mm256_setzero_ps();
        for (int64_t k = chain * 8; k < K16; k += 16) {
            if (pf) /* chain 1's k is 8 past a line's start: prefetch that line */
                for (int r = pfr[2 * chain]; r < pfr[2 * chain + 1]; r++)
                    _mm_prefetch((const char *)(pf + r * K + (k & ~(int64_t)15)), _MM_HINT_T0);
            __m256 xv[3];
            for (int j = 0; j < NB; j++) {
                xv[j] = _mm256_loadu_ps(x + j * xs + k);
                __asm__("" : "+x"(xv[j]));
            }
            for (int r = 0; r < 4; r++) {
                __m256 wv = _mm256_loadu_ps(W + r * K + k);
                __asm__("" : "+x"(wv));
                for (int j = 0; j < NB; j++) acc[r][j] = _mm256_fmadd_ps(wv, xv[j], acc[r][j]);
            }
        }
        for (int r = 0; r < 4; r++)
            for (int j = 0; j < NB; j++) {
                if (chain == 0)
                    a[r][j] = acc[r][j];
                else
                    b[r][j] = acc[r][j];
            }
    }
    int64_t k8 = K16; /* dot_rows's 8-wide step and scalar tail, both on chain a */
    for (; k8 + 8 <= K; k8 += 8)
        for (int r = 0; r < 4; r++)
            for (int j = 0; j < NB; j++)
                a[r][j] = _mm256_fmadd_ps(_mm256_loadu_ps(W + r * K + k8), _mm256_loadu_ps(x + j * xs + k8), a[r][j]);
    for (int r = 0; r < 4; r++)
        for (int j = 0; j < NB; j++) {
            const float *w = W + r * K, *xj = x + j * xs;
            float t = hsum_pair(a[r][j], b[r][j]);
            for (int64_t kk = k8; kk < K; kk++) t += w[kk] * xj[kk];
            o[r * 3 + j] = t;
        }
}
#endif

static void gemv_multi(const float *W, int64_t K, int64_t n0, int64_t n1, const float *x, int64_t xs, int64_t B,
                       float *y, int64_t ys, int accumulate) {
#if defined(__AVX512F__)
    float o[16];
    int64_t n = n0;
    for (; n + 4 <= n1; n += 4) {
        for (int64_t b0 = 0; b0 < B; b0 += 4) {
            const int nb = (int)(B - b0 < 4 ? B - b0 : 4);
            const float *xb = x + b0 * xs;
            /* the first x chunk prefetches the weight rows RSP_PF_GROUPS groups ahead */
            const float *pf = b0 == 0 && RSP_PF_GROUPS > 0 ? W + (n + 4 * RSP_PF_GROUPS) * K : NULL;
            switch (nb) { /* constant NB: the accumulators stay in registers */
            case 4: dot_multi(W + n * K, K, xb, xs, 4, pf, o); break;
            case 3: dot_multi(W + n * K, K, xb, xs, 3, pf, o); break;
            case 2: dot_multi(W + n * K, K, xb, xs, 2, pf, o); break;
            default: dot_multi(W + n * K, K, xb, xs, 1, pf, o); break;
            }
            for (int b = 0; b < nb; b++) {
                float *yb = y + (b0 + b) * ys + n;
                for (int r = 0; r < 4; r++) yb[r] = accumulate ? yb[r] + o[r * 4 + b] : o[r * 4 + b];
            }
        }
    }
    if (n < n1) gemv_rows(W, K, n, n1, x, xs, B, y, ys, accumulate); /* < 4 rows left */
#elif defined(__AVX2__) && defined(__FMA__)
    float o[12];
    int64_t n = n0;
    /* each tile gets 2 passes per chunk of 3 x rows; its 4 rows' prefetches are shared among them */
    const int passes = 2 * (int)((B + 2) / 3), per = (4 + passes - 1) / passes;
    for (; n + 4 <= n1; n += 4) {
        const float *pf = n + 4 * (RSP_TILE_PF_AHEAD + 1) <= n1 ? W + (n + 4 * RSP_TILE_PF_AHEAD) * K : NULL;
        for (int64_t b0 = 0; b0 < B; b0 += 3) {
            const int nb = (int)(B - b0 < 3 ? B - b0 : 3);
            const float *xb = x + b0 * xs;
            int pfr[4]; /* the rows this x chunk's two passes prefetch (dot_tile43) */
            for (int c = 0; c < 2; c++) {
                const int lo = ((int)(b0 / 3) * 2 + c) * per;
                pfr[2 * c] = lo < 4 ? lo : 4;
                pfr[2 * c + 1] = lo + per < 4 ? lo + per : 4;
            }
            const float *p = pfr[0] < 4 ? pf : NULL;
            switch (nb) { /* constant NB: the accumulators stay in registers */
            case 3: dot_tile43(W + n * K, K, xb, xs, 3, p, pfr, o); break;
            case 2: dot_tile43(W + n * K, K, xb, xs, 2, p, pfr, o); break;
            default: dot_tile43(W + n * K, K, xb, xs, 1, p, pfr, o); break;
            }
            for (int j = 0; j < nb; j++) {
                float *yb = y + (b0 + j) * ys + n;
                for (int r = 0; r < 4; r++) yb[r] = accumulate ? yb[r] + o[r * 3 + j] : o[r * 3 + j];
            }
        }
    }
    if (n < n1) gemv_rows(W, K, n, n1, x, xs, B, y, ys, accumulate); /* < 4 rows left */
#else
    gemv_rows(W, K, n0, n1, x, xs, B, y, ys, accumulate);
#endif
}

/* The step's and rsp_gemv's product: one x row takes gemv_rows (the batch-1 decode path as it
 * was measured), several take gemv_multi; both give every output bit for bit. */
static inline void gemv_any(const float *W, int64_t K, int64_t n0, int64_t n1, const float *x, int64_t xs,
                            int64_t B, float *y, int64_t ys, int accumulate) {
    if (B > 1)
        gemv_multi(W, K, n0, n1, x, xs, B, y, ys, accumulate);
    else
        gemv_rows(W, K, n0, n1, x, xs, B, y, ys, accumulate);
}

/* thread tid's share of n rows, in blocks of 16 rows (a 4-row kernel, whole cache lines of y) */
static inline void share(int64_t n, int tid, int nt, int64_t *a, int64_t *b) {
    int64_t blocks = (n + 15) / 16, per = blocks / nt, extra = blocks % nt;
    int64_t s = tid * per + (tid < extra ? tid : extra), e = s + per + (tid < extra ? 1 : 0);
    *a = s * 16 < n ? s * 16 : n;
    *b = e * 16 < n ? e * 16 : n;
}

/* weight * (x * (1 / sqrt(mean(x^2) + eps))), as decode_numpy._rms (each thread its own copy) */
static void rms(const float *x, const float *w, int64_t B, int64_t D, float eps, float *out) {
    for (int64_t b = 0; b < B; b++) {
        const float *xb = x + b * D;
        float ss;
        dot_rows(xb, D, 1, xb, &ss);
        float inv = 1.0f / sqrtf(ss / (float)D + eps);
        for (int64_t d = 0; d < D; d++) out[b * D + d] = w[d] * (xb[d] * inv);
    }
}

/* x * cos + rotate_half(x) * sin, rotate_half(x) = cat(-x[half:], x[:half]); out may alias x */
static void rope(const float *x, const float *c, const float *s, int64_t hd, float *out) {
    float tmp[512];
    int64_t half = hd / 2;
    for (int64_t i = 0; i < hd; i++) {
        float rot = i < half ? -x[i + half] : x[i - half];
        tmp[i] = x[i] * c[i] + rot * s[i];
    }
    memcpy(out, tmp, (size_t)hd * sizeof(float));
}

/* Returns 0, or a negative code: -1 bad dims, -2 out of memory, -3 a token or position out of range. */
/* One query head's attention over keys 0..n-1 (masked where !valid): softmax, then the weighted
 * sum of values into o. Decode and verify both call it, so a position's attention is summed in
 * one order whichever pass computes it (what makes the verify pass bit-identical to decode). */
static void attend_head(const float *q, const float *Kb, const float *Vb, const uint8_t *valid, int64_t n,
                        int64_t hd, float scale, float *sc, float *o) {
    float mx = -INFINITY;
    for (int64_t t = 0; t < n; t++) {
        float s = -INFINITY;
        if (valid[t]) {
            float d;
            dot_rows(Kb + t * hd, hd, 1, q, &d);
            s = d * scale;
        }
        sc[t] = s;
        mx = s > mx ? s : mx;
    }
    float sum = 0.0f;
    for (int64_t t = 0; t < n; t++) {
        sc[t] = expf(sc[t] - mx);
        sum += sc[t];
    }
    for (int64_t d = 0; d < hd; d++) o[d] = 0.0f;
    for (int64_t t = 0; t < n; t++) {
        const float p = sc[t] / sum, *vr = Vb + t * hd;
        if (p == 0.0f) continue;
        for (int64_t d = 0; d < hd; d++) o[d] += p * vr[d];
    }
}

/* h[b] += (h[b] @ dn) @ up for every row: the low-rank stand-in of a bypassed block or unit.
 * One thread runs it (rank x D x 2 multiply-adds per row, ~37k at rank 32: not worth a barrier). */
static void low_rank_add(float *h, int64_t B, int64_t D, const float *dn, const float *up, int64_t r, float *lo,
                         float *tmp) {
    for (int64_t b = 0; b < B; b++) {
        float *hb = h + b * D;
        for (int64_t j = 0; j < r; j++) lo[j] = 0.0f;
        for (int64_t d = 0; d < D; d++) {
            const float hv = hb[d], *drow = dn + d * r;
            for (int64_t j = 0; j < r; j++) lo[j] += hv * drow[j];
        }
        for (int64_t d = 0; d < D; d++) tmp[d] = 0.0f;
        for (int64_t j = 0; j < r; j++) {
            const float lv = lo[j], *urow = up + j * D;
            for (int64_t d = 0; d < D; d++) tmp[d] += lv * urow[d];
        }
        for (int64_t d = 0; d < D; d++) hb[d] += tmp[d];
    }
}

/* The unit gate (all NULL when unused): gate_w [2L, D], gate_b [2L], log_tau [B, 2L]; unit 2l is
 * block l's attention, 2l+1 its MLP. Before a unit runs, every thread computes the same
 * s_b = gate_w[u] . x_b + gate_b[u] from its own copy of the unit's normalised input x (the same
 * code on the same data, so all threads and any thread count reach the same decision, with no
 * barrier), and the unit is bypassed when s_b < log_tau[b, u] for every row b. Thread 0 writes
 * scores [B, 2L] and decisions [2L] (1 = bypassed) for the caller. */
static int gate_bypass(const float *gate_w, const float *gate_b, const float *log_tau, int64_t u, int64_t U,
                       const float *x, int64_t B, int64_t D, int tid, float *scores, uint8_t *decisions) {
    int all = 1;
    for (int64_t b = 0; b < B; b++) {
        float s;
        dot_rows(gate_w + u * D, D, 1, x + b * D, &s);
        s += gate_b[u];
        if (tid == 0 && scores) scores[b * U + u] = s;
        if (!(s < log_tau[b * U + u])) all = 0;
    }
    if (tid == 0 && decisions) decisions[u] = (uint8_t)all;
    return all;
}

static void fixed_off(int64_t u, int64_t U, int64_t B, int tid, float *scores, uint8_t *decisions) {
    if (tid != 0) return;
    if (scores)
        for (int64_t b = 0; b < B; b++) scores[b * U + u] = -INFINITY;
    if (decisions) decisions[u] = 1;
}

#include "rsp_router.h" /* the unit router inside the step (ABI 4) */

/* One decode step. Returns 0, or a negative code (see above). rs (ABI 4; NULL = no router state):
 * the unit router's bookkeeping runs in this call too; it needs the gate (log_tau is then written
 * here, before the first block, from rs) and its batch and block count must match. */
int rsp_decode_step(const rsp_model *m, float *const *kc, float *const *vc, int64_t T, int64_t B,
                    int64_t start, const int64_t *tok, const int64_t *pos, const uint8_t *valid,
                    int64_t valid_stride, const uint8_t *keep_attn, const uint8_t *keep_mlp,
                    const float *const *byp_down, const float *const *byp_up, const int64_t *byp_rank,
                    const float *const *unit_down, const float *const *unit_up, const int64_t *unit_rank,
                    const float *gate_w, const float *gate_b, const float *log_tau, float *gate_scores,
                    uint8_t *gate_decisions, float *stream, float *logits, int nthreads, rsp_router *rs) {
    const int64_t L = m->n_layers, D = m->D, F = m->F, H = m->H, KV = m->KV, hd = m->hd, V = m->V;
    const int64_t qd = H * hd, kvd = KV * hd, QW = qd + 2 * kvd, G = H / KV, end = start + 1;
    const float eps = m->eps, scale = (float)(1.0 / sqrt((double)hd));
    const int64_t U = 2 * L;
    const int gated = gate_w != NULL && gate_b != NULL && log_tau != NULL;
    if (hd > 512 || G * KV != H || start < 0 || end > T || B < 1) return -1;
    if (rs && (!gated || !gate_decisions || rs->B != B || rs->L != L)) return -1;
    for (int64_t b = 0; b < B; b++)
        if (tok[b] < 0 || tok[b] >= V || pos[b] < 0 || pos[b] >= m->max_positions) return -3;
    int64_t rmax = 0;
    if (byp_rank)
        for (int64_t l = 0; l < L; l++) rmax = byp_rank[l] > rmax ? byp_rank[l] : rmax;
    const int unit_maps = unit_down != NULL && unit_up != NULL && unit_rank != NULL;
    if (unit_maps)
        for (int64_t u = 0; u < U; u++) rmax = unit_rank[u] > rmax ? unit_rank[u] : rmax;
    float *h = malloc(sizeof(float) * (size_t)(B * D));
    float *qkv = malloc(sizeof(float) * (size_t)(B * QW));
    float *attn = malloc(sizeof(float) * (size_t)(B * qd));
    float *gu = malloc(sizeof(float) * (size_t)(B * 2 * F));
    float *act = malloc(sizeof(float) * (size_t)(B * F));
    float *low = malloc(sizeof(float) * (size_t)(B * (rmax > 0 ? rmax : 1)));
    double router_before = 0.0;
    int rc = 0;
    if (rs) {
        for (int i = 2; i <= 6; i++) router_before += rs->times[i];
        double t0 = now_s();
        router_plan(rs, (float *)log_tau);
        rs->times[2] += now_s() - t0;
    }
    if (!h || !qkv || !attn || !gu || !act || !low ) {
        rc = -2;
        goto done;
    }
    for (int64_t b = 0; b < B; b++) memcpy(h + b * D, m->embed + tok[b] * D, sizeof(float) * (size_t)D);
    if (stream) memcpy(stream, h, sizeof(float) * (size_t)(B * D));
    if (nthreads < 1) nthreads = 1;

#pragma omp parallel num_threads(nthreads)
    {
#ifdef _OPENMP
        const int tid = omp_get_thread_num(), nt = omp_get_num_threads();
#else
        const int tid = 0, nt = 1;
#endif
        float *xn = malloc(sizeof(float) * (size_t)(B * (D > F ? D : F)));
        float *sc = malloc(sizeof(float) * (size_t)end);
        if (!xn || !sc) {
#pragma omp atomic write
            rc = -2;
        }
        int64_t a, e;
        for (int64_t l = 0; l < L; l++) {
            int run = keep_attn == NULL || keep_attn[l];
            float *K = kc[l], *Vc = vc[l];
            if (rc == 0) rms(h, m->attn_norm[l], B, D, eps, xn);
            if (rs && tid == 0 && rc == 0) router_norms(rs, h, l, D);
            if (gated) {
                if (!run) fixed_off(2 * l, U, B, tid, gate_scores, gate_decisions);
                else if (rc == 0 && gate_timed(rs, tid, gate_w, gate_b, log_tau, 2 * l, U, xn, B, D, gate_scores,
                                               gate_decisions)) run = 0;
            }
            if (run) {
                share(QW, tid, nt, &a, &e);
                if (rc == 0) gemv_any(m->wqkv[l], D, a, e, xn, D, B, qkv, QW, 0);
            } else {
                share(2 * kvd, tid, nt, &a, &e);
                if (rc == 0) gemv_any(m->wqkv[l] + qd * D, D, a, e, xn, D, B, qkv + qd, QW, 0);
            }
#pragma omp barrier
            /* RoPE on q (in place) and k (into the cache), v into the cache */
            {
                const int64_t heads = run ? H + KV : KV, tasks = B * heads;
                for (int64_t i = tid; i < tasks && rc == 0; i += nt) {
                    int64_t b = i / heads, j = i % heads;
                    if (run) j -= H; /* j < 0: a query head, j >= 0: a K/V head */
                    const float *c = m->cos + pos[b] * hd, *s = m->sin + pos[b] * hd;
                    float *row = qkv + b * QW;
                    if (j < 0) {
                        rope(row + (j + H) * hd, c, s, hd, row + (j + H) * hd);
                    } else {
                        int64_t off = ((b * KV + j) * T + start) * hd;
                        rope(row + qd + j * hd, c, s, hd, K + off);
                        memcpy(Vc + off, row + qd + kvd + j * hd, sizeof(float) * (size_t)hd);
                    }
                }
            }
#pragma omp barrier
            if (run) {
            /* attention, one (row, query head) per task: softmax over the valid positions */
            for (int64_t i = tid; i < B * H && rc == 0; i += nt) {
                int64_t b = i / H, hh = i % H, j = hh / G;
                attend_head(qkv + b * QW + hh * hd, K + (b * KV + j) * T * hd, Vc + (b * KV + j) * T * hd,
                            valid + b * valid_stride, end, hd, scale, sc, attn + b * qd + hh * hd);
            }
#pragma omp barrier
            share(D, tid, nt, &a, &e);
            if (rc == 0) gemv_any(m->wo[l], qd, a, e, attn, qd, B, h, D, 1);
#pragma omp barrier
            } else if (unit_maps && unit_down[2 * l] && unit_up[2 * l]) {
                /* RoPE above was the last reader of xn from h's old value; thread 0 writes h */
                if (tid == 0 && rc == 0) low_rank_add(h, B, D, unit_down[2 * l], unit_up[2 * l], unit_rank[2 * l], low, xn);
#pragma omp barrier
            }
            int run_m = keep_mlp == NULL || keep_mlp[l];
            if (rc == 0) rms(h, m->mlp_norm[l], B, D, eps, xn);
            if (gated) {
                if (!run_m) fixed_off(2 * l + 1, U, B, tid, gate_scores, gate_decisions);
                else if (rc == 0 && gate_timed(rs, tid, gate_w, gate_b, log_tau, 2 * l + 1, U, xn, B, D, gate_scores,
                                               gate_decisions)) run_m = 0;
            }
            if (!run_m) {
#pragma omp barrier
                /* every thread has read h for its decision: thread 0 may now write it */
                if (tid == 0 && rc == 0) {
                    if (unit_maps) {
                        if (unit_down[2 * l + 1] && unit_up[2 * l + 1])
                            low_rank_add(h, B, D, unit_down[2 * l + 1], unit_up[2 * l + 1], unit_rank[2 * l + 1], low, xn);
                    } else if (byp_down && byp_up && !run && byp_down[l] && byp_up[l]) {
                        low_rank_add(h, B, D, byp_down[l], byp_up[l], byp_rank[l], low, xn);
                    }
                    if (stream) memcpy(stream + (l + 1) * B * D, h, sizeof(float) * (size_t)(B * D));
                }
#pragma omp barrier
                continue;
            }
            if (rc == 0) {
                share(F, tid, nt, &a, &e);
                gemv_any(m->w_gate_up[l], D, a, e, xn, D, B, gu, 2 * F, 0);
                gemv_any(m->w_gate_up[l], D, F + a, F + e, xn, D, B, gu, 2 * F, 0);
                for (int64_t b = 0; b < B; b++)
                    for (int64_t n = a; n < e; n++) {
                        const float g = gu[b * 2 * F + n];
                        act[b * F + n] = g / (1.0f + expf(-g)) * gu[b * 2 * F + F + n];
                    }
            }
#pragma omp barrier
            share(D, tid, nt, &a, &e);
            if (rc == 0) {
                gemv_any(m->w_down[l], F, a, e, act, F, B, h, D, 1);
                if (stream)
                    for (int64_t b = 0; b < B; b++)
                        memcpy(stream + ((l + 1) * B + b) * D + a, h + b * D + a, sizeof(float) * (size_t)(e - a));
            }
#pragma omp barrier
        }
        if (rs && tid == 0 && rc == 0) router_norms(rs, h, L, D);
        if (rc == 0) {
            rms(h, m->final_norm, B, D, eps, xn);
            share(V, tid, nt, &a, &e);
            gemv_any(m->lm_head, D, a, e, xn, D, B, logits, V, 0);
        }
        if (rs) { /* the same for every thread: the barrier is met by all */
#pragma omp barrier
            if (tid == 0 && rc == 0) { /* every row's logits are in */
                const double te = now_s();
                entropy_rows(logits, B, V, rs->step_entropy, NULL);
                rs->times[5] += now_s() - te;
                router_finish(rs, gate_decisions);
            }
        }
        free(xn);
        free(sc);
    }
done:
    if (rs) {
        double after = 0.0;
        for (int i = 2; i <= 6; i++) after += rs->times[i];
        rs->times[0] = after - router_before;
        rs->times[1] += rs->times[0];
    }
    free(h);
    free(qkv);
    free(attn);
    free(gu);
    free(act);
    free(low);
    return rc;
}

/* y[b, n] = W[n] . x[b] over all rows, threaded: the roofline probe and a unit-testable GEMV */
int rsp_gemv(const float *W, int64_t N, int64_t K, const float *x, int64_t B, float *y, int nthreads) {
    if (nthreads < 1) nthreads = 1;
#pragma omp parallel num_threads(nthreads)
    {
#ifdef _OPENMP
        const int tid = omp_get_thread_num(), nt = omp_get_num_threads();
#else
        const int tid = 0, nt = 1;
#endif
        int64_t a, e;
        share(N, tid, nt, &a, &e);
        gemv_any(W, K, a, e, x, K, B, y, N, 0);
    }
    return 0;
}

#include "rsp_verify.h" /* lossless mode's multi-position verify pass */
