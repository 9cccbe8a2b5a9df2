/* A whole serving loop through the C API, as a custom scheduler drives it:
 * admit (text and image requests, content bytes and digests, UUIDs), read the
 * block table, commit, step, drain event records, grow, finish, cancel,
 * evict, clear, counters, model_info. Then several engines in one process,
 * two of them driven from two threads at once, to show there is no shared
 * state. */
#include <pthread.h>

#include "check.h"

enum { BS = 4 };

static kvc_engine *make_engine(void) {
    kvc_config c;
    EXPECT_OK(kvc_config_default(&c));
    c.block_size_tokens = BS;
    c.blocks_device = 64;
    c.model_image_capable = true;
    c.model_type = "qwen3_vl";
    c.kv_events_endpoint = "tcp://127.0.0.1:5557";
    kvc_engine *e = NULL;
    EXPECT_OK(kvc_engine_new(&c, &e));
    CHECK(e != NULL);
    return e;
}

static size_t drain(kvc_engine *e, kvc_event *out, size_t cap) {
    size_t total = 0, n = 0;
    /* Drain in chunks of 2 to exercise partial drains. */
    do {
        size_t room = cap - total < 2 ? cap - total : 2;
        EXPECT_OK(kvc_engine_drain_events(e, out + total, room, &n));
        total += n;
    } while (n != 0 && total < cap);
    return total;
}

/* The prompt: 12 tokens; positions 4..7 are one image. */
static const uint32_t PROMPT[12] = {11, 12, 13, 14, 151655, 151655, 151655, 151655, 21, 22, 23, 24};
static const uint8_t PIXELS[] = "not really pixels, but content bytes all the same";

static kvc_request image_request(kvc_image_item *item, kvc_token_run *run, kvc_bytes *uuid) {
    kvc_request r = text_request(PROMPT, 12);
    run->start = 4;
    run->len = 4;
    item->content_kind = KVC_IMAGE_CONTENT_BYTES;
    item->content = PIXELS;
    item->content_len = sizeof PIXELS;
    item->runs = run;
    item->runs_len = 1;
    r.items = item;
    r.items_len = 1;
    uuid->ptr = (const uint8_t *)"img-a";
    uuid->len = 5;
    r.uuids = uuid;
    r.uuids_len = 1;
    return r;
}

