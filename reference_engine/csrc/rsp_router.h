/* The unit router's per-token bookkeeping inside the decode step (router.UnitRouter, native=True).
 *
 * Not a standalone header: rsp_decode.c includes it once, after its helpers (dot_rows, gate_bypass
 * and the SIMD intrinsics it uses), so the kernel stays one translation unit and one C call per
 * token. It is a file of its own because it is one concept: thresholds before the blocks, norms at
 * block boundaries, the next-token entropy and the EMA / flip / byte updates after the LM head.
 */
/* ---- the unit router inside the step (router.UnitRouter's bookkeeping; ABI 4) ----
 * All arrays are owned by the Python UnitRouter (numpy, read and written by pointer). Per-row state is
 * double, as in numpy; thresholds end as float log_tau for the gate. Everything here runs on thread 0
 * except the entropy partials, which are split in RSP_ENT_CHUNKS fixed chunks (not per thread) and
 * combined in chunk order, so any thread count gives the same bits. */
typedef struct {
    int64_t B, L;
    double entropy_ref, ent_alpha, tau_min, tau_max, f_lo, f_hi, block_bytes;
    double target_bytes, ctl_gain, ctl_max; /* the share controller (ABI 6); target_bytes 0: off */
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
    double *ctl;                 /* [B] log factor on the threshold from the share controller, updated */
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
        const double bf = r->base[b] * f_ent * (r->target_bytes > 0.0 ? exp(r->ctl[b]) : 1.0);
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
static void entropy_rows(const float *logits, int64_t B, int64_t V, double *out, double *lse /* NULL: not wanted */) {
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
        if (lse) lse[b] = M + log(S);
    }
}

/* the entropy of logits [B, V] as the router computes it (unit tests against numpy), and, where
 * lse is not NULL, each row's log-sum-exp from the same pass (the degradation check's losses) */
int rsp_entropy(const float *logits, int64_t B, int64_t V, double *out, double *lse) {
    if (B < 1 || V < 1) return -1;
    entropy_rows(logits, B, V, out, lse);
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
        if (r->target_bytes > 0.0 && !r->row_done[b] && r->active[b]) {  /* router.UnitRouter.steer */
            double c = r->ctl[b] + r->ctl_gain * (r->target_bytes - (double)saved) / r->target_bytes;
            r->ctl[b] = c < -r->ctl_max ? -r->ctl_max : (c > r->ctl_max ? r->ctl_max : c);
        }
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
