/* loadgen.c: control-plane load generator for scripts/bench.d/control — N simulated workers
 * Join one coordinator, then each sends a Report at RATE Hz, staggered evenly; prints p50/p99
 * Report latency and the coordinator's CPU use (from /proc/PID/stat) over the measured window.
 *
 * One idea: gRPC's async API on one completion queue drives every simulated worker from one
 * thread, so the generator's own cost stays small beside the coordinator's. Workers are spread
 * over up to 100 channels, each its own TCP connection (local subchannel pool).
 *
 * Usage: spottrain-control-loadgen ADDR N [--rate HZ] [--seconds S] [--warmup S]
 *                                  [--token T] [--pid COORD_PID] */
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/support/time.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common.h"
#include "control.pb-c.h"

#define MAX_CHANNELS 100

struct sim_call {
    int worker;
    double start;
    bool join;
    grpc_call *call;
    grpc_byte_buffer *send, *recv;
    grpc_metadata_array im, tm;
    grpc_status_code status;
    grpc_slice details;
};

struct gen {
    int n;
    char (*ids)[ST_UUID_STR_LEN];
    double *next_due;
    bool *busy;
    grpc_channel *ch[MAX_CHANNELS];
    int nch;
    grpc_completion_queue *cq;
    grpc_metadata md;
    bool have_md;
    double *lat;
    size_t nlat, caplat;
    long errors, joined, inflight;
    bool measuring;
};

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static int start_call(struct gen *g, int w, bool join) {
    struct sim_call *sc = st_calloc(1, sizeof(*sc));
    if (!sc)
        return -ENOMEM;
    uint8_t buf[256];
    size_t len;
    if (join) {
        Spottrain__V1__JoinRequest req = SPOTTRAIN__V1__JOIN_REQUEST__INIT;
        req.worker_id = g->ids[w];
        req.zone = (char *)"bench";
        req.gpus = 1;
        req.protocol = ST_PROTOCOL;
        len = spottrain__v1__join_request__pack(&req, buf);
    } else {
        Spottrain__V1__ReportRequest req = SPOTTRAIN__V1__REPORT_REQUEST__INIT;
        req.worker_id = g->ids[w];
        req.step = 1;
        req.loss = 1.0;
        req.state = (char *)"idle";
        len = spottrain__v1__report_request__pack(&req, buf);
    }
    sc->worker = w;
    sc->join = join;
    sc->start = st_now();
    sc->details = grpc_empty_slice();
    grpc_metadata_array_init(&sc->im);
    grpc_metadata_array_init(&sc->tm);
    grpc_slice s = grpc_slice_from_copied_buffer((const char *)buf, len);
    sc->send = grpc_raw_byte_buffer_create(&s, 1);
    grpc_slice_unref(s);
    sc->call = grpc_channel_create_call(
        g->ch[w % g->nch], NULL, GRPC_PROPAGATE_DEFAULTS, g->cq,
        grpc_slice_from_static_string(join ? "/spottrain.v1.Coordinator/Join"
                                           : "/spottrain.v1.Coordinator/Report"),
        NULL,
        gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC), gpr_time_from_millis(10000, GPR_TIMESPAN)),
        NULL);
    grpc_op ops[6];
    memset(ops, 0, sizeof(ops));
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[0].data.send_initial_metadata.count = g->have_md ? 1 : 0;
    ops[0].data.send_initial_metadata.metadata = g->have_md ? &g->md : NULL;
    ops[1].op = GRPC_OP_SEND_MESSAGE;
    ops[1].data.send_message.send_message = sc->send;
    ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[3].data.recv_initial_metadata.recv_initial_metadata = &sc->im;
    ops[4].op = GRPC_OP_RECV_MESSAGE;
    ops[4].data.recv_message.recv_message = &sc->recv;
    ops[5].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    ops[5].data.recv_status_on_client.trailing_metadata = &sc->tm;
    ops[5].data.recv_status_on_client.status = &sc->status;
    ops[5].data.recv_status_on_client.status_details = &sc->details;
    if (grpc_call_start_batch(sc->call, ops, 6, sc, NULL) != GRPC_CALL_OK) {
        fprintf(stderr, "loadgen: start_batch failed\n");
        return -EIO;
    }
    g->busy[w] = true;
    g->inflight++;
    return 0;
}

