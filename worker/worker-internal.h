/* worker-internal.h: what engine.c, stage.c and schedule.c share. Not for other parts.
 *
 * An engine holds one or two "views" of its state (struct engine_view): the layout in force
 * and, during a reshape, the previous one. Work buffers for a step (activations, gradient
 * accumulators) are derived from the current view and rebuilt after a reshape. */
#ifndef ST_WORKER_INTERNAL_H
#define ST_WORKER_INTERNAL_H

#include "common.h"
#include "migrate.h"
#include "worker.h"

#define WORKER_ENGINE_MAGIC 0x57454e47u /* "WENG" */
#define WORKER_NORM_SLOTS 72 /* exact grad-norm accumulator: 70 32-bit limbs + NaN, inf counts */

/* One owned layer: whole parameters and this replica's moment shard. */
struct engine_layer {
    int layer;
    size_t n;        /* elements */
    float *param;    /* n */
    size_t lo, hi;   /* shard */
    float *m, *v;    /* hi - lo each */
};

struct engine_view {
    struct worker_layout layout;
    int stage, replica;       /* stage -1: holds nothing (spare) */
    int lo, hi;               /* owned layers [lo, hi) */
    struct engine_layer *layers; /* hi - lo entries */
    float *tied0;             /* last stage without layer 0: layer 0 PARAM (tied head) */
    struct mig_comm *comm;
    int valid;
};

/* One in-flight micro-batch of the 1F1B schedule. */
struct engine_slot {
    int *tokens;     /* B*T inputs */
    int *targets;    /* B*T */
    float *in;       /* (B,T,C) received from the previous stage (not on the first stage) */
    float **acts;    /* per owned layer */
    float **out;     /* per owned layer: (B,T,C) output */
};

struct engine_work {
    int micro;                /* micro-batches per replica for this layout */
    int nslots;
    struct engine_slot *slots;
    float **grad;             /* per owned layer, float gradient of one micro-batch */
    double **acc;             /* per owned layer, double accumulator over micro-batches */
    float *grad_head;         /* last stage: head's wte gradient of one micro-batch */
    double *acc_head;         /* last stage: accumulated */
    double *recv_head;        /* first stage with pp > 1: the last stage's acc_head */
    float *dbuf[2];           /* (B,T,C) gradient buffers */
    float *scratch;
    float *logits;            /* last stage: B*T*V */
    float *losses;            /* last stage: B*T */
    float *gshard;            /* largest shard, rounded gradient */
    size_t gshard_n;          /* its elements */
    size_t made;              /* bytes allocated for it (not given by a donor) */
    double *norm_parts;       /* WORKER_NORM_SLOTS: exact grad-norm limbs */
    uint16_t *sample;         /* T + 1 */
    double loss_sum;          /* this replica's loss sum for the step */
};

/* A range of moments a reshape keeps, to copy from the old shard to the new one. */
struct engine_mcopy {
    float *m, *v;             /* the new view's */
    const float *om, *ov;     /* the old view's */
    size_t n;
};

struct worker_engine {
    uint32_t magic;
    struct worker_train_config cfg;
    const struct st_tokens *data;
    int t;                    /* AdamW steps taken */
    struct engine_view cur;
    struct engine_view old;   /* valid only between reshape_begin and commit/abort */
    struct engine_work *work; /* NULL until the first step after (re)configuration */
    struct engine_prep *prep; /* a reshape's memory, made ready while steps run; or NULL */
    /* The old view's work buffers after a reshape_begin: its layers' gradient buffers and
     * the head's go to the new work buffers of the same layers (sizes depend on the layer
     * alone), the rest is freed when those are made; an abort takes them back. */
    struct engine_work *spare;
    int spare_lo, spare_n;
    /* The new view's work buffers made by the preparation (worker__work_prep), taken by the
     * next work_make after the spare's; NULL when none. */
    struct engine_work *pwork;
    int pwork_lo, pwork_n;
    /* A committed reshape's old view (its own buffers only), released with the spare's rest
     * on a thread of their own once the new work buffers are made (engine.c, reap). */
    struct engine_view dead;
    struct engine_reap *reap;
    bool hold_dead;           /* worker_engine_hold_old: dead and the spare stay */
    bool moments_later;       /* worker_engine_reshape_moments_later, for the next begin */
    struct engine_mcopy *mcopy; /* kept moments the begin left to copy (moments_later) */
    int nmcopy;
    size_t work_fresh;        /* bytes the last work_make allocated itself */
    worker_engine_gate_fn *gate; /* called once before the next step's first comm or update */
    worker_engine_layer_gate_fn *layer_gate; /* before a forward reads a layer, until gate */
    void *gate_userdata;
    bool gate_messages; /* pipeline messages call gate (worker_engine_gate_messages) */
};