static void serving_loop(void) {
    kvc_engine *e = make_engine();
    kvc_event ev[64];
    size_t n = 0, copies = 99;

    /* 1. Admit an image request: nothing cached yet. */
    kvc_image_item item;
    kvc_token_run run;
    kvc_bytes uuid;
    kvc_request r = image_request(&item, &run, &uuid);
    kvc_admission a1;
    EXPECT_OK(kvc_engine_add_request(e, &r, &a1));
    CHECK(a1.tokens_cached == 0);

    uint32_t pages[8];
    EXPECT_OK(kvc_engine_block_table(e, a1.request_id, NULL, 0, &n));
    CHECK(n == 3);
    EXPECT_OK(kvc_engine_block_table(e, a1.request_id, pages, 8, &n));
    CHECK(n == 3 && pages[0] != pages[1] && pages[1] != pages[2]);

    /* 2. Forward pass done for the whole prompt: commit, step, drain. */
    EXPECT_OK(kvc_engine_commit(e, a1.request_id, 12));
    EXPECT_OK(kvc_engine_step(e, &copies));
    CHECK(copies == 0);
    EXPECT_OK(kvc_engine_block_copies(e, NULL, 0, &n));
    CHECK(n == 0);
    n = drain(e, ev, 64);
    CHECK(n == 3);
    for (size_t i = 0; i < n; i++) {
        CHECK(ev[i].kind == KVC_EVENT_KIND_BLOCK_STORED);
        CHECK(ev[i].medium == KVC_MEDIUM_GPU);
        CHECK(ev[i].block_index == i && ev[i].block_count == 3);
        CHECK(ev[i].event_seq == ev[0].event_seq);
        CHECK(ev[i].token_count == BS);
        CHECK(ev[i].image_count == 1);
        CHECK(ev[i].image_run_count == (i == 1 ? 1u : 0u));
    }
    CHECK((ev[0].flags & KVC_EVENT_FLAG_HAS_PARENT) == 0);
    CHECK((ev[1].flags & KVC_EVENT_FLAG_HAS_PARENT) && ev[1].parent_hash == ev[0].block_hash);
    CHECK(memcmp(ev[2].parent_key, ev[1].block_key, 32) == 0);
    int64_t last_hash = ev[2].block_hash;

    /* 3. Decode: grow by a block's worth of tokens, commit it, step. */
    uint32_t gen[BS] = {31, 32, 33, 34};
    EXPECT_OK(kvc_engine_grow(e, a1.request_id, gen, BS));
    kvc_request_info info;
    EXPECT_OK(kvc_engine_request_info(e, a1.request_id, &info));
    CHECK(info.tokens == 16 && info.prompt_len == 12 && info.blocks == 4 && info.tokens_computed == 12);
    EXPECT_OK(kvc_engine_commit(e, a1.request_id, 16));
    EXPECT_OK(kvc_engine_step(e, &copies));
    n = drain(e, ev, 64);
    CHECK(n == 1 && ev[0].parent_hash == last_hash && ev[0].step_index == 1);
    EXPECT_OK(kvc_engine_finish(e, a1.request_id));

    /* 4. The same prompt again: the first two blocks are reused (at most
     * prompt_len - 1 tokens can be cached). */
    kvc_admission a2;
    EXPECT_OK(kvc_engine_add_request(e, &r, &a2));
    CHECK(a2.tokens_cached == 8);
    CHECK(a2.request_id != a1.request_id);

    /* 5. The same tokens with another image (given as a digest): only the
     * text block before the image matches. The request has no UUID list. */
    uint8_t digest[32];
    for (int i = 0; i < 32; i++) {
        digest[i] = (uint8_t)(i * 7 + 1);
    }
    kvc_image_item item3 = item;
    item3.content_kind = KVC_IMAGE_CONTENT_DIGEST;
    item3.content = digest;
    item3.content_len = 32;
    kvc_request r3 = r;
    r3.items = &item3;
    r3.uuids = NULL;
    r3.uuids_len = 0;
    kvc_admission a3;
    EXPECT_OK(kvc_engine_add_request(e, &r3, &a3));
    CHECK(a3.tokens_cached == 4);

    /* 6. UUID lists: a copy when there is one, "absent" when there is none. */
    kvc_uuid_list list;
    EXPECT_OK(kvc_engine_request_uuids(e, a2.request_id, NULL, 0, NULL, 0, &list));
    CHECK(list.present == 1 && list.count == 1 && list.bytes == 5);
    kvc_uuid_entry entries[1];
    uint8_t bytes[5];
    EXPECT_OK(kvc_engine_request_uuids(e, a2.request_id, entries, 1, bytes, 5, &list));
    CHECK(entries[0].present == 1 && entries[0].offset == 0 && entries[0].len == 5);
    CHECK(memcmp(bytes, "img-a", 5) == 0);
    EXPECT_OK(kvc_engine_request_uuids(e, a3.request_id, NULL, 0, NULL, 0, &list));
    CHECK(list.present == 0 && list.count == 0);

    /* 7. A LoRA request with a cache salt lives in its own chain. */
    kvc_request r4 = text_request(PROMPT, 12);
    r4.has_lora_id = true;
    r4.lora_id = 3;
    r4.lora_name.ptr = (const uint8_t *)"adapter-3";
    r4.lora_name.len = 9;
    r4.cache_salt.ptr = (const uint8_t *)"tenant-a";
    r4.cache_salt.len = 8;
    kvc_admission a4;
    EXPECT_OK(kvc_engine_add_request(e, &r4, &a4));
    CHECK(a4.tokens_cached == 0);
    EXPECT_OK(kvc_engine_commit(e, a4.request_id, 12));
    EXPECT_OK(kvc_engine_step(e, &copies));
    n = drain(e, ev, 64);
    CHECK(n == 3 && (ev[0].flags & KVC_EVENT_FLAG_HAS_LORA_ID) && ev[0].lora_id == 3);

    /* A dummy (warm-up) request allocates but is never cached and emits nothing. */
    kvc_request warm = text_request(PROMPT, 12);
    warm.dummy = true;
    kvc_admission aw;
    EXPECT_OK(kvc_engine_add_request(e, &warm, &aw));
    EXPECT_OK(kvc_engine_commit(e, aw.request_id, 12));
    EXPECT_OK(kvc_engine_finish(e, aw.request_id));
    EXPECT_OK(kvc_engine_step(e, &copies));
    EXPECT_OK(kvc_engine_events_pending(e, &n));
    CHECK(n == 0);

    /* 8. Cancel and finish the rest; evict everything; clear. */
    EXPECT_OK(kvc_engine_cancel(e, a3.request_id));
    EXPECT_OK(kvc_engine_finish(e, a2.request_id));
    EXPECT_OK(kvc_engine_finish(e, a4.request_id));
    kvc_counters c;
    EXPECT_OK(kvc_engine_counters(e, &c));
    CHECK(c.requests_admitted == 5 && c.requests_rejected == 0 && c.requests_live == 0);
    CHECK(c.tokens_cached == 12 && c.tokens_uncached == 60 - 12);
    CHECK(c.blocks_cached_device == 7); /* 4 of the image chain, 3 of the LoRA chain */
    size_t evicted = 0;
    EXPECT_OK(kvc_engine_evict(e, 2, &evicted));
    CHECK(evicted == 2);
    EXPECT_OK(kvc_engine_step(e, &copies));
    n = drain(e, ev, 64);
    CHECK(n == 2 && ev[0].kind == KVC_EVENT_KIND_BLOCK_REMOVED && ev[0].block_count == 2);
    EXPECT_OK(kvc_engine_clear(e));
    EXPECT_OK(kvc_engine_step(e, &copies));
    EXPECT_OK(kvc_engine_events_pending(e, &n));
    CHECK(n >= 1);
    n = drain(e, ev, 64);
    CHECK(n >= 1 && ev[n - 1].kind == KVC_EVENT_KIND_ALL_BLOCKS_CLEARED);
    EXPECT_OK(kvc_engine_counters(e, &c));
    CHECK(c.blocks_cached_device == 0 && c.blocks_free_device == 64 && c.step_index == 6);

    /* 9. Capabilities: every gate holds in this configuration. */
    char json[1024];
    EXPECT_OK(kvc_engine_model_info(e, json, sizeof json, &n));
    CHECK(n == strlen(json));
    CHECK(strstr(json, "\"image_routing_version\":1") != NULL);
    CHECK(strstr(json, "\"block_size\":4") != NULL);

    kvc_engine_free(e);
}