static void finish_call(struct gen *g, struct sim_call *sc, bool ok) {
    double lat = st_now() - sc->start;
    g->busy[sc->worker] = false;
    g->inflight--;
    if (!ok || sc->status != GRPC_STATUS_OK) {
        g->errors++;
    } else if (sc->join) {
        g->joined++;
    } else if (g->measuring) {
        if (g->nlat == g->caplat) {
            size_t cap = g->caplat ? g->caplat * 2 : 4096;
            double *v = st_realloc(g->lat, cap * sizeof(*v));
            if (v) {
                g->lat = v;
                g->caplat = cap;
            }
        }
        if (g->nlat < g->caplat)
            g->lat[g->nlat++] = lat;
    }
    if (sc->recv)
        grpc_byte_buffer_destroy(sc->recv);
    grpc_byte_buffer_destroy(sc->send);
    grpc_metadata_array_destroy(&sc->im);
    grpc_metadata_array_destroy(&sc->tm);
    grpc_slice_unref(sc->details);
    grpc_call_unref(sc->call);
    st_free(sc);
}

static void pump(struct gen *g, double until) {
    for (;;) {
        double left = until - st_now();
        if (left < 0)
            left = 0;
        grpc_event ev = grpc_completion_queue_next(
            g->cq, gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                                gpr_time_from_micros((int64_t)(left * 1e6), GPR_TIMESPAN)),
            NULL);
        if (ev.type != GRPC_OP_COMPLETE)
            return;
        finish_call(g, ev.tag, ev.success != 0);
        if (st_now() >= until)
            return;
    }
}

