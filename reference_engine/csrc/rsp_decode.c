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

int rsp_abi_version(void) { return 3; }

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
        a = _mm256_add_ps(a, b);
        __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
        s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
        float t = _mm_cvtss_f32(s);
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

/* ---- the unit router inside the step (router.UnitRouter's bookkeeping; ABI 3) ----
 * All arrays are owned by the Python UnitRouter (numpy, read and written by pointer). Per-row state is
 * double, as in numpy; thresholds end as float log_tau for the gate. Everything here runs on thread 0
 * except the entropy partials, which are split in RSP_ENT_CHUNKS fixed chunks (not per thread) and
 * combined in chunk order, so any thread count gives the same bits. */
typedef struct {
    int64_t B, L;
    double entropy_ref, ent_alpha, tau_min, tau_max, f_lo, f_hi, block_bytes;
    const double *inv_grad_ref;  /* [L] 1 / max(grad_ref, 1e-6) */
    const double *base;          /* [B] tau0 * f_density * f_watermark * sensitivity / 0.5 */
    const double *tau_weight;    /* [2L] bytes share (or 1) */
    const uint8_t *protect;      /* [2L] 1: blacklisted unit, never bypassed */
    const uint8_t *active;       /* [B] 0: degraded row, vetoes every bypass */
    const uint8_t *row_done;     /* [B] 1: the row has finished, its counts stop */
    const int64_t *unit_bytes;   /* [2L] */
    double *entropy;             /* [B] entropy EMA (nats), updated */
    double *grad;                /* [B, L] |dlog||h||| on the latest token where a unit of l ran, updated */
    uint8_t *last;               /* [2L] the previous step's decisions (for flips), updated */
    double *norms;               /* [B, L+1] this step's stream norms at the block boundaries */
    double *step_entropy;        /* [B] this step's next-token entropy (nats) */
    int64_t *bytes_saved;        /* [B] accumulated over steps where the row is not done */
    int64_t *units_bypassed;     /* [B] idem */
    int64_t *counts;             /* [0] flips, [1] decisions, [2] this step's bytes saved, [3] its units,
                                    [4] total bytes (per row that ran every step) */
    double *times;               /* [0] this step's router seconds, [1] total, [2] plan, [3] gate,
                                    [4] norms, [5] entropy, [6] observe (the last five summed) */
} rsp_router;

#define RSP_ENT_CHUNKS 64

static inline double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* UnitRouter.plan: log_tau [B, 2L] from the entropy EMA and the gradient state */
static void router_plan(rsp_router *r, float *log_tau) {
    const int64_t B = r->B, L = r->L, U = 2 * L;
    int veto = 0;
    for (int64_t b = 0; b < B; b++) veto |= !r->active[b];
    for (int64_t b = 0; b < B; b++) {
        double f_ent = (r->entropy_ref + 0.5) / (r->entropy[b] + 0.5);
        f_ent = f_ent < r->f_lo ? r->f_lo : (f_ent > r->f_hi ? r->f_hi : f_ent);
        const double bf = r->base[b] * f_ent;
        for (int64_t l = 0; l < L; l++) {
            double excess = r->grad[b * L + l] * r->inv_grad_ref[l] - 1.0;
            excess = excess > 0.0 ? excess : 0.0;
            double f_grad = 1.0 / (1.0 + 2.0 * excess);
            f_grad = f_grad > r->f_lo ? f_grad : r->f_lo;
            double tau = bf * f_grad;
            tau = tau < r->tau_min ? r->tau_min : (tau > r->tau_max ? r->tau_max : tau);
            for (int64_t u = 2 * l; u < 2 * l + 2; u++) {
                double t = tau * r->tau_weight[u];
                t = t < r->tau_min ? r->tau_min : (t > r->tau_max ? r->tau_max : t);
                log_tau[b * U + u] = (veto || r->protect[u]) ? -INFINITY : (float)log(t);
            }
        }
    }
}

