/* rawcall.c: test helper — sends arbitrary bytes as the request message of one gRPC call and
 * prints the status, so tests can send what no well-behaved client would (garbage, oversized
 * messages, a wrong or missing token).
 *
 * Usage: rawcall HOST:PORT METHOD_PATH [--token T] [--file F | --size N | --empty]
 *   --file F   payload read from F ("-" = stdin)
 *   --size N   N bytes of 0xff (invalid protobuf; large N tests the size limit)
 *   --empty    no message at all (zero-length payload)
 * Prints "status=CODE details=TEXT response_bytes=N" and exits 0 when the call completed. */
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char *read_all(const char *path, size_t *len) {
    FILE *f = strcmp(path, "-") == 0 ? stdin : fopen(path, "rb");
    if (!f)
        return NULL;
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    size_t k;
    while (buf && (k = fread(buf + n, 1, cap - n, f)) > 0) {
        n += k;
        if (n == cap) {
            char *b = realloc(buf, cap *= 2);
            if (!b) {
                free(buf);
                buf = NULL;
            }
            buf = b;
        }
    }
    if (f != stdin)
        fclose(f);
    *len = n;
    return buf;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: rawcall HOST:PORT METHOD [--token T] [--file F|--size N|--empty]\n");
        return 2;
    }
    const char *addr = argv[1], *method = argv[2], *token = NULL;
    char *payload = NULL;
    size_t len = 0;
    for (int i = 3; i < argc; i++) {
        if (strcmp(argv[i], "--token") == 0 && i + 1 < argc) {
            token = argv[++i];
        } else if (strcmp(argv[i], "--file") == 0 && i + 1 < argc) {
            payload = read_all(argv[++i], &len);
            if (!payload) {
                fprintf(stderr, "rawcall: cannot read '%s'\n", argv[i]);
                return 2;
            }
        } else if (strcmp(argv[i], "--size") == 0 && i + 1 < argc) {
            len = strtoul(argv[++i], NULL, 10);
            payload = malloc(len ? len : 1);
            if (!payload)
                return 2;
            memset(payload, 0xff, len);
        } else if (strcmp(argv[i], "--empty") == 0) {
            payload = malloc(1);
            len = 0;
        } else {
            fprintf(stderr, "rawcall: bad argument '%s'\n", argv[i]);
            return 2;
        }
    }
    if (!payload) {
        payload = malloc(1);
        len = 0;
    }
    grpc_init();
    grpc_channel_credentials *creds = grpc_insecure_credentials_create();
    grpc_channel *ch = grpc_channel_create(addr, creds, NULL);
    grpc_channel_credentials_release(creds);
    grpc_completion_queue *cq = grpc_completion_queue_create_for_next(NULL);
    gpr_timespec dl = gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                                   gpr_time_from_millis(10000, GPR_TIMESPAN));
    grpc_call *call = grpc_channel_create_call(ch, NULL, GRPC_PROPAGATE_DEFAULTS, cq,
                                               grpc_slice_from_static_string(method), NULL, dl,
                                               NULL);
    grpc_metadata md;
    char auth[512];
    memset(&md, 0, sizeof(md));
    if (token) {
        snprintf(auth, sizeof(auth), "Bearer %s", token);
        md.key = grpc_slice_from_static_string("authorization");
        md.value = grpc_slice_from_copied_string(auth);
    }
    grpc_slice s = grpc_slice_from_copied_buffer(payload, len);
    grpc_byte_buffer *send = grpc_raw_byte_buffer_create(&s, 1);
    grpc_slice_unref(s);
    grpc_byte_buffer *recv = NULL;
    grpc_metadata_array im, tm;
    grpc_metadata_array_init(&im);
    grpc_metadata_array_init(&tm);
    grpc_status_code status = GRPC_STATUS_UNKNOWN;
    grpc_slice details = grpc_empty_slice();
    grpc_op ops[6];
    memset(ops, 0, sizeof(ops));
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[0].data.send_initial_metadata.count = token ? 1 : 0;
    ops[0].data.send_initial_metadata.metadata = token ? &md : NULL;
    ops[1].op = GRPC_OP_SEND_MESSAGE;
    ops[1].data.send_message.send_message = send;
    ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[3].data.recv_initial_metadata.recv_initial_metadata = &im;
    ops[4].op = GRPC_OP_RECV_MESSAGE;
    ops[4].data.recv_message.recv_message = &recv;
    ops[5].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    ops[5].data.recv_status_on_client.trailing_metadata = &tm;
    ops[5].data.recv_status_on_client.status = &status;
    ops[5].data.recv_status_on_client.status_details = &details;
    int rc = 1;
    if (grpc_call_start_batch(call, ops, 6, call, NULL) == GRPC_CALL_OK) {
        grpc_event ev = grpc_completion_queue_next(cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
        if (ev.type == GRPC_OP_COMPLETE) {
            char *d = grpc_slice_to_c_string(details);
            size_t rlen = recv ? grpc_byte_buffer_length(recv) : 0;
            printf("status=%d details=%s response_bytes=%zu\n", (int)status, d, rlen);
            gpr_free(d);
            rc = 0;
        }
    }
    if (recv)
        grpc_byte_buffer_destroy(recv);
    grpc_byte_buffer_destroy(send);
    grpc_metadata_array_destroy(&im);
    grpc_metadata_array_destroy(&tm);
    grpc_slice_unref(details);
    if (token)
        grpc_slice_unref(md.value);
    grpc_call_unref(call);
    grpc_channel_destroy(ch);
    grpc_completion_queue_shutdown(cq);
    while (grpc_completion_queue_next(cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL).type !=
           GRPC_QUEUE_SHUTDOWN)
        ;
    grpc_completion_queue_destroy(cq);
    grpc_shutdown();
    free(payload);
    return rc;
}