/* Engines share nothing: a prefix cached in one is not cached in another. */
static void independent_engines(void) {
    kvc_engine *a = make_engine();
    kvc_engine *b = make_engine();
    kvc_request r = text_request(PROMPT, 12);
    kvc_admission x, y;
    size_t copies = 0;
    EXPECT_OK(kvc_engine_add_request(a, &r, &x));
    EXPECT_OK(kvc_engine_commit(a, x.request_id, 12));
    EXPECT_OK(kvc_engine_finish(a, x.request_id));
    EXPECT_OK(kvc_engine_step(a, &copies));
    EXPECT_OK(kvc_engine_add_request(a, &r, &x));
    CHECK(x.tokens_cached == 8);
    EXPECT_OK(kvc_engine_add_request(b, &r, &y));
    CHECK(y.tokens_cached == 0);
    kvc_engine_free(a);
    kvc_engine_free(b);
}

struct worker {
    kvc_engine *engine;
    int rounds;
    int failures;
};

/* Runs admit/commit/finish/step rounds on its own engine. */
static void *worker_main(void *arg) {
    struct worker *w = arg;
    kvc_event ev[16];
    for (int i = 0; i < w->rounds; i++) {
        uint32_t tokens[9];
        for (int k = 0; k < 9; k++) {
            tokens[k] = (uint32_t)(i % 5 * 100 + k);
        }
        kvc_request r = text_request(tokens, 9);
        kvc_admission a;
        size_t copies = 0, n = 0;
        if (kvc_engine_add_request(w->engine, &r, &a) != KVC_STATUS_OK ||
            kvc_engine_commit(w->engine, a.request_id, 9) != KVC_STATUS_OK ||
            kvc_engine_finish(w->engine, a.request_id) != KVC_STATUS_OK ||
            kvc_engine_step(w->engine, &copies) != KVC_STATUS_OK ||
            kvc_engine_drain_events(w->engine, ev, 16, &n) != KVC_STATUS_OK) {
            w->failures++;
        }
        if (i >= 5 && a.tokens_cached != 8) {
            w->failures++;
        }
    }
    return NULL;
}

