/* Every misuse of the C API gets its documented status, writes no _out
 * parameter, and loses nothing: after each one the counters are what they
 * were (or moved exactly as documented) and the engine still serves.
 *
 * A real double free of an engine is undefined behaviour, as with free(3),
 * so it is not exercised; the documented safe patterns are: kvc_engine_free
 * of NULL is a no-op, and a request id used after finish/cancel (a "double
 * finish") is answered with KVC_STATUS_UNKNOWN_ID. */
#include <stdint.h>

#include "check.h"

enum { BS = 4 };

static kvc_engine *make_engine(void) {
    kvc_config c;
    EXPECT_OK(kvc_config_default(&c));
    c.block_size_tokens = BS;
    c.blocks_device = 16;
    c.requests_max = 4;
    c.tokens_per_request_max = 40;
    c.mm_items_max = 4;
    c.mm_items_per_request_max = 3;
    kvc_engine *e = NULL;
    EXPECT_OK(kvc_engine_new(&c, &e));
    return e;
}

static kvc_counters counters(kvc_engine *e) {
    kvc_counters c;
    memset(&c, 0, sizeof c);
    EXPECT_OK(kvc_engine_counters(e, &c));
    return c;
}

static int same_counters(kvc_counters a, kvc_counters b) {
    return memcmp(&a, &b, sizeof a) == 0;
}

