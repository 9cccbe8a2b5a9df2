/* The call log through the C API: the switch's refusals (NULL arguments, an
 * engine that already took a call, a second log, a file that cannot be
 * created, a close with none open), then a serving run recorded into a file:
 * text and image requests (bytes and digests, UUIDs, a LoRA adapter), chunked
 * commits, growth, finishes, cancels, evictions and tier moves, a clear.
 *
 * With a path argument the log is written there and kept, and the program
 * prints "call log: PATH CALLS" for the test that replays it with `kvcore
 * replay-calls`; without one it goes to a temporary file, removed at the end. */
#define _POSIX_C_SOURCE 200809L
#include <unistd.h>

#include "check.h"

enum { BS = 4 };

static kvc_engine *make_engine(void) {
    kvc_config c;
    EXPECT_OK(kvc_config_default(&c));
    c.block_size_tokens = BS;
    c.blocks_device = 24;
    c.blocks_host = 8;
    c.partial_reuse = true;
    kvc_engine *e = NULL;
    EXPECT_OK(kvc_engine_new(&c, &e));
    CHECK(e != NULL);
    return e;
}

static const uint8_t PIXELS[2][16] = {"first picture..", "second picture."};

/* Admits request `i`: three prefixes of 10 to 17 tokens; every third one
 * with an image at 4..7 (content bytes or a digest, with a UUID); every
 * fourth one with a LoRA adapter. Returns the id, or 0 when refused. */
static uint64_t admit(kvc_engine *e, unsigned i) {
    uint32_t tokens[20];
    size_t n = 10 + i % 8;
    for (size_t t = 0; t < n; t++) {
        tokens[t] = (uint32_t)(100 * (i % 3) + (t < 8 ? t : t + i));
    }
    kvc_request r = text_request(tokens, n);
    kvc_image_item item;
    kvc_token_run run = {4, 4};
    kvc_bytes uuid = {(const uint8_t *)"img-a", 5};
    uint8_t digest[32];
    if (i % 3 == 0) {
        memset(&item, 0, sizeof item);
        for (size_t t = 4; t < 8; t++) {
            tokens[t] = 151655;
        }
        if (i % 2 == 0) {
            item.content_kind = KVC_IMAGE_CONTENT_BYTES;
            item.content = PIXELS[i % 4 == 0];
            item.content_len = sizeof PIXELS[0];
        } else {
            memset(digest, (int)(i % 5), sizeof digest);
            item.content_kind = KVC_IMAGE_CONTENT_DIGEST;
            item.content = digest;
            item.content_len = sizeof digest;
        }
        item.runs = &run;
        item.runs_len = 1;
        r.items = &item;
        r.items_len = 1;
        r.uuids = &uuid;
        r.uuids_len = 1;
    }
    if (i % 4 == 1) {
        r.has_lora_id = true;
        r.lora_id = 7;
        r.lora_name.ptr = (const uint8_t *)"adapter";
        r.lora_name.len = 7;
    }
    kvc_admission a;
    kvc_status s = kvc_engine_add_request(e, &r, &a);
    if (s != KVC_STATUS_OK) {
        CHECK(s == KVC_STATUS_OUT_OF_BLOCKS || s == KVC_STATUS_TOO_MANY_REQUESTS);
        return 0;
    }
    return a.request_id;
}