/* ||h_b|| at block boundary l (thread 0; h is complete: every block ends on a barrier) */
static void router_norms(rsp_router *r, const float *h, int64_t l, int64_t D) {
    double t0 = now_s();
    for (int64_t b = 0; b < r->B; b++) {
        float ss;
        dot_rows(h + b * D, D, 1, h + b * D, &ss);
        r->norms[b * (r->L + 1) + l] = sqrt((double)ss);
    }
    r->times[4] += now_s() - t0;
}

/* gate_bypass, timed on thread 0 when the router state is given */
static int gate_timed(rsp_router *r, int tid, const float *gate_w, const float *gate_b, const float *log_tau,
                      int64_t u, int64_t U, const float *x, int64_t B, int64_t D, float *scores,
                      uint8_t *decisions) {
    if (!r) return gate_bypass(gate_w, gate_b, log_tau, u, U, x, B, D, tid, scores, decisions);
    double t0 = tid == 0 ? now_s() : 0.0;
    int by = gate_bypass(gate_w, gate_b, log_tau, u, U, x, B, D, tid, scores, decisions);
    /* The step streams 0.5 GB between two gate rows, so each row comes from DRAM; ask for the next
     * unit's row now, while this unit's weights stream, so that its read hits the cache. */
    if (u + 1 < U)
        for (int64_t k = 0; k < D; k += 16) __builtin_prefetch(gate_w + (u + 1) * D + k, 0, 2);
    if (tid == 0) r->times[3] += now_s() - t0;
    return by;
}

/* exp(x) for x <= 0 (Cephes expf polynomial, relative error ~1e-7), 16 / 8 / 1 at a time */
#if defined(__AVX512F__)
static inline __m512 exp_neg16(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_scalef_ps(p, n);
}
#elif defined(__AVX2__) && defined(__FMA__)
static inline __m256 exp_neg8(__m256 x) {
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}
#endif

/* One chunk of a row's logits z[0..n): its max m, s = sum exp(z - m), t = sum exp(z - m) (z - m) */
static void entropy_chunk(const float *z, int64_t n, double *out) {
    float m = -INFINITY;
    int64_t i = 0;
    /* the max as vectors: a scalar compare-select chain is latency-bound (75 us over 49k logits) */
#if defined(__AVX512F__)
    if (n >= 16) {
        __m512 vmax = _mm512_loadu_ps(z);
        for (i = 16; i + 16 <= n; i += 16) vmax = _mm512_max_ps(vmax, _mm512_loadu_ps(z + i));
        m = _mm512_reduce_max_ps(vmax);
    }
#elif defined(__AVX2__) && defined(__FMA__)
    if (n >= 8) {
        __m256 vmax = _mm256_loadu_ps(z);
        for (i = 8; i + 8 <= n; i += 8) vmax = _mm256_max_ps(vmax, _mm256_loadu_ps(z + i));
        float lm[8];
        _mm256_storeu_ps(lm, vmax);
        for (int k = 0; k < 8; k++) m = lm[k] > m ? lm[k] : m;
    }
#endif
    for (; i < n; i++) m = z[i] > m ? z[i] : m;
    float s = 0.0f, t = 0.0f;
    i = 0;
#if defined(__AVX512F__)
    __m512 vm = _mm512_set1_ps(m), vs = _mm512_setzero_ps(), vt = _mm512_setzero_ps();
    for (; i + 16 <= n; i += 16) {
        __m512 d = _mm512_sub_ps(_mm512_loadu_ps(z + i), vm), e = exp_neg16(d);
        vs = _mm512_add_ps(vs, e);
        vt = _mm512_fmadd_ps(e, d, vt);
    }
    s = _mm512_reduce_add_ps(vs);
    t = _mm512_reduce_add_ps(vt);
#elif defined(__AVX2__) && defined(__FMA__)
    __m256 vm = _mm256_set1_ps(m), vs = _mm256_setzero_ps(), vt = _mm256_setzero_ps();
    for (; i + 8 <= n; i += 8) {
        __m256 d = _mm256_sub_ps(_mm256_loadu_ps(z + i), vm), e = exp_neg8(d);
        vs = _mm256_add_ps(vs, e);
        vt = _mm256_fmadd_ps(e, d, vt);
    }
    float ls[8], lt[8];
    _mm256_storeu_ps(ls, vs);
    _mm256_storeu_ps(lt, vt);
    for (int k = 0; k < 8; k++) {
        s += ls[k];
        t += lt[k];
    }
#endif
    for (; i < n; i++) {
        const float d = z[i] - m, e = expf(d);
        s += e;
        t += e * d;
    }
    out[0] = m;
    out[1] = s;
    out[2] = t;
}