/* engine.c: calls and clears e->gate and e->layer_gate, if any (worker_engine_set_gate). */
int worker__gate(struct worker_engine *e);
/* engine.c: calls e->layer_gate for layer, if any. */
int worker__layer_gate(struct worker_engine *e, int layer);

/* stage.c */
/* Allocates the zeroed buffers of position (stage, replica) of layout into *v (stage -1:
 * nothing). comm is borrowed. With share (a reshape: the view being replaced), every buffer
 * whose contents the new position keeps as they are is share's own buffer, not a copy: the
 * parameters of a layer both own (or layer 0's for a tied copy) and a moment shard of the
 * same range. Until one of the two views is dropped with worker__view_unshare first, they
 * hold those buffers together. Returns 0, -ENOMEM. Release with worker__view_done. */
int worker__view_init(struct engine_view *v, const struct worker_train_config *cfg,
                      const struct worker_layout *layout, int stage, int replica,
                      struct mig_comm *comm, const struct engine_view *share);
/* Writes every page of v's own buffers (not those share holds too), so that the first
 * use does not fault them in: what a reshape prepared ahead of its boundary touches. */
void worker__view_touch(const struct engine_view *v, const struct engine_view *share,
                        const struct kern_config *model);
/* Forgets (without freeing) every buffer of v that keep holds too, so that
 * worker__view_done(v) frees only v's own. */
void worker__view_unshare(struct engine_view *v, const struct engine_view *keep);
/* Frees a view's buffers and zeroes it; safe on a zeroed view. */
void worker__view_done(struct engine_view *v);
/* The owned layer `layer` of v, or NULL when v does not own it. */
struct engine_layer *worker__view_layer(struct engine_view *v, int layer);
/* Work buffers another work can give to a new one: w's owned layers start at lo, n of them
 * (a NULL entry gives nothing for that layer). */
struct work_donor {
    struct engine_work *w;
    int lo, n;
};

/* Sizes the work buffers of a step for view v of e, every page written when touch (the
 * faults then happen now, not in the first step). The gradient buffers of a layer that a
 * donor holds, and its head's (and a first stage's received head), are moved over from the
 * first donor that has them, not allocated: their sizes depend on the layer alone, and a
 * donor's gradient buffers are zero between steps. Caller frees with worker__work_free(w,
 * owned layer count), and the donors' rest. Returns 0 or -ENOMEM. */
int worker__work_new(const struct worker_engine *e, const struct engine_view *v, bool touch,
                     const struct work_donor *donors, int ndonors, struct engine_work **ret);
/* The work buffers of view v, every page written, but for the large ones that the work of
 * view have will give at the boundary (the gradient buffers of the layers have owns, its
 * head's, its received head, a shard buffer as large): what a reshape prepared ahead of its
 * boundary makes while steps run. Only e->cfg is read from e. Caller completes it with
 * worker__work_complete (have's work the donor) or frees it with worker__work_free(w, v's
 * owned layer count). Returns 0 or -ENOMEM. */
int worker__work_prep(const struct worker_engine *e, const struct engine_view *v,
                      const struct engine_view *have, struct engine_work **ret);
/* Makes what w (v's, from worker__work_prep) still lacks, as worker__work_new does. On
 * -ENOMEM w holds what it had and what was made. */
int worker__work_complete(const struct worker_engine *e, const struct engine_view *v,
                          bool touch, struct engine_work *w, const struct work_donor *donors,
                          int ndonors);
/* Adds the squares of x[0..n) exactly into limb[WORKER_NORM_SLOTS] (fixed point, 32-bit
 * limbs; the last two slots count NaN and infinite squares). Limbs of several accumulators
 * may be summed element-wise (in double too, exactly, for up to 2^21 of them). */
void worker__sumsq_exact_add(uint64_t *limb, const double *x, size_t n);
/* The exact sum held in limb as a double (NaN, inf if any such square); normalizes limb.
 * Deterministic: equal exact sums give equal doubles, however they were split. */
double worker__sumsq_exact_value(uint64_t *limb);
/* NULL-safe; returns NULL. */
struct engine_work *worker__work_free(struct engine_work *w, int nowned);
/* Comm rank of position (stage, replica) of the view's layout. */
int worker__rank(const struct engine_view *v, int stage, int replica);

/* schedule.c */
/* Forward and backward of every micro-batch of this replica for `step` under 1F1B, leaving
 * the summed gradients in e->work->acc / acc_head and the loss sum in e->work->loss_sum.
 * Returns 0 or the first data-plane / kernel error. */
int worker__run_pipeline(struct worker_engine *e, uint64_t step);

#endif
