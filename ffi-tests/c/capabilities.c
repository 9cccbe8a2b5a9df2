/* extra.image_routing_version in kvc_engine_model_info: present (1) with
 * every gate on; absent when any single gate is turned off alone; absent for
 * a text-only engine. Each case builds its own engine from a config. */
#include "check.h"

enum gate {
    ALL_ON,
    TEXT_ONLY,
    UNVALIDATED_FAMILY,
    NO_FAMILY,
    OTHER_PLACEHOLDER,
    NO_REUSE,
    NO_EVENTS,
    NO_PUBLISHER,
    EMPTY_PUBLISHER,
    DISAGG_PRODUCER,
    DISAGG_CONSUMER,
    DISAGG_BOTH,
    GATE_COUNT
};

static const char *const NAMES[GATE_COUNT] = {
    "all gates on",     "text-only model",       "unvalidated family", "no model type",
    "other placeholder", "block reuse off",      "KV events off",      "no publisher endpoint",
    "empty endpoint",   "disaggregated producer", "disaggregated consumer", "disaggregated both",
};

/* Returns 1 when the field is present with value 1, 0 when absent, -1 on error. */
static int routing_version(enum gate g) {
    kvc_config c;
    EXPECT_OK(kvc_config_default(&c));
    c.block_size_tokens = 16;
    c.blocks_device = 8;
    c.model_image_capable = true;
    c.model_type = "qwen3_vl";
    c.image_placeholder_token_id = 151655;
    c.block_reuse = true;
    c.kv_events = true;
    c.kv_events_endpoint = "tcp://127.0.0.1:5557";
    c.kv_transfer_role = KVC_KV_TRANSFER_ROLE_NONE;
    switch (g) {
    case ALL_ON: break;
    case TEXT_ONLY: c.model_image_capable = false; break;
    case UNVALIDATED_FAMILY: c.model_type = "llava"; break;
    case NO_FAMILY: c.model_type = NULL; break;
    case OTHER_PLACEHOLDER: c.image_placeholder_token_id = 32000; break;
    case NO_REUSE: c.block_reuse = false; break;
    case NO_EVENTS: c.kv_events = false; break;
    case NO_PUBLISHER: c.kv_events_endpoint = NULL; break;
    case EMPTY_PUBLISHER: c.kv_events_endpoint = ""; break;
    case DISAGG_PRODUCER: c.kv_transfer_role = KVC_KV_TRANSFER_ROLE_PRODUCER; break;
    case DISAGG_CONSUMER: c.kv_transfer_role = KVC_KV_TRANSFER_ROLE_CONSUMER; break;
    case DISAGG_BOTH: c.kv_transfer_role = KVC_KV_TRANSFER_ROLE_BOTH; break;
    case GATE_COUNT: return -1;
    }
    kvc_engine *e = NULL;
    EXPECT_OK(kvc_engine_new(&c, &e));
    if (e == NULL) {
        return -1;
    }
    /* Two-call pattern: size, then the document. */
    size_t len = 0, n = 0;
    EXPECT_OK(kvc_engine_model_info(e, NULL, 0, &len));
    char *json = malloc(len + 1);
    int result = -1;
    if (json != NULL && kvc_engine_model_info(e, json, len + 1, &n) == KVC_STATUS_OK && n == len) {
        CHECK(strstr(json, "\"extra\":{") != NULL);
        CHECK(strstr(json, "\"block_key_algorithm\":\"kvcore-sha256-v1\"") != NULL);
        if (strstr(json, "\"image_routing_version\":1") != NULL) {
            result = 1;
        } else if (strstr(json, "image_routing_version") == NULL) {
            result = 0;
        }
    }
    free(json);
    kvc_engine_free(e);
    return result;
}

int main(void) {
    for (int g = 0; g < GATE_COUNT; g++) {
        int want = g == ALL_ON ? 1 : 0;
        int got = routing_version((enum gate)g);
        if (got != want) {
            fprintf(stderr, "%s: image_routing_version %s, expected %s\n", NAMES[g],
                    got == 1 ? "present" : got == 0 ? "absent" : "unreadable", want ? "present" : "absent");
            check_failures++;
        }
    }
    return check_report("capabilities");
}
