/* Block copies through the C API: evicting into the host tier queues
 * offloads, matching a prefix that lives on the host queues onboards, an
 * onboard into a device page that an offload of the same step reads lands in
 * a later wave, partial reuse queues a device-to-device copy of the
 * shared tokens, and offload_first puts a step's offloads and onboards in
 * two waves. */
#include "check.h"

static void serve(kvc_engine *e, const uint32_t *tokens, size_t n, kvc_admission *a) {
    kvc_request r = text_request(tokens, n);
    EXPECT_OK(kvc_engine_add_request(e, &r, a));
    EXPECT_OK(kvc_engine_commit(e, a->request_id, n));
    EXPECT_OK(kvc_engine_finish(e, a->request_id));
}

static size_t copies_of_step(kvc_engine *e, kvc_block_copy *out, size_t cap) {
    size_t n = 0, m = 0;
    EXPECT_OK(kvc_engine_step(e, &n));
    CHECK(n <= cap);
    EXPECT_OK(kvc_engine_block_copies(e, out, cap, &m));
    CHECK(m == n);
    return m;
}

int main(void) {
    kvc_config c;
    EXPECT_OK(kvc_config_default(&c));
    c.block_size_tokens = 4;
    c.blocks_device = 4;
    c.blocks_host = 8;
    kvc_engine *e = NULL;
    EXPECT_OK(kvc_engine_new(&c, &e));

    const uint32_t a_tokens[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
    uint32_t b_tokens[16];
    for (uint32_t i = 0; i < 16; i++) {
        b_tokens[i] = 100 + i;
    }
    kvc_admission a, b, again;
    kvc_block_copy copies[16];

    /* A caches two full blocks; B needs all four device pages, so A's
     * blocks are offloaded to the host tier. */
    serve(e, a_tokens, 9, &a);
    CHECK(copies_of_step(e, copies, 16) == 0);
    serve(e, b_tokens, 16, &b);
    size_t n = copies_of_step(e, copies, 16);
    CHECK(n == 2);
    for (size_t i = 0; i < n; i++) {
        CHECK(copies[i].src_medium == KVC_MEDIUM_GPU && copies[i].dst_medium == KVC_MEDIUM_CPU);
        CHECK(copies[i].tokens == 4 && copies[i].wave == 0);
    }

    /* A again: its prefix is on the host. Onboarding needs device pages,
     * which B's cached blocks free by being offloaded in the same step. */
    kvc_request r = text_request(a_tokens, 9);
    EXPECT_OK(kvc_engine_add_request(e, &r, &again));
    CHECK(again.tokens_cached == 8 && again.tokens_onboarded == 8);
    n = copies_of_step(e, copies, 16);
    int onboards = 0, later_wave_reuses_page = 0;
    for (size_t i = 0; i < n; i++) {
        CHECK(i == 0 || copies[i].wave >= copies[i - 1].wave);
        if (copies[i].src_medium == KVC_MEDIUM_CPU && copies[i].dst_medium == KVC_MEDIUM_GPU) {
            onboards++;
            for (size_t j = 0; j < i; j++) {
                if (copies[j].src_medium == KVC_MEDIUM_GPU && copies[j].src_page == copies[i].dst_page) {
                    later_wave_reuses_page += copies[i].wave > copies[j].wave;
                    CHECK(copies[i].wave > copies[j].wave);
                }
            }
        }
    }
    CHECK(onboards == 2);
    CHECK(later_wave_reuses_page >= 1);
    kvc_counters k;
    EXPECT_OK(kvc_engine_counters(e, &k));
    CHECK(k.blocks_onboarded == 2 && k.blocks_offloaded >= 4);

    /* The copies stay readable until the next step; a short buffer is refused whole. */
    kvc_block_copy one[1];
    size_t m = 99;
    if (n > 1) {
        EXPECT_STATUS(kvc_engine_block_copies(e, one, 1, &m), KVC_STATUS_BUFFER_TOO_SMALL);
        CHECK(m == 99);
    }
    EXPECT_OK(kvc_engine_finish(e, again.request_id));
    kvc_engine_free(e);

    /* Partial reuse: a prompt sharing 2 leading tokens of a cached block gets
     * a fresh block with those tokens copied device to device. */
    EXPECT_OK(kvc_config_default(&c));
    c.block_size_tokens = 4;
    c.blocks_device = 16;
    c.partial_reuse = true;
    EXPECT_OK(kvc_engine_new(&c, &e));
    serve(e, a_tokens, 9, &a); /* caches [1 2 3 4] [5 6 7 8] */
    CHECK(copies_of_step(e, copies, 16) == 0);
    const uint32_t sibling[10] = {1, 2, 3, 4, 5, 6, 70, 80, 90, 91};
    r = text_request(sibling, 10);
    EXPECT_OK(kvc_engine_add_request(e, &r, &b));
    CHECK(b.tokens_cached == 6); /* one full block, then 2 tokens copied */
    n = copies_of_step(e, copies, 16);
    CHECK(n == 1 && copies[0].tokens == 2 && copies[0].wave == 0);
    CHECK(n == 1 && copies[0].src_medium == KVC_MEDIUM_GPU && copies[0].dst_medium == KVC_MEDIUM_GPU);
    CHECK(n == 1 && copies[0].src_page != copies[0].dst_page);
    EXPECT_OK(kvc_engine_counters(e, &k));
    CHECK(k.blocks_partially_reused == 1);
    EXPECT_OK(kvc_engine_finish(e, b.request_id));
    kvc_engine_free(e);

    /* offload_first, with both tiers full: A's 6 blocks live on the host,
     * B's 8 fill the device, and A again needs 7 device pages. By default
     * offloads and onboards alternate (the onboards free the host pages the
     * offloads take: nothing dropped, one wave per move); with offload_first
     * every eviction comes first (2 offloaded, 5 dropped), then the 6
     * onboards: two waves. */
    uint32_t long_a[25], long_b[32];
    for (uint32_t i = 0; i < 32; i++) {
        if (i < 25) {
            long_a[i] = 1000 + i;
        }
        long_b[i] = 2000 + i;
    }
    kvc_block_copy many[64];
    for (int first = 0; first < 2; first++) {
        EXPECT_OK(kvc_config_default(&c));
        c.block_size_tokens = 4;
        c.blocks_device = 8;
        c.blocks_host = 8;
        c.offload_first = first == 1;
        EXPECT_OK(kvc_engine_new(&c, &e));
        serve(e, long_a, 25, &a);
        CHECK(copies_of_step(e, many, 64) == 0);
        serve(e, long_b, 32, &b);
        CHECK(copies_of_step(e, many, 64) == 6);
        r = text_request(long_a, 25);
        EXPECT_OK(kvc_engine_add_request(e, &r, &again));
        CHECK(again.tokens_onboarded == 24);
        n = copies_of_step(e, many, 64);
        int offloads = 0, ons = 0;
        for (size_t i = 0; i < n; i++) {
            offloads += many[i].src_medium == KVC_MEDIUM_GPU && many[i].dst_medium == KVC_MEDIUM_CPU;
            ons += many[i].src_medium == KVC_MEDIUM_CPU && many[i].dst_medium == KVC_MEDIUM_GPU;
        }
        uint32_t waves = n == 0 ? 0 : many[n - 1].wave + 1;
        CHECK(ons == 6);
        if (first) {
            CHECK(offloads == 2 && waves == 2);
        } else {
            CHECK(offloads == 7 && waves >= 10);
        }
        EXPECT_OK(kvc_engine_finish(e, again.request_id));
        kvc_engine_free(e);
    }
    return check_report("tiers");
}