static void engines_on_threads(void) {
    struct worker w[2] = {{make_engine(), 200, 0}, {make_engine(), 200, 0}};
    pthread_t t[2];
    for (int i = 0; i < 2; i++) {
        CHECK(pthread_create(&t[i], NULL, worker_main, &w[i]) == 0);
    }
    for (int i = 0; i < 2; i++) {
        CHECK(pthread_join(t[i], NULL) == 0);
        CHECK(w[i].failures == 0);
        kvc_counters c;
        EXPECT_OK(kvc_engine_counters(w[i].engine, &c));
        CHECK(c.requests_admitted == 200 && c.tokens_cached == 195 * 8);
        kvc_engine_free(w[i].engine);
    }
}

struct sharer {
    kvc_engine *engine;
    uint64_t admitted;
    uint64_t busy;
    uint64_t other;
};

/* Hammers a shared engine: every call either succeeds or is refused with
 * KVC_STATUS_ENGINE_BUSY; nothing else may happen. */
static void *sharer_main(void *arg) {
    struct sharer *s = arg;
    static const uint32_t tokens[5] = {5, 4, 3, 2, 1};
    for (int i = 0; i < 2000; i++) {
        kvc_request r = text_request(tokens, 5);
        kvc_admission a;
        kvc_status st = kvc_engine_add_request(s->engine, &r, &a);
        if (st == KVC_STATUS_ENGINE_BUSY) {
            s->busy++;
            continue;
        }
        if (st != KVC_STATUS_OK) {
            s->other++;
            continue;
        }
        s->admitted++;
        /* Retry the finish until it gets through: the id must not leak. */
        while ((st = kvc_engine_finish(s->engine, a.request_id)) == KVC_STATUS_ENGINE_BUSY) {
            s->busy++;
        }
        if (st != KVC_STATUS_OK) {
            s->other++;
        }
    }
    return NULL;
}

/* Misuse: two threads on one engine. The engine serialises them (or says
 * BUSY) instead of racing, and its counters add up afterwards. */
static void one_engine_two_threads(void) {
    kvc_engine *e = make_engine();
    struct sharer s[2] = {{e, 0, 0, 0}, {e, 0, 0, 0}};
    pthread_t t[2];
    for (int i = 0; i < 2; i++) {
        CHECK(pthread_create(&t[i], NULL, sharer_main, &s[i]) == 0);
    }
    for (int i = 0; i < 2; i++) {
        CHECK(pthread_join(t[i], NULL) == 0);
        CHECK(s[i].other == 0);
    }
    kvc_counters c;
    EXPECT_OK(kvc_engine_counters(e, &c));
    CHECK(c.requests_admitted == s[0].admitted + s[1].admitted);
    CHECK(c.requests_live == 0 && c.requests_rejected == 0);
    CHECK(c.requests_admitted > 0);
    kvc_engine_free(e);
}

int main(void) {
    /* The header's version macros match the linked library. */
    char version[64];
    snprintf(version, sizeof version, "%d.%d.%d", KVCORE_VERSION_MAJOR, KVCORE_VERSION_MINOR, KVCORE_VERSION_PATCH);
    CHECK(strcmp(kvc_version(), version) == 0);
    serving_loop();
    independent_engines();
    engines_on_threads();
    one_engine_two_threads();
    return check_report("serving_loop");
}
