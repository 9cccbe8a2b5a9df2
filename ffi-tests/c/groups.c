/* A hybrid engine through the C API: one full-attention group and one
 * sliding window of 8 tokens (two blocks of 4). Checks that the config is
 * validated, that each group has a block table of its own in which the
 * window names its null page (page 0) for blocks that fell out of it, that
 * those blocks are released (the group holds fewer) yet stay reusable, that
 * a prefix is reused only when both groups hold what the next token reads,
 * and that each copy and each event record names its group. */
#include "check.h"

static size_t table(kvc_engine *e, uint64_t id, uint32_t group, uint32_t *pages, size_t cap) {
    size_t n = 0;
    EXPECT_OK(kvc_engine_block_table_group(e, id, group, pages, cap, &n));
    return n;
}

static uint32_t referenced(kvc_engine *e, uint32_t group) {
    kvc_group_usage u;
    memset(&u, 0, sizeof u);
    EXPECT_OK(kvc_engine_group_usage(e, group, &u));
    return u.blocks_referenced;
}

int main(void) {
    kvc_config c;
    EXPECT_OK(kvc_config_default(&c));
    c.block_size_tokens = 4;
    kvc_group_config groups[2] = {
        {KVC_GROUP_KIND_FULL_ATTENTION, 0, 16, 4},
        {KVC_GROUP_KIND_SLIDING_WINDOW, 8, 9, 4},
    };
    c.groups = groups;
    c.groups_len = 2;
    kvc_engine *e = NULL;

    /* The totals must be the groups' sums; a second full-attention group and
     * a window of 0 are refused with a message naming the rule. */
    c.blocks_device = 24;
    c.blocks_host = 8;
    EXPECT_STATUS(kvc_engine_new(&c, &e), KVC_STATUS_INVALID_CONFIG);
    CHECK(e == NULL);
    c.blocks_device = 25;
    groups[1].kind = KVC_GROUP_KIND_FULL_ATTENTION;
    groups[1].window_tokens = 0;
    EXPECT_STATUS(kvc_engine_new(&c, &e), KVC_STATUS_INVALID_CONFIG);
    groups[1].kind = KVC_GROUP_KIND_SLIDING_WINDOW;
    EXPECT_STATUS(kvc_engine_new(&c, &e), KVC_STATUS_INVALID_CONFIG);
    groups[1].kind = 7;
    groups[1].window_tokens = 8;
    EXPECT_STATUS(kvc_engine_new(&c, &e), KVC_STATUS_INVALID_CONFIG);
    groups[1].kind = KVC_GROUP_KIND_SLIDING_WINDOW;
    c.groups_len = 3;
    c.groups = NULL;
    EXPECT_STATUS(kvc_engine_new(&c, &e), KVC_STATUS_INVALID_ARGUMENT);
    c.groups = groups;
    c.groups_len = 2;
    EXPECT_OK(kvc_engine_new(&c, &e));

    /* A prompt of 21 tokens: five full blocks and one partial. */
    uint32_t tokens[21];
    for (uint32_t i = 0; i < 21; i++) {
        tokens[i] = 100 + i;
    }
    kvc_request r = text_request(tokens, 21);
    kvc_admission a;
    EXPECT_OK(kvc_engine_add_request(e, &r, &a));
    CHECK(a.tokens_cached == 0);
    uint32_t full[8], window[8];
    CHECK(table(e, a.request_id, 0, full, 8) == 6);
    CHECK(table(e, a.request_id, 1, window, 8) == 6);
    for (size_t i = 0; i < 6; i++) {
        CHECK(window[i] != 0); /* nothing released before the prompt is computed */
    }
    CHECK(referenced(e, 0) == 6 && referenced(e, 1) == 6);

    /* All 21 computed: the next token (position 21) reads tokens 14..20, so
     * window blocks 0..2 are released: null page in the table, not held. */
    EXPECT_OK(kvc_engine_commit(e, a.request_id, 21));
    CHECK(table(e, a.request_id, 1, window, 8) == 6);
    CHECK(window[0] == 0 && window[1] == 0 && window[2] == 0);
    CHECK(window[3] != 0 && window[4] != 0 && window[5] != 0);
    CHECK(table(e, a.request_id, 0, full, 8) == 6);
    CHECK(referenced(e, 0) == 6 && referenced(e, 1) == 3);
    /* Group 0 through the single-group call is the same table. */
    uint32_t same[8];
    size_t n = 0;
    EXPECT_OK(kvc_engine_block_table(e, a.request_id, same, 8, &n));
    CHECK(n == 6 && memcmp(same, full, sizeof(uint32_t) * 6) == 0);
    EXPECT_STATUS(kvc_engine_block_table_group(e, a.request_id, 2, window, 8, &n), KVC_STATUS_UNKNOWN_GROUP);
    kvc_group_usage u;
    EXPECT_STATUS(kvc_engine_group_usage(e, 2, &u), KVC_STATUS_UNKNOWN_GROUP);
    EXPECT_OK(kvc_engine_finish(e, a.request_id));
    CHECK(referenced(e, 0) == 0 && referenced(e, 1) == 0);

    /* The same prompt again: group 0 holds blocks 0..4 and the window
     * holds all five as well (released blocks went to its LRU), so four
     * blocks are reused (at most prompt_len - 1 tokens); the window's table
     * names the null page before the first block token 20 reads (13..20). */
    kvc_admission b;
    EXPECT_OK(kvc_engine_add_request(e, &r, &b));
    CHECK(b.tokens_cached == 20);
    CHECK(table(e, b.request_id, 1, window, 8) == 6);
    CHECK(window[0] == 0 && window[1] == 0 && window[2] == 0 && window[3] != 0);
    EXPECT_OK(kvc_engine_cancel(e, b.request_id));

    /* An explicit eviction evicts in every group (each pool frees only its
     * own pages): the cached blocks are offloaded to each group's host tier,
     * and every copy names its group and a page of that group's pools. */
    size_t copies = 0;
    EXPECT_OK(kvc_engine_step(e, &copies));
    EXPECT_OK(kvc_engine_evict(e, 16, &n));
    CHECK(n == 10);
    EXPECT_OK(kvc_engine_step(e, &copies));
    kvc_block_copy list[32];
    EXPECT_OK(kvc_engine_block_copies(e, list, 32, &n));
    CHECK(n == copies && n == 8);
    int per_group[2] = {0, 0};
    for (size_t i = 0; i < n; i++) {
        CHECK(list[i].group < 2);
        if (list[i].group < 2) {
            per_group[list[i].group]++;
            CHECK(list[i].src_medium == KVC_MEDIUM_GPU && list[i].dst_medium == KVC_MEDIUM_CPU);
            CHECK(list[i].src_page < groups[list[i].group].blocks_device);
            CHECK(list[i].dst_page < groups[list[i].group].blocks_host);
        }
    }
    CHECK(per_group[0] == 4 && per_group[1] == 4);

    /* Every drained record names its group: both groups stored the prompt's
     * blocks and the eviction moved blocks of both. */
    kvc_event events[256];
    EXPECT_OK(kvc_engine_drain_events(e, events, 256, &n));
    CHECK(n > 0 && n < 256);
    int stored[2] = {0, 0}, removed[2] = {0, 0};
    for (size_t i = 0; i < n; i++) {
        CHECK(events[i].group < 2);
        if (events[i].group >= 2) {
            continue;
        }
        if (events[i].kind == KVC_EVENT_KIND_BLOCK_STORED) {
            stored[events[i].group]++;
        } else if (events[i].kind == KVC_EVENT_KIND_BLOCK_REMOVED) {
            removed[events[i].group]++;
        }
    }
    CHECK(stored[0] > 0 && stored[1] > 0 && removed[0] > 0 && removed[1] > 0);
    kvc_engine_free(e);

    /* The default config names no group: a single table, group 1 unknown. */
    EXPECT_OK(kvc_config_default(&c));
    CHECK(c.groups == NULL && c.groups_len == 0);
    c.block_size_tokens = 4;
    c.blocks_device = 8;
    EXPECT_OK(kvc_engine_new(&c, &e));
    EXPECT_OK(kvc_engine_add_request(e, &r, &a));
    CHECK(table(e, a.request_id, 0, full, 8) == 6);
    EXPECT_STATUS(kvc_engine_block_table_group(e, a.request_id, 1, window, 8, &n), KVC_STATUS_UNKNOWN_GROUP);
    kvc_engine_free(e);

    return check_report("groups");
}
