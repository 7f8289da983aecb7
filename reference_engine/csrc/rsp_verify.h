/* Lossless mode's verify pass in C: rsp_verify_step (decode_native.verify_native).
 *
 * Not a standalone header: rsp_decode.c includes it at its end, after the helpers it reuses (rms,
 * rope, dot_rows, share, the SIMD intrinsics), so the kernel stays one translation unit. A file of
 * its own because it is one concept: S positions of one sequence through every block, each weight
 * matrix streamed once for all S, every row computed exactly as the single-token step computes it.
 */
/* Lossless mode's verify pass (speculative.py), batch 1: the current token and k drafts, tok[0..S),
 * at cache positions (and RoPE positions) start..start+S-1, through every block, no bypass. K/V
 * of all S positions are written into the cache; logits [S, V] come out.
 *
 * Why a separate function: each weight matrix is streamed ONCE for all S positions (gemv_multi:
 * 4 weight rows against up to 4 positions per pass over k), so a short pass costs little more than
 * one decode step while decode is DRAM-bound.
 *
 * Exactness: every number here is computed by the same code, in the same order, as S calls of
 * rsp_decode_step would compute it at batch 1 (a row's dot product in gemv_rows / gemv_multi does
 * not depend on how many rows are computed or which thread computes them; attention for position i sums over keys
 * 0..start+i in the same order with the same expf; rms, rope and SiLU are the same expressions),
 * so logits and the K/V written are bit-identical to S native decode steps, at any thread count.
 * tests/test_verify_native.py checks that. valid: [>= start+S] key flags (padding = 0).
 * Returns 0, or -1 bad dims, -2 out of memory, -3 a token or position out of range. */
int rsp_verify_step(const rsp_model *m, float *const *kc, float *const *vc, int64_t T, int64_t start, int64_t S,
                    const int64_t *tok, const uint8_t *valid, float *logits, int nthreads) {
    const int64_t L = m->n_layers, D = m->D, F = m->F, H = m->H, KV = m->KV, hd = m->hd, V = m->V;
    const int64_t qd = H * hd, kvd = KV * hd, QW = qd + 2 * kvd, G = H / KV, end = start + S;
    const float eps = m->eps, scale = (float)(1.0 / sqrt((double)hd));
    if (hd > 512 || G * KV != H || start < 0 || S < 1 || end > T) return -1;
    if (end > m->max_positions) return -3;
    for (int64_t i = 0; i < S; i++)
        if (tok[i] < 0 || tok[i] >= V) return -3;
    float *h = malloc(sizeof(float) * (size_t)(S * D));
    float *qkv = malloc(sizeof(float) * (size_t)(S * QW));
    float *attn = malloc(sizeof(float) * (size_t)(S * qd));
    float *gu = malloc(sizeof(float) * (size_t)(S * 2 * F));
    float *act = malloc(sizeof(float) * (size_t)(S * F));
    int rc = 0;
    if (!h || !qkv || !attn || !gu || !act) {
        rc = -2;
        goto done;
    }
    for (int64_t i = 0; i < S; i++) memcpy(h + i * D, m->embed + tok[i] * D, sizeof(float) * (size_t)D);
    if (nthreads < 1) nthreads = 1;

#pragma omp parallel num_threads(nthreads)
    {
#ifdef _OPENMP
        const int tid = omp_get_thread_num(), nt = omp_get_num_threads();
#else
        const int tid = 0, nt = 1;
#endif
        float *xn = malloc(sizeof(float) * (size_t)(S * (D > F ? D : F)));
        float *sc = malloc(sizeof(float) * (size_t)end);
        if (!xn || !sc) {
#pragma omp atomic write
            rc = -2;
        }
        int64_t a, e;
        for (int64_t l = 0; l < L; l++) {
            float *K = kc[l], *Vc = vc[l];
            if (rc == 0) {
                rms(h, m->attn_norm[l], S, D, eps, xn);
                share(QW, tid, nt, &a, &e);
                gemv_multi(m->wqkv[l], D, a, e, xn, D, S, qkv, QW, 0);
            }
#pragma omp barrier
            /* RoPE on q (in place) and k (into the cache), v into the cache: position start + i */
            for (int64_t t = tid; t < S * (H + KV) && rc == 0; t += nt) {
                int64_t i = t / (H + KV), j = t % (H + KV) - H;
                const float *c = m->cos + (start + i) * hd, *s = m->sin + (start + i) * hd;
                float *row = qkv + i * QW;
                if (j < 0) {
                    rope(row + (j + H) * hd, c, s, hd, row + (j + H) * hd);
                } else {
                    int64_t off = (j * T + start + i) * hd;
                    rope(row + qd + j * hd, c, s, hd, K + off);
                    memcpy(Vc + off, row + qd + kvd + j * hd, sizeof(float) * (size_t)hd);
                }
            }
#pragma omp barrier
            /* attention, one (position, query head) per task: position i sees keys 0..start+i,
             * through rsp_decode_step's own attend_head (the same order, so the same rounding) */
            for (int64_t t = tid; t < S * H && rc == 0; t += nt) {
                int64_t i = t / H, hh = t % H, j = hh / G;
                attend_head(qkv + i * QW + hh * hd, K + j * T * hd, Vc + j * T * hd, valid, start + i + 1, hd, scale,
                            sc, attn + i * qd + hh * hd);
            }
#pragma omp barrier
            share(D, tid, nt, &a, &e);
            if (rc == 0) gemv_multi(m->wo[l], qd, a, e, attn, qd, S, h, D, 1);
#pragma omp barrier
            if (rc == 0) {
                rms(h, m->mlp_norm[l], S, D, eps, xn);
                share(F, tid, nt, &a, &e);
                gemv_multi(m->w_gate_up[l], D, a, e, xn, D, S, gu, 2 * F, 0);
                gemv_multi(m->w_gate_up[l], D, F + a, F + e, xn, D, S, gu, 2 * F, 0);
                for (int64_t i = 0; i < S; i++)
                    for (int64_t n = a; n < e; n++) {
                        const float g = gu[i * 2 * F + n];
                        act[i * F + n] = g / (1.0f + expf(-g)) * gu[i * 2 * F + F + n];
                    }
            }
#pragma omp barrier
            share(D, tid, nt, &a, &e);
            if (rc == 0) gemv_multi(m->w_down[l], F, a, e, act, F, S, h, D, 1);
#pragma omp barrier
        }
        if (rc == 0) {
            rms(h, m->final_norm, S, D, eps, xn);
            share(V, tid, nt, &a, &e);
            gemv_multi(m->lm_head, D, a, e, xn, D, S, logits, V, 0);
        }
        free(xn);
        free(sc);
    }
done:
    free(h);
    free(qkv);
    free(attn);
    free(gu);
    free(act);
    return rc;
}