/* next-token entropy in nats of each row of logits [B, V], -sum p log p with p = softmax(z):
 * H = log S - T / S over RSP_ENT_CHUNKS fixed chunks combined in order (stable for any logits). One
 * thread runs it: ~49k exps at SIMD width take ~15 us, and a split would put a barrier wait (another
 * thread descheduled on a loaded machine) into the router's time. */
static void entropy_rows(const float *logits, int64_t B, int64_t V, double *out) {
    const int64_t C = RSP_ENT_CHUNKS, per = (V + C - 1) / C;
    double p[3 * RSP_ENT_CHUNKS];
    for (int64_t b = 0; b < B; b++) {
        int64_t n = 0;
        for (int64_t c = 0; c < C && c * per < V; c++, n++) {
            const int64_t a = c * per, e = a + per < V ? a + per : V;
            entropy_chunk(logits + b * V + a, e - a, p + 3 * c);
        }
        double M = -INFINITY, S = 0.0, T = 0.0;
        for (int64_t c = 0; c < n; c++) M = p[3 * c] > M ? p[3 * c] : M;
        for (int64_t c = 0; c < n; c++) {
            const double dm = p[3 * c] - M, w = exp(dm);
            S += w * p[3 * c + 1];
            T += w * (p[3 * c + 2] + dm * p[3 * c + 1]);
        }
        out[b] = log(S) - T / S;
    }
}

/* the entropy of logits [B, V] as the router computes it (unit tests against numpy) */
int rsp_entropy(const float *logits, int64_t B, int64_t V, double *out) {
    if (B < 1 || V < 1) return -1;
    entropy_rows(logits, B, V, out);
    return 0;
}

/* UnitRouter.after_step + observe_step, on thread 0 once this step's entropy is in: flips and bytes,
 * the gradient of blocks where a unit ran, the EMAs */
static void router_finish(rsp_router *r, const uint8_t *decisions) {
    const int64_t B = r->B, L = r->L, U = 2 * L;
    double t1 = now_s();
    int64_t saved = 0, units = 0, flips = 0;
    for (int64_t u = 0; u < U; u++) {
        const uint8_t by = decisions[u] ? 1 : 0;
        flips += by != r->last[u];
        r->last[u] = by;
        if (by) saved += r->unit_bytes[u], units++;
    }
    r->counts[0] += flips;
    r->counts[1] += U;
    r->counts[2] = saved;
    r->counts[3] = units;
    r->counts[4] += saved;
    for (int64_t b = 0; b < B; b++) {
        if (!r->row_done[b]) r->bytes_saved[b] += saved, r->units_bypassed[b] += units;
        const double *n = r->norms + b * (L + 1);
        for (int64_t l = 0; l < L; l++)
            if (!(decisions[2 * l] && decisions[2 * l + 1])) {
                const double lo = n[l] > 1e-9 ? n[l] : 1e-9, hi = n[l + 1] > 1e-9 ? n[l + 1] : 1e-9;
                r->grad[b * L + l] = fabs(log(hi) - log(lo));
            }
        r->entropy[b] = r->ent_alpha * r->step_entropy[b] + (1.0 - r->ent_alpha) * r->entropy[b];
    }
    r->times[6] += now_s() - t1;
}

/* One decode step. Returns 0, or a negative code (see above). rs (ABI 3; NULL = no router state):
 * the unit router's bookkeeping runs in this call too; it needs the gate (log_tau is then written
 * here, before the first block, from rs) and its batch and block count must match. */