/* utime + stime of a process in seconds, or -1. */
static double proc_cpu(long pid) {
    char path[64], buf[2048];
    snprintf(path, sizeof(path), "/proc/%ld/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    char *p = strrchr(buf, ')');
    if (!p)
        return -1;
    unsigned long ut = 0, st = 0;
    /* fields after "pid (comm)": state(3) ... utime(14) stime(15) */
    if (sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st) != 2)
        return -1;
    return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s ADDR N [--rate HZ] [--seconds S] [--warmup S] [--token T] "
                        "[--pid PID]\n", argv[0]);
        return 2;
    }
    const char *addr = argv[1], *token = NULL;
    int n = atoi(argv[2]);
    double rate = 1, seconds = 10, warmup = 3;
    long pid = 0;
    for (int i = 3; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--rate"))
            rate = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "--seconds"))
            seconds = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "--warmup"))
            warmup = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "--token"))
            token = argv[i + 1];
        else if (!strcmp(argv[i], "--pid"))
            pid = atol(argv[i + 1]);
        else {
            fprintf(stderr, "loadgen: bad option '%s'\n", argv[i]);
            return 2;
        }
    }
    if (n < 1 || n > 100000 || rate <= 0 || seconds <= 0) {
        fprintf(stderr, "loadgen: bad N, rate or seconds\n");
        return 2;
    }
    struct gen g;
    memset(&g, 0, sizeof(g));
    g.n = n;
    g.ids = st_calloc((size_t)n, sizeof(*g.ids));
    g.next_due = st_calloc((size_t)n, sizeof(double));
    g.busy = st_calloc((size_t)n, sizeof(bool));
    if (!g.ids || !g.next_due || !g.busy)
        return 1;
    for (int i = 0; i < n; i++)
        st_uuid_new(g.ids[i]);
    char auth[300];
    if (token) {
        snprintf(auth, sizeof(auth), "Bearer %s", token);
        g.md.key = grpc_slice_from_static_string("authorization");
        g.md.value = grpc_slice_from_copied_string(auth);
        g.have_md = true;
    }
    grpc_init();
    g.cq = grpc_completion_queue_create_for_next(NULL);
    g.nch = n < MAX_CHANNELS ? n : MAX_CHANNELS;
    for (int c = 0; c < g.nch; c++) {
        grpc_arg args[1];
        args[0] = (grpc_arg){GRPC_ARG_INTEGER, GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL,
                             {.integer = 1}};
        grpc_channel_args ca = {1, args};
        grpc_channel_credentials *cr = grpc_insecure_credentials_create();
        g.ch[c] = grpc_channel_create(addr, cr, &ca);
        grpc_channel_credentials_release(cr);
    }
    /* Join everyone, at most 64 at a time. */
    int next = 0;
    double t0 = st_now();
    while ((g.joined + g.errors < n) && st_now() - t0 < 120) {
        while (next < n && g.inflight < 64)
            start_call(&g, next++, true);
        pump(&g, st_now() + 0.05);
    }
    if (g.joined < n) {
        fprintf(stderr, "loadgen: only %ld of %d workers joined (%ld errors)\n", g.joined, n,
                g.errors);
        return 1;
    }
    double join_s = st_now() - t0;
    g.errors = 0;
    double period = 1.0 / rate, start = st_now();
    for (int i = 0; i < n; i++)
        g.next_due[i] = start + period * i / n;
    double measure_at = start + warmup, end = measure_at + seconds;
    double cpu0 = -1, cpu1 = -1;
    long skipped = 0;
    size_t due_idx = 0; /* workers are due in index order, round after round */
    while (st_now() < end) {
        double now = st_now();
        if (!g.measuring && now >= measure_at) {
            g.measuring = true;
            if (pid)
                cpu0 = proc_cpu(pid);
        }
        size_t base = due_idx;
        for (int k = 0; k < n; k++) {
            int i = (int)((base + (size_t)k) % (size_t)n);
            if (g.next_due[i] > now)
                break;
            if (g.busy[i])
                skipped++; /* the previous Report has not returned: do not pile up */
            else
                start_call(&g, i, false);
            g.next_due[i] += period;
            due_idx = (size_t)(i + 1) % (size_t)n;
        }
        double wake = g.next_due[due_idx % (size_t)n];
        pump(&g, wake < end ? wake : end);
    }
    if (pid)
        cpu1 = proc_cpu(pid);
    g.measuring = false;
    while (g.inflight > 0)
        pump(&g, st_now() + 1);
    qsort(g.lat, g.nlat, sizeof(double), cmp_double);
    double p50 = g.nlat ? g.lat[g.nlat / 2] : 0, p99 = g.nlat ? g.lat[(g.nlat * 99) / 100] : 0,
           mx = g.nlat ? g.lat[g.nlat - 1] : 0;
    printf("workers=%d rate_hz=%g seconds=%g reports=%zu errors=%ld skipped=%ld "
           "join_seconds=%.2f p50_ms=%.3f p99_ms=%.3f max_ms=%.3f",
           n, rate, seconds, g.nlat, g.errors, skipped, join_s, p50 * 1e3, p99 * 1e3, mx * 1e3);
    if (cpu0 >= 0 && cpu1 >= 0)
        printf(" coordinator_cpu_pct=%.1f", 100.0 * (cpu1 - cpu0) / seconds);
    printf("\n");
    for (int c = 0; c < g.nch; c++)
        grpc_channel_destroy(g.ch[c]);
    grpc_completion_queue_shutdown(g.cq);
    while (grpc_completion_queue_next(g.cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL).type !=
           GRPC_QUEUE_SHUTDOWN)
        ;
    grpc_completion_queue_destroy(g.cq);
    if (g.have_md)
        grpc_slice_unref(g.md.value);
    grpc_shutdown();
    st_free(g.lat);
    st_free(g.ids);
    st_free(g.next_due);
    st_free(g.busy);
    return g.errors ? 1 : 0;
}
