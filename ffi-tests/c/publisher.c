/* Events out of the process through the C API: the publisher binds a real
 * ZMQ socket on loopback, refuses a second start and bad endpoints with their
 * documented statuses, counts the batches of each step, and stops; the wire
 * drain hands out length-framed msgpack payloads. */
#define _POSIX_C_SOURCE 200809L
#include <time.h>

#include "check.h"

static kvc_engine *make_engine(const char *endpoint) {
    kvc_config c;
    EXPECT_OK(kvc_config_default(&c));
    c.block_size_tokens = 4;
    c.blocks_device = 32;
    c.model_image_capable = true;
    c.model_type = "qwen3_vl";
    c.kv_events_endpoint = endpoint;
    kvc_engine *e = NULL;
    EXPECT_OK(kvc_engine_new(&c, &e));
    return e;
}

static void serve_one(kvc_engine *e, uint32_t first) {
    uint32_t tokens[9];
    for (uint32_t i = 0; i < 9; i++) {
        tokens[i] = first + i;
    }
    kvc_request r = text_request(tokens, 9);
    kvc_admission a;
    size_t copies = 0;
    EXPECT_OK(kvc_engine_add_request(e, &r, &a));
    EXPECT_OK(kvc_engine_commit(e, a.request_id, 9));
    EXPECT_OK(kvc_engine_finish(e, a.request_id));
    EXPECT_OK(kvc_engine_step(e, &copies));
}