int rsp_decode_step(const rsp_model *m, float *const *kc, float *const *vc, int64_t T, int64_t B,
                    int64_t start, const int64_t *tok, const int64_t *pos, const uint8_t *valid,
                    int64_t valid_stride, const uint8_t *keep_attn, const uint8_t *keep_mlp,
                    const float *const *byp_down, const float *const *byp_up, const int64_t *byp_rank,
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
                if (rc == 0) gemv_rows(m->wqkv[l], D, a, e, xn, D, B, qkv, QW, 0);
            } else {
                share(2 * kvd, tid, nt, &a, &e);
                if (rc == 0) gemv_rows(m->wqkv[l] + qd * D, D, a, e, xn, D, B, qkv + qd, QW, 0);
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
                const float *q = qkv + b * QW + hh * hd;
                const float *Kb = K + (b * KV + j) * T * hd, *Vb = Vc + (b * KV + j) * T * hd;
                const uint8_t *vb = valid + b * valid_stride;
                float mx = -INFINITY;
                for (int64_t t = 0; t < end; t++) {
                    float s = -INFINITY;
                    if (vb[t]) {
                        float o;
                        dot_rows(Kb + t * hd, hd, 1, q, &o);
                        s = o * scale;
                    }
                    sc[t] = s;
                    mx = s > mx ? s : mx;
                }
                float sum = 0.0f;
                for (int64_t t = 0; t < end; t++) {
                    sc[t] = expf(sc[t] - mx);
                    sum += sc[t];
                }
                float *o = attn + b * qd + hh * hd;
                for (int64_t d = 0; d < hd; d++) o[d] = 0.0f;
                for (int64_t t = 0; t < end; t++) {
                    const float p = sc[t] / sum, *vr = Vb + t * hd;
                    if (p == 0.0f) continue;
                    for (int64_t d = 0; d < hd; d++) o[d] += p * vr[d];
                }
            }
#pragma omp barrier
            share(D, tid, nt, &a, &e);
            if (rc == 0) gemv_rows(m->wo[l], qd, a, e, attn, qd, B, h, D, 1);
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
                    const float *dn = byp_down && !run ? byp_down[l] : NULL, *up = byp_up && !run ? byp_up[l] : NULL;
                    if (dn && up) {
                        const int64_t r = byp_rank[l];
                        for (int64_t b = 0; b < B; b++) {
                            float *lo = low + b * r, *hb = h + b * D;
                            for (int64_t j = 0; j < r; j++) lo[j] = 0.0f;
                            for (int64_t d = 0; d < D; d++) {
                                const float hv = hb[d], *drow = dn + d * r;
                                for (int64_t j = 0; j < r; j++) lo[j] += hv * drow[j];
                            }
                            for (int64_t d = 0; d < D; d++) xn[d] = 0.0f;
                            for (int64_t j = 0; j < r; j++) {
                                const float lv = lo[j], *urow = up + j * D;
                                for (int64_t d = 0; d < D; d++) xn[d] += lv * urow[d];
                            }
                            for (int64_t d = 0; d < D; d++) hb[d] += xn[d];
                        }
                    }
                    if (stream) memcpy(stream + (l + 1) * B * D, h, sizeof(float) * (size_t)(B * D));
                }
#pragma omp barrier
                continue;
            }
            if (rc == 0) {
                share(F, tid, nt, &a, &e);
                gemv_rows(m->w_gate_up[l], D, a, e, xn, D, B, gu, 2 * F, 0);
                gemv_rows(m->w_gate_up[l], D, F + a, F + e, xn, D, B, gu, 2 * F, 0);
                for (int64_t b = 0; b < B; b++)
                    for (int64_t n = a; n < e; n++) {
                        const float g = gu[b * 2 * F + n];
                        act[b * F + n] = g / (1.0f + expf(-g)) * gu[b * 2 * F + F + n];
                    }
            }
#pragma omp barrier
            share(D, tid, nt, &a, &e);
            if (rc == 0) {
                gemv_rows(m->w_down[l], F, a, e, act, F, B, h, D, 1);
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
            gemv_rows(m->lm_head, D, a, e, xn, D, B, logits, V, 0);
        }
        if (rs) { /* the same for every thread: the barrier is met by all */
#pragma omp barrier
            if (tid == 0 && rc == 0) { /* every row's logits are in */
                const double te = now_s();
                entropy_rows(logits, B, V, rs->step_entropy);
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
        gemv_rows(W, K, a, e, x, K, B, y, N, 0);
    }
    return 0;
}
