/* The GPU path as C sees it, on any machine: kvc_engine_gpu_open either
 * opens device 0 or says GPU_UNAVAILABLE with a message; without an open
 * GPU every GPU call is refused with its documented status and changes
 * nothing (a device-resident image item admits no request), and the engine
 * keeps serving. tests/gpu.rs drives the same functions on a real device
 * with a pool it allocates. */
#include "check.h"

int main(void) {
    kvc_config c;
    EXPECT_OK(kvc_config_default(&c));
    c.block_size_tokens = 4;
    c.blocks_device = 8;
    c.blocks_host = 8;
    kvc_engine *e = NULL;
    EXPECT_OK(kvc_engine_new(&c, &e));

    /* NULL handles and arguments. */
    size_t launches = 7;
    EXPECT_STATUS(kvc_engine_gpu_open(NULL, 0), KVC_STATUS_NULL_ARGUMENT);
    EXPECT_STATUS(kvc_engine_copy_blocks(e, NULL), KVC_STATUS_NULL_ARGUMENT);
    EXPECT_STATUS(kvc_engine_attach_kv_pool(e, NULL), KVC_STATUS_NULL_ARGUMENT);
    CHECK(strcmp(kvc_status_str(KVC_STATUS_GPU_UNAVAILABLE), "unknown status code") != 0);
    CHECK(strcmp(kvc_status_str(KVC_STATUS_KV_POOL_NOT_ATTACHED), "unknown status code") != 0);

    /* Nothing is open yet. */
    kvc_device_bytes item = {0x7f0000001000ull, 64};
    uint8_t digest[32];
    memset(digest, 0xAB, sizeof digest);
    EXPECT_STATUS(kvc_engine_digest_device(e, &item, 1, digest, sizeof digest), KVC_STATUS_GPU_UNAVAILABLE);
    CHECK(strstr(last_error(e), "kvc_engine_gpu_open") != NULL);
    CHECK(digest[0] == 0xAB && digest[31] == 0xAB);
    EXPECT_STATUS(kvc_engine_copy_blocks(e, &launches), KVC_STATUS_KV_POOL_NOT_ATTACHED);
    CHECK(launches == 7);
    uint64_t bases[2] = {0x7f0000000000ull, 0x7f0000100000ull};
    kvc_kv_pool pool = {bases, 2, 2, 256, 8, 0};
    EXPECT_STATUS(kvc_engine_attach_kv_pool(e, &pool), KVC_STATUS_GPU_UNAVAILABLE);

    uint32_t tokens[8] = {1, 2, 3, 4, 151655, 151655, 7, 8};
    kvc_token_run run = {4, 2};
    kvc_image_item image;
    memset(&image, 0, sizeof image);
    image.content_kind = KVC_IMAGE_CONTENT_DEVICE;
    image.content = (const uint8_t *)(uintptr_t)0x7f0000001000ull;
    image.content_len = 64;
    image.runs = &run;
    image.runs_len = 1;
    kvc_request r = text_request(tokens, 8);
    r.items = &image;
    r.items_len = 1;
    kvc_admission a;
    EXPECT_STATUS(kvc_engine_add_request(e, &r, &a), KVC_STATUS_GPU_UNAVAILABLE);
    kvc_counters k;
    EXPECT_OK(kvc_engine_counters(e, &k));
    /* Refused and counted, like every refused admission. */
    CHECK(k.requests_live == 0 && k.requests_rejected == 1);

    /* The same image from host memory is admitted. */
    uint8_t pixels[64];
    memset(pixels, 3, sizeof pixels);
    image.content_kind = KVC_IMAGE_CONTENT_BYTES;
    image.content = pixels;
    EXPECT_OK(kvc_engine_add_request(e, &r, &a));

    /* Opening: either it works (a machine with a GPU) or it says why. */
    kvc_status s = kvc_engine_gpu_open(e, 0);
    if (s == KVC_STATUS_OK) {
        EXPECT_STATUS(kvc_engine_gpu_open(e, 1), KVC_STATUS_INVALID_ARGUMENT);
        /* Requests exist: the pool comes too late (checked before the addresses). */
        EXPECT_STATUS(kvc_engine_attach_kv_pool(e, &pool), KVC_STATUS_INVALID_ARGUMENT);
        CHECK(strstr(last_error(e), "before the first request") != NULL);
    } else {
        EXPECT_STATUS(s, KVC_STATUS_GPU_UNAVAILABLE);
        CHECK(strlen(last_error(e)) > 0);
    }
    kvc_engine_free(e);
    return check_report("gpu");
}