/* A full request round trip; proves the engine still works. */
static void still_serves(kvc_engine *e) {
    static const uint32_t tokens[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
    kvc_request r = text_request(tokens, 9);
    kvc_admission a;
    size_t copies = 0;
    EXPECT_OK(kvc_engine_add_request(e, &r, &a));
    EXPECT_OK(kvc_engine_commit(e, a.request_id, 9));
    EXPECT_OK(kvc_engine_finish(e, a.request_id));
    EXPECT_OK(kvc_engine_step(e, &copies));
}

static const uint32_t PROMPT[8] = {1, 2, 3, 4, 5, 6, 7, 8};

/* Expects add_request to fail with `want`, leave the admission untouched,
 * the live requests unchanged and requests_rejected moved by `rejected`. */
static void expect_refused_msg(kvc_engine *e, const kvc_request *r, kvc_status want, uint64_t rejected,
                               const char *needle, int line) {
    kvc_counters before = counters(e);
    kvc_admission a;
    memset(&a, 0xAB, sizeof a);
    kvc_status got = kvc_engine_add_request(e, r, &a);
    if (got != want) {
        fprintf(stderr, "line %d: add_request returned %u (%s: %s), expected %u\n", line, (unsigned)got,
                kvc_status_str(got), last_error(e), (unsigned)want);
        check_failures++;
    }
    CHECK(a.request_id == 0xABABABABABABABABull); /* _out written only on success */
    CHECK(strlen(last_error(e)) > 0);
    if (needle != NULL && strstr(last_error(e), needle) == NULL) {
        fprintf(stderr, "line %d: last error \"%s\" does not mention \"%s\"\n", line, last_error(e), needle);
        check_failures++;
    }
    kvc_counters after = counters(e);
    before.requests_rejected += rejected;
    if (!same_counters(before, after)) {
        fprintf(stderr, "line %d: counters changed\n", line);
        check_failures++;
    }
}

static void expect_refused(kvc_engine *e, const kvc_request *r, kvc_status want, uint64_t rejected, int line) {
    expect_refused_msg(e, r, want, rejected, NULL, line);
}

static void null_and_config(void) {
    kvc_engine_free(NULL); /* a no-op */
    kvc_config c;
    EXPECT_STATUS(kvc_config_default(NULL), KVC_STATUS_NULL_ARGUMENT);
    EXPECT_OK(kvc_config_default(&c));
    kvc_engine *e = (kvc_engine *)(uintptr_t)0x1234;
    EXPECT_STATUS(kvc_engine_new(NULL, &e), KVC_STATUS_NULL_ARGUMENT);
    CHECK(e == (kvc_engine *)(uintptr_t)0x1234);
    EXPECT_STATUS(kvc_engine_new(&c, NULL), KVC_STATUS_NULL_ARGUMENT);
    c.block_size_tokens = 0;
    EXPECT_STATUS(kvc_engine_new(&c, &e), KVC_STATUS_INVALID_CONFIG);
    EXPECT_OK(kvc_config_default(&c));
    c.blocks_device = 0;
    EXPECT_STATUS(kvc_engine_new(&c, &e), KVC_STATUS_INVALID_CONFIG);
    EXPECT_OK(kvc_config_default(&c));
    c.kv_transfer_role = 9;
    EXPECT_STATUS(kvc_engine_new(&c, &e), KVC_STATUS_INVALID_CONFIG);
    EXPECT_OK(kvc_config_default(&c));
    c.model_type = "qwen\xff";
    EXPECT_STATUS(kvc_engine_new(&c, &e), KVC_STATUS_INVALID_UTF8);
    CHECK(e == (kvc_engine *)(uintptr_t)0x1234);

    /* Every engine call refuses a NULL engine. */
    size_t n = 77;
    kvc_counters k;
    EXPECT_STATUS(kvc_engine_step(NULL, &n), KVC_STATUS_NULL_ARGUMENT);
    EXPECT_STATUS(kvc_engine_counters(NULL, &k), KVC_STATUS_NULL_ARGUMENT);
    EXPECT_STATUS(kvc_engine_finish(NULL, 1), KVC_STATUS_NULL_ARGUMENT);
    EXPECT_STATUS(kvc_engine_cancel(NULL, 1), KVC_STATUS_NULL_ARGUMENT);
    EXPECT_STATUS(kvc_engine_commit(NULL, 1, 1), KVC_STATUS_NULL_ARGUMENT);
    EXPECT_STATUS(kvc_engine_grow(NULL, 1, NULL, 0), KVC_STATUS_NULL_ARGUMENT);
    EXPECT_STATUS(kvc_engine_clear(NULL), KVC_STATUS_NULL_ARGUMENT);
    EXPECT_STATUS(kvc_engine_last_error(NULL, NULL, 0, &n), KVC_STATUS_NULL_ARGUMENT);
    EXPECT_STATUS(kvc_engine_drain_events(NULL, NULL, 0, &n), KVC_STATUS_NULL_ARGUMENT);
    CHECK(n == 77);

    /* Status strings are static and distinct; unknown codes are described as such. */
    CHECK(strcmp(kvc_status_str(KVC_STATUS_OK), "ok") == 0);
    CHECK(strcmp(kvc_status_str(12345), "unknown status code") == 0);
    CHECK(strcmp(kvc_status_str(KVC_STATUS_UNKNOWN_ID), kvc_status_str(KVC_STATUS_NULL_ARGUMENT)) != 0);
}

static void null_out_params(kvc_engine *e) {
    kvc_counters before = counters(e);
    kvc_request r = text_request(PROMPT, 8);
    EXPECT_STATUS(kvc_engine_add_request(e, NULL, NULL), KVC_STATUS_NULL_ARGUMENT);
    CHECK(strstr(last_error(e), "request") != NULL);
    EXPECT_STATUS(kvc_engine_add_request(e, &r, NULL), KVC_STATUS_NULL_ARGUMENT);
    CHECK(strstr(last_error(e), "admission_out") != NULL);
    EXPECT_STATUS(kvc_engine_step(e, NULL), KVC_STATUS_NULL_ARGUMENT);
    EXPECT_STATUS(kvc_engine_counters(e, NULL), KVC_STATUS_NULL_ARGUMENT);
    EXPECT_STATUS(kvc_engine_events_pending(e, NULL), KVC_STATUS_NULL_ARGUMENT);
    EXPECT_STATUS(kvc_engine_evict(e, 1, NULL), KVC_STATUS_NULL_ARGUMENT);
    EXPECT_STATUS(kvc_engine_model_info(e, NULL, 0, NULL), KVC_STATUS_NULL_ARGUMENT);
    EXPECT_STATUS(kvc_engine_request_uuids(e, 1, NULL, 0, NULL, 0, NULL), KVC_STATUS_NULL_ARGUMENT);
    /* None of that admitted or stepped anything; the two refused admissions are counted. */
    before.requests_rejected += 2;
    CHECK(same_counters(before, counters(e)));
}

static void malformed_requests(kvc_engine *e) {
    kvc_request r;
    kvc_token_run run = {2, 4};
    uint8_t content[3] = {1, 2, 3};
    kvc_image_item item = {KVC_IMAGE_CONTENT_BYTES, content, 3, &run, 1};
    kvc_bytes uuid = {(const uint8_t *)"u", 1};

    /* Mismatched lengths: NULL pointers with non-zero lengths. */
    r = text_request(NULL, 8);
    expect_refused(e, &r, KVC_STATUS_INVALID_ARGUMENT, 1, __LINE__);
    r = text_request(PROMPT, 8);
    r.items_len = 1;
    expect_refused(e, &r, KVC_STATUS_INVALID_ARGUMENT, 1, __LINE__);
    r = text_request(PROMPT, 8);
    r.uuids_len = 2;
    expect_refused(e, &r, KVC_STATUS_INVALID_ARGUMENT, 1, __LINE__);
    r = text_request(PROMPT, 8);
    r.lora_name.len = 4;
    expect_refused(e, &r, KVC_STATUS_INVALID_ARGUMENT, 1, __LINE__);
    kvc_image_item bad_item = item;
    bad_item.runs = NULL;
    r = text_request(PROMPT, 8);
    r.items = &bad_item;
    r.items_len = 1;
    expect_refused(e, &r, KVC_STATUS_INVALID_ARGUMENT, 1, __LINE__);
    kvc_bytes bad_uuid = {NULL, 3};
    r.items = &item;
    r.uuids = &bad_uuid;
    r.uuids_len = 1;
    expect_refused(e, &r, KVC_STATUS_INVALID_ARGUMENT, 1, __LINE__);
    /* A misaligned token pointer. */
    uint32_t aligned[9];
    memcpy(aligned, PROMPT, sizeof PROMPT);
    r = text_request((const uint32_t *)((const char *)aligned + 1), 8);
    expect_refused(e, &r, KVC_STATUS_INVALID_ARGUMENT, 1, __LINE__);
    /* An unknown content kind. */
    kvc_image_item kind_item = item;
    kind_item.content_kind = 7;
    r = text_request(PROMPT, 8);
    r.items = &kind_item;
    r.items_len = 1;
    expect_refused(e, &r, KVC_STATUS_INVALID_ARGUMENT, 1, __LINE__);

    /* Content the engine refuses (counted in requests_rejected, as every refused admission is). */
    r = text_request(PROMPT, 0);
    expect_refused(e, &r, KVC_STATUS_EMPTY_PROMPT, 1, __LINE__);
    /* Invalid UTF-8 in a UUID. */
    kvc_bytes utf8_bad = {(const uint8_t *)"ab\xc3(", 4};
    r = text_request(PROMPT, 8);
    r.items = &item;
    r.items_len = 1;
    r.uuids = &utf8_bad;
    r.uuids_len = 1;
    expect_refused_msg(e, &r, KVC_STATUS_INVALID_UTF8, 1, "UUID", __LINE__);
    /* Invalid UTF-8 in the LoRA name or salt (refused while reading the C description, counted too). */
    r = text_request(PROMPT, 8);
    r.cache_salt.ptr = (const uint8_t *)"\xfe";
    r.cache_salt.len = 1;
    expect_refused(e, &r, KVC_STATUS_INVALID_UTF8, 1, __LINE__);
    /* UUID list length differs from the number of items. */
    kvc_bytes two[2] = {uuid, uuid};
    r = text_request(PROMPT, 8);
    r.items = &item;
    r.items_len = 1;
    r.uuids = two;
    r.uuids_len = 2;
    expect_refused(e, &r, KVC_STATUS_UUID_COUNT_MISMATCH, 1, __LINE__);
    /* A digest of 31 bytes. */
    uint8_t digest[31] = {0};
    kvc_image_item digest_item = {KVC_IMAGE_CONTENT_DIGEST, digest, 31, &run, 1};
    r = text_request(PROMPT, 8);
    r.items = &digest_item;
    r.items_len = 1;
    expect_refused(e, &r, KVC_STATUS_BAD_DIGEST_LENGTH, 1, __LINE__);
    /* Runs: outside the prompt, empty, overlapping, none. */
    kvc_token_run runs_out[1] = {{6, 4}};
    kvc_token_run runs_zero[1] = {{1, 0}};
    kvc_token_run runs_overlap[2] = {{1, 3}, {2, 2}};
    kvc_image_item run_item = item;
    r = text_request(PROMPT, 8);
    r.items = &run_item;
    r.items_len = 1;
    run_item.runs = runs_out;
    expect_refused(e, &r, KVC_STATUS_INVALID_IMAGE_RUNS, 1, __LINE__);
    run_item.runs = runs_zero;
    expect_refused(e, &r, KVC_STATUS_INVALID_IMAGE_RUNS, 1, __LINE__);
    run_item.runs = runs_overlap;
    run_item.runs_len = 2;
    expect_refused(e, &r, KVC_STATUS_INVALID_IMAGE_RUNS, 1, __LINE__);
    run_item.runs_len = 0;
    expect_refused(e, &r, KVC_STATUS_INVALID_IMAGE_RUNS, 1, __LINE__);
    /* Capacity: a prompt longer than tokens_per_request_max (40), and one
     * needing more blocks than the device has (16 blocks of 4 tokens). */
    uint32_t long_prompt[41] = {0};
    r = text_request(long_prompt, 41);
    expect_refused(e, &r, KVC_STATUS_REQUEST_TOO_LONG, 1, __LINE__);
    still_serves(e);
}

static void oversized_uuid(kvc_engine *e) {
    /* 300 bytes: accepted (KVC_STATUS_OK), kept in the request's UUID list,
     * ignored as a routing hint and counted in hint_oversized. */
    uint8_t big[300];
    memset(big, 'x', sizeof big);
    kvc_bytes uuids[2] = {{big, sizeof big}, {NULL, 0}};
    kvc_token_run runs[2] = {{0, 2}, {4, 2}};
    uint8_t c1[1] = {1}, c2[1] = {2};
    kvc_image_item items[2] = {{KVC_IMAGE_CONTENT_BYTES, c1, 1, &runs[0], 1}, {KVC_IMAGE_CONTENT_BYTES, c2, 1, &runs[1], 1}};
    kvc_request r = text_request(PROMPT, 8);
    r.items = items;
    r.items_len = 2;
    r.uuids = uuids;
    r.uuids_len = 2;
    kvc_counters before = counters(e);
    kvc_admission a;
    EXPECT_STATUS(kvc_engine_add_request(e, NULL, &a), KVC_STATUS_NULL_ARGUMENT);
    EXPECT_OK(kvc_engine_add_request(e, &r, &a));
    CHECK(strlen(last_error(e)) == 0); /* cleared by the successful call */
    kvc_counters after = counters(e);
    CHECK(after.hint_oversized == before.hint_oversized + 1);
    CHECK(after.requests_admitted == before.requests_admitted + 1);

    /* The list comes back whole, absent entry included. */
    kvc_uuid_list list;
    EXPECT_OK(kvc_engine_request_uuids(e, a.request_id, NULL, 0, NULL, 0, &list));
    CHECK(list.present == 1 && list.count == 2 && list.bytes == 300);
    kvc_uuid_entry entries[2];
    uint8_t bytes[300];
    kvc_uuid_list untouched = {7, 7, 7};
    EXPECT_STATUS(kvc_engine_request_uuids(e, a.request_id, entries, 2, bytes, 299, &untouched),
                  KVC_STATUS_BUFFER_TOO_SMALL);
    CHECK(untouched.present == 7 && untouched.count == 7);
    EXPECT_STATUS(kvc_engine_request_uuids(e, a.request_id, entries, 1, bytes, 300, &untouched),
                  KVC_STATUS_BUFFER_TOO_SMALL);
    EXPECT_OK(kvc_engine_request_uuids(e, a.request_id, entries, 2, bytes, 300, &list));
    CHECK(entries[0].present == 1 && entries[0].len == 300 && memcmp(bytes, big, 300) == 0);
    CHECK(entries[1].present == 0 && entries[1].len == 0);
    EXPECT_OK(kvc_engine_cancel(e, a.request_id));
}

static void stale_ids(kvc_engine *e) {
    kvc_request r = text_request(PROMPT, 8);
    kvc_admission a, b;
    EXPECT_OK(kvc_engine_add_request(e, &r, &a));
    EXPECT_OK(kvc_engine_finish(e, a.request_id));
    kvc_counters before = counters(e);
    /* Double finish, and everything else on the stale id. */
    EXPECT_STATUS(kvc_engine_finish(e, a.request_id), KVC_STATUS_UNKNOWN_ID);
    EXPECT_STATUS(kvc_engine_cancel(e, a.request_id), KVC_STATUS_UNKNOWN_ID);
    EXPECT_STATUS(kvc_engine_commit(e, a.request_id, 8), KVC_STATUS_UNKNOWN_ID);
    uint32_t more[1] = {9};
    EXPECT_STATUS(kvc_engine_grow(e, a.request_id, more, 1), KVC_STATUS_UNKNOWN_ID);
    kvc_request_info info;
    EXPECT_STATUS(kvc_engine_request_info(e, a.request_id, &info), KVC_STATUS_UNKNOWN_ID);
    size_t n = 5;
    EXPECT_STATUS(kvc_engine_block_table(e, a.request_id, NULL, 0, &n), KVC_STATUS_UNKNOWN_ID);
    CHECK(n == 5);
    kvc_uuid_list list;
    EXPECT_STATUS(kvc_engine_request_uuids(e, a.request_id, NULL, 0, NULL, 0, &list), KVC_STATUS_UNKNOWN_ID);
    /* Ids never issued. */
    EXPECT_STATUS(kvc_engine_finish(e, 0), KVC_STATUS_UNKNOWN_ID);
    EXPECT_STATUS(kvc_engine_finish(e, UINT64_MAX), KVC_STATUS_UNKNOWN_ID);
    /* Slot 1 at its first generation: the right shape, long stale by now. */
    EXPECT_STATUS(kvc_engine_finish(e, 0x0000000100000001ull), KVC_STATUS_UNKNOWN_ID);
    CHECK(same_counters(before, counters(e)));
    /* The slot is reused by the next request; the old id still misses and
     * never touches the new request. */
    EXPECT_OK(kvc_engine_add_request(e, &r, &b));
    CHECK(b.request_id != a.request_id);
    EXPECT_STATUS(kvc_engine_cancel(e, a.request_id), KVC_STATUS_UNKNOWN_ID);
    EXPECT_OK(kvc_engine_request_info(e, b.request_id, &info));
    CHECK(info.prompt_len == 8);
    const uint32_t computed = info.tokens_computed;
    /* The live id's slot with every other generation, even ones included
     * (issued generations are odd: the even one just below the live one
     * must not resolve to it), is unknown and leaves the request alone. */
    for (uint64_t gen = 0; gen < 16; gen++) {
        uint64_t forged = (gen << 32) | (b.request_id & 0xffffffffull);
        if (forged == b.request_id) {
            continue;
        }
        EXPECT_STATUS(kvc_engine_commit(e, forged, 8), KVC_STATUS_UNKNOWN_ID);
        EXPECT_STATUS(kvc_engine_finish(e, forged), KVC_STATUS_UNKNOWN_ID);
    }
    EXPECT_OK(kvc_engine_request_info(e, b.request_id, &info));
    CHECK(info.prompt_len == 8 && info.tokens_computed == computed);
    /* Commit counts may not go backwards or past the tokens. */
    EXPECT_OK(kvc_engine_commit(e, b.request_id, 6));
    EXPECT_STATUS(kvc_engine_commit(e, b.request_id, 5), KVC_STATUS_BAD_COMPUTED_COUNT);
    EXPECT_STATUS(kvc_engine_commit(e, b.request_id, 9), KVC_STATUS_BAD_COMPUTED_COUNT);
    EXPECT_OK(kvc_engine_request_info(e, b.request_id, &info));
    CHECK(info.tokens_computed == 6);
    /* Growing past tokens_per_request_max (40). */
    uint32_t many[33] = {0};
    EXPECT_STATUS(kvc_engine_grow(e, b.request_id, many, 33), KVC_STATUS_REQUEST_TOO_LONG);
    EXPECT_STATUS(kvc_engine_grow(e, b.request_id, NULL, 3), KVC_STATUS_INVALID_ARGUMENT);
    EXPECT_OK(kvc_engine_request_info(e, b.request_id, &info));
    CHECK(info.tokens == 8);
    EXPECT_OK(kvc_engine_finish(e, b.request_id));
    still_serves(e);
}

static void capacity(kvc_engine *e) {
    /* requests_max is 4. */
    kvc_request r = text_request(PROMPT, 8);
    kvc_admission a[4];
    for (int i = 0; i < 4; i++) {
        EXPECT_OK(kvc_engine_add_request(e, &r, &a[i]));
    }
    expect_refused(e, &r, KVC_STATUS_TOO_MANY_REQUESTS, 1, __LINE__);
    for (int i = 0; i < 4; i++) {
        EXPECT_OK(kvc_engine_finish(e, a[i].request_id));
    }
    /* 16 device blocks of 4 tokens: a 40-token prompt needs 10, two need 20. */
    uint32_t prompt[40];
    for (int i = 0; i < 40; i++) {
        prompt[i] = (uint32_t)(1000 + i);
    }
    kvc_request big = text_request(prompt, 40);
    kvc_admission x;
    EXPECT_OK(kvc_engine_add_request(e, &big, &x));
    prompt[0] = 999; /* another chain */
    expect_refused_msg(e, &big, KVC_STATUS_OUT_OF_BLOCKS, 1, "blocks", __LINE__);
    EXPECT_OK(kvc_engine_cancel(e, x.request_id));
    EXPECT_OK(kvc_engine_add_request(e, &big, &x));
    EXPECT_OK(kvc_engine_cancel(e, x.request_id));
    still_serves(e);

    /* Image items: 3 per request at most, 4 live at most. */
    uint8_t px[1] = {9};
    kvc_token_run runs[4] = {{0, 1}, {2, 1}, {4, 1}, {6, 1}};
    kvc_image_item items[4];
    for (int i = 0; i < 4; i++) {
        kvc_image_item it = {KVC_IMAGE_CONTENT_BYTES, px, 1, &runs[i], 1};
        items[i] = it;
    }
    kvc_request imgs = text_request(PROMPT, 8);
    imgs.items = items;
    imgs.items_len = 4;
    expect_refused(e, &imgs, KVC_STATUS_TOO_MANY_ITEMS_PER_REQUEST, 1, __LINE__);
    imgs.items_len = 3;
    kvc_admission three;
    EXPECT_OK(kvc_engine_add_request(e, &imgs, &three));
    imgs.items_len = 2;
    expect_refused_msg(e, &imgs, KVC_STATUS_TOO_MANY_ITEMS, 1, "item table", __LINE__);
    EXPECT_OK(kvc_engine_finish(e, three.request_id));
    EXPECT_OK(kvc_engine_add_request(e, &imgs, &three));
    EXPECT_OK(kvc_engine_finish(e, three.request_id));
}

static void buffers(kvc_engine *e) {
    kvc_request r = text_request(PROMPT, 8);
    kvc_admission a;
    EXPECT_OK(kvc_engine_add_request(e, &r, &a));
    uint32_t pages[2] = {0, 0};
    size_t n = 42;
    EXPECT_STATUS(kvc_engine_block_table(e, a.request_id, pages, 1, &n), KVC_STATUS_BUFFER_TOO_SMALL);
    CHECK(n == 42 && pages[0] == 0);
    EXPECT_STATUS(kvc_engine_block_table(e, a.request_id, NULL, 2, &n), KVC_STATUS_INVALID_ARGUMENT);
    EXPECT_OK(kvc_engine_block_table(e, a.request_id, pages, 2, &n));
    CHECK(n == 2);
    char small[8];
    memset(small, 'z', sizeof small);
    EXPECT_STATUS(kvc_engine_model_info(e, small, sizeof small, &n), KVC_STATUS_BUFFER_TOO_SMALL);
    CHECK(small[0] == 'z');
    /* The last error truncates at the buffer and stays NUL-terminated. */
    size_t full = 0;
    EXPECT_OK(kvc_engine_last_error(e, NULL, 0, &full));
    CHECK(full > 8);
    EXPECT_OK(kvc_engine_last_error(e, small, sizeof small, &n));
    CHECK(n == 7 && small[7] == '\0');
    EXPECT_STATUS(kvc_engine_last_error(e, small, 0, &n), KVC_STATUS_BUFFER_TOO_SMALL);
    EXPECT_OK(kvc_engine_model_info(e, NULL, 0, &n));
    CHECK(n > 8);
    /* Draining into a zero-length buffer takes nothing. */
    EXPECT_OK(kvc_engine_drain_events(e, NULL, 0, &n));
    CHECK(n == 0);
    EXPECT_OK(kvc_engine_finish(e, a.request_id));
}

int main(void) {
    null_and_config();
    kvc_engine *e = make_engine();
    null_out_params(e);
    malformed_requests(e);
    oversized_uuid(e);
    stale_ids(e);
    capacity(e);
    buffers(e);
    still_serves(e);
    kvc_counters c = counters(e);
    CHECK(c.requests_live == 0);
    kvc_engine_free(e);
    return check_report("misuse");
}