static void serve(kvc_engine *e) {
    uint64_t live[6] = {0};
    kvc_event events[64];
    size_t n = 0;
    for (unsigned i = 0; i < 120; i++) {
        unsigned slot = i % 6;
        if (live[slot] != 0) {
            if (i % 5 == 0) {
                EXPECT_OK(kvc_engine_cancel(e, live[slot]));
            } else {
                const uint32_t more[3] = {9, 8, 7};
                kvc_status g = kvc_engine_grow(e, live[slot], more, 3);
                CHECK(g == KVC_STATUS_OK || g == KVC_STATUS_OUT_OF_BLOCKS);
                kvc_request_info info;
                EXPECT_OK(kvc_engine_request_info(e, live[slot], &info));
                EXPECT_OK(kvc_engine_commit(e, live[slot], info.tokens));
                EXPECT_OK(kvc_engine_finish(e, live[slot]));
            }
            live[slot] = 0;
        }
        live[slot] = admit(e, i);
        if (live[slot] != 0) {
            kvc_request_info info;
            EXPECT_OK(kvc_engine_request_info(e, live[slot], &info));
            /* Chunked prefill: half the prompt now, the rest at the end. */
            EXPECT_OK(kvc_engine_commit(e, live[slot], (info.tokens_computed + info.tokens) / 2));
        }
        if (i % 17 == 16) {
            EXPECT_OK(kvc_engine_evict(e, 2, &n));
        }
        if (i == 90) {
            EXPECT_OK(kvc_engine_clear(e));
        }
        EXPECT_OK(kvc_engine_step(e, &n));
        if (i % 4 == 3) {
            do {
                EXPECT_OK(kvc_engine_drain_events(e, events, 64, &n));
            } while (n == 64);
        }
    }
    for (unsigned slot = 0; slot < 6; slot++) {
        if (live[slot] != 0) {
            EXPECT_OK(kvc_engine_finish(e, live[slot]));
        }
    }
    EXPECT_OK(kvc_engine_step(e, &n));
}

int main(int argc, char **argv) {
    char path[512];
    if (argc > 1) {
        snprintf(path, sizeof path, "%s", argv[1]);
    } else {
        const char *dir = getenv("TMPDIR");
        snprintf(path, sizeof path, "%s/kvcore-call-log-%ld.bin", dir ? dir : "/tmp", (long)getpid());
    }
    uint64_t calls = 0;

    /* Refusals. */
    kvc_engine *e = make_engine();
    EXPECT_STATUS(kvc_engine_call_log_open(NULL, path), KVC_STATUS_NULL_ARGUMENT);
    EXPECT_STATUS(kvc_engine_call_log_open(e, NULL), KVC_STATUS_NULL_ARGUMENT);
    EXPECT_STATUS(kvc_engine_call_log_close(e, &calls), KVC_STATUS_CALL_LOG_NOT_OPEN);
    EXPECT_STATUS(kvc_engine_call_log_open(e, "/nonexistent-dir/kvcore/log.bin"), KVC_STATUS_CALL_LOG_FAILED);
    CHECK(strstr(last_error(e), "I/O") != NULL);
    size_t n = 0;
    EXPECT_OK(kvc_engine_step(e, &n));
    EXPECT_STATUS(kvc_engine_call_log_open(e, path), KVC_STATUS_CALL_LOG_REFUSED);
    kvc_engine_free(e);

    /* A recorded run. */
    e = make_engine();
    EXPECT_OK(kvc_engine_call_log_open(e, path));
    EXPECT_STATUS(kvc_engine_call_log_open(e, path), KVC_STATUS_CALL_LOG_REFUSED);
    serve(e);
    EXPECT_STATUS(kvc_engine_call_log_close(e, NULL), KVC_STATUS_NULL_ARGUMENT);
    EXPECT_OK(kvc_engine_call_log_close(e, &calls));
    CHECK(calls > 500);
    EXPECT_STATUS(kvc_engine_call_log_close(e, &calls), KVC_STATUS_CALL_LOG_NOT_OPEN);
    kvc_counters c;
    EXPECT_OK(kvc_engine_counters(e, &c));
    CHECK(c.blocks_offloaded > 0 && c.blocks_onboarded > 0);
    kvc_engine_free(e);

    /* kvc_engine_free flushes and closes a log still open. */
    char path2[600];
    snprintf(path2, sizeof path2, "%s.freed", path);
    e = make_engine();
    EXPECT_OK(kvc_engine_call_log_open(e, path2));
    EXPECT_OK(kvc_engine_step(e, &n));
    kvc_engine_free(e);
    FILE *f = fopen(path2, "rb");
    CHECK(f != NULL);
    if (f != NULL) {
        char magic[8] = {0};
        CHECK(fread(magic, 1, 8, f) == 8 && memcmp(magic, "KVCCALLS", 8) == 0);
        CHECK(fseek(f, 0, SEEK_END) == 0 && ftell(f) > 10);
        fclose(f);
    }
    remove(path2);

    if (argc > 1) {
        printf("call log: %s %llu\n", path, (unsigned long long)calls);
    } else {
        remove(path);
    }
    return check_report("call_log");
}