static void publisher_lifecycle(void) {
    kvc_engine *e = make_engine(NULL);
    kvc_publisher_config pc;
    EXPECT_OK(kvc_publisher_config_default(&pc));
    CHECK(pc.heartbeat_ms == 1000);
    /* Counted below batch for batch: no heartbeat in between. */
    pc.heartbeat_ms = 0;
    size_t n = 0;
    char endpoint[128];

    /* No endpoint anywhere: refused, and the capability stays off. */
    EXPECT_STATUS(kvc_engine_publisher_start(e, &pc), KVC_STATUS_INVALID_ARGUMENT);
    EXPECT_STATUS(kvc_engine_publisher_stop(e), KVC_STATUS_PUBLISHER_NOT_RUNNING);
    EXPECT_STATUS(kvc_engine_publisher_endpoint(e, endpoint, sizeof endpoint, &n), KVC_STATUS_PUBLISHER_NOT_RUNNING);
    char json[1024];
    EXPECT_OK(kvc_engine_model_info(e, json, sizeof json, &n));
    CHECK(strstr(json, "image_routing_version") == NULL);

    /* A transport ZMQ does not know. */
    pc.endpoint = "nonsense://nowhere";
    EXPECT_STATUS(kvc_engine_publisher_start(e, &pc), KVC_STATUS_PUBLISHER_START_FAILED);
    CHECK(strstr(last_error(e), "publisher") != NULL);

    /* A free port on loopback. */
    pc.endpoint = "tcp://127.0.0.1:*";
    EXPECT_OK(kvc_engine_publisher_start(e, &pc));
    EXPECT_STATUS(kvc_engine_publisher_start(e, &pc), KVC_STATUS_PUBLISHER_RUNNING);
    EXPECT_OK(kvc_engine_publisher_endpoint(e, NULL, 0, &n));
    CHECK(n > strlen("tcp://127.0.0.1:"));
    EXPECT_STATUS(kvc_engine_publisher_endpoint(e, endpoint, 4, &n), KVC_STATUS_BUFFER_TOO_SMALL);
    EXPECT_OK(kvc_engine_publisher_endpoint(e, endpoint, sizeof endpoint, &n));
    CHECK(strncmp(endpoint, "tcp://127.0.0.1:", 16) == 0 && strchr(endpoint, '*') == NULL);
    /* The bound endpoint now counts as the configured publisher. */
    EXPECT_OK(kvc_engine_model_info(e, json, sizeof json, &n));
    CHECK(strstr(json, "\"image_routing_version\":1") != NULL);

    /* Two steps with events: two batches handed to the publisher. */
    serve_one(e, 100);
    serve_one(e, 200);
    kvc_publisher_stats stats;
    EXPECT_OK(kvc_engine_publisher_stats(e, &stats));
    CHECK(stats.batches_reserved == 2);
    CHECK(stats.dropped_queue_full == 0);

    /* The batches stay drainable: here as wire payloads. */
    size_t need = 0;
    EXPECT_OK(kvc_engine_drain_events_wire(e, NULL, 0, &need));
    CHECK(need > 8);
    uint8_t small[4];
    EXPECT_STATUS(kvc_engine_drain_events_wire(e, small, sizeof small, &n), KVC_STATUS_BUFFER_TOO_SMALL);
    uint8_t *wire = malloc(need);
    CHECK(wire != NULL);
    EXPECT_OK(kvc_engine_drain_events_wire(e, wire, need, &n));
    CHECK(n == need);
    size_t at = 0, payloads = 0;
    while (wire != NULL && at + 4 <= n) {
        uint32_t len = (uint32_t)wire[at] | (uint32_t)wire[at + 1] << 8 | (uint32_t)wire[at + 2] << 16 |
                       (uint32_t)wire[at + 3] << 24;
        CHECK(len > 0 && at + 4 + len <= n);
        CHECK(wire[at + 4] == 0x93); /* msgpack fixarray of 3: [ts, events, rank] */
        at += 4 + len;
        payloads++;
    }
    CHECK(at == n && payloads == 2);
    free(wire);
    EXPECT_OK(kvc_engine_drain_events_wire(e, NULL, 0, &need));
    CHECK(need == 0);

    /* A LoRA adapter given by id without its name is refused, and nothing is admitted. */
    uint32_t tokens[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
    kvc_request lora = text_request(tokens, 9);
    lora.has_lora_id = true;
    lora.lora_id = 3;
    kvc_admission refused;
    EXPECT_STATUS(kvc_engine_add_request(e, &lora, &refused), KVC_STATUS_LORA_NAME_REQUIRED);
    CHECK(strstr(last_error(e), "lora_name") != NULL);
    CHECK(strcmp(kvc_status_str(KVC_STATUS_LORA_NAME_REQUIRED), "unknown status code") != 0);

    EXPECT_OK(kvc_engine_publisher_stop(e));
    EXPECT_STATUS(kvc_engine_publisher_stop(e), KVC_STATUS_PUBLISHER_NOT_RUNNING);

    /* An idle publisher sends heartbeats: numbered batches handed to the socket. */
    pc.heartbeat_ms = 10;
    EXPECT_OK(kvc_engine_publisher_start(e, &pc));
    for (int i = 0; i < 200; i++) {
        EXPECT_OK(kvc_engine_publisher_stats(e, &stats));
        if (stats.heartbeats >= 2) {
            break;
        }
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    CHECK(stats.heartbeats >= 2);
    CHECK(stats.batches_handed_to_socket >= stats.heartbeats);
    EXPECT_OK(kvc_engine_publisher_stop(e));
    /* The engine serves on without a publisher, and a new one can start. */
    serve_one(e, 300);
    EXPECT_OK(kvc_engine_publisher_start(e, &pc));
    kvc_engine_free(e); /* stops the publisher too */
}

/* The engine's kv_events_endpoint is used when the publisher config has none. */
static void endpoint_from_engine_config(void) {
    kvc_engine *e = make_engine("tcp://127.0.0.1:*");
    kvc_publisher_config pc;
    EXPECT_OK(kvc_publisher_config_default(&pc));
    EXPECT_OK(kvc_engine_publisher_start(e, &pc));
    char endpoint[128];
    size_t n = 0;
    EXPECT_OK(kvc_engine_publisher_endpoint(e, endpoint, sizeof endpoint, &n));
    CHECK(strncmp(endpoint, "tcp://127.0.0.1:", 16) == 0);
    EXPECT_OK(kvc_engine_publisher_stop(e));
    kvc_engine_free(e);
}

int main(void) {
    publisher_lifecycle();
    endpoint_from_engine_config();
    return check_report("publisher");
}
