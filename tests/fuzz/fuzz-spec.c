/* fuzz-spec.c: libFuzzer target for the job-spec parser (st_spec_parse).
 *
 * Any byte string must give either a spec or -EINVAL with at least one error, never a crash,
 * a leak or undefined behaviour; a spec that parses must also serialise to JSON. Built only
 * with -Dfuzz=true and clang; run with `scripts/fuzz spec SECONDS`. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static struct st_spec spec;
    struct st_error errs[8];
    size_t nerrs = 0;
    int r = st_spec_parse("fuzz.yaml", (const char *)data, size, &spec, errs, 8, &nerrs);
    if (r == 0) {
        char *json = st_spec_to_json(&spec);
        if (!json)
            abort(); /* only allocation failure may make it fail */
        st_free(json);
    } else if (r == -EINVAL) {
        if (nerrs == 0)
            abort(); /* an invalid spec must say why */
        char line[1024];
        for (size_t i = 0; i < nerrs && i < 8; i++)
            st_error_format(&errs[i], line, sizeof(line));
    } else {
        abort(); /* nothing but allocation can fail, and the fuzzer does not fail those */
    }
    return 0;
}
