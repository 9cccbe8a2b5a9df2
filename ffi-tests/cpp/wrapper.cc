// The C++ wrapper (kvcore.hpp): a serving loop through kvc::Engine, failures
// as kvc::Error with the right status and a message, UUID lists as
// optionals, move-only ownership (ASan would flag a double free), several
// engines held in one container, the publisher and wire drain, the call
// log, status names for every status the library describes, and one const
// Request shared by several threads, each with its own engine (.ci/run also
// runs this program under ThreadSanitizer, which reports any write to the
// shared one).
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "kvcore.hpp"

static int failures = 0;

#define CHECK(cond)                                                                \
    do {                                                                           \
        if (!(cond)) {                                                             \
            std::fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
            failures++;                                                            \
        }                                                                          \
    } while (0)

// Runs `f`, expecting a kvc::Error with `want` and a non-empty message.
template <typename F>
static void expect_error(F f, kvc_status want, int line) {
    try {
        f();
        std::fprintf(stderr, "line %d: no exception, expected status %u\n", line, static_cast<unsigned>(want));
        failures++;
    } catch (const kvc::Error &e) {
        if (e.status() != want || std::strlen(e.what()) == 0) {
            std::fprintf(stderr, "line %d: status %u (%s), expected %u\n", line, static_cast<unsigned>(e.status()),
                         e.what(), static_cast<unsigned>(want));
            failures++;
        }
    }
}

static kvc_config config() {
    kvc_config c = kvc::default_config();
    c.block_size_tokens = 4;
    c.blocks_device = 32;
    c.model_image_capable = true;
    c.model_type = "qwen3_vl";
    c.kv_events_endpoint = "tcp://127.0.0.1:5557";
    return c;
}

static void serving_loop() {
    kvc::Engine engine(config());
    const std::vector<uint32_t> prompt = {1, 2, 3, 4, 151655, 151655, 151655, 151655, 9, 10, 11, 12};
    kvc::Request request(prompt);
    request.image_bytes({'p', 'i', 'x'}, {{4, 4}}, std::string("cat.png"));

    kvc_admission a = engine.add(request);
    CHECK(a.tokens_cached == 0);
    CHECK(engine.block_table(a.request_id).size() == 3);
    engine.commit(a.request_id, 12);
    CHECK(engine.step().empty());
    std::vector<kvc_event> events = engine.drain_events();
    CHECK(events.size() == 3);
    CHECK(!events.empty() && events[1].image_run_count == 1 && events[1].kind == KVC_EVENT_KIND_BLOCK_STORED);
    engine.grow(a.request_id, {13, 14});
    CHECK(engine.info(a.request_id).tokens == 14);
    engine.finish(a.request_id);

    // Reuse, and the UUID list read back as a copy.
    kvc_admission b = engine.add(request);
    CHECK(b.tokens_cached == 8);
    kvc::UuidList uuids = engine.uuids(b.request_id);
    CHECK(uuids.has_value() && uuids->size() == 1 && (*uuids)[0] == std::optional<std::string>("cat.png"));

    // A request without a UUID list, and one whose list has only an absent entry.
    std::array<uint8_t, 32> digest{};
    digest[0] = 1;
    kvc::Request no_list(prompt);
    no_list.image_digest(digest, {{4, 4}});
    kvc_admission c = engine.add(no_list);
    CHECK(!engine.uuids(c.request_id).has_value());
    kvc::Request absent_entry(prompt);
    absent_entry.image_digest(digest, {{4, 4}}).with_uuid_list();
    kvc_admission d = engine.add(absent_entry);
    kvc::UuidList only_absent = engine.uuids(d.request_id);
    CHECK(only_absent.has_value() && only_absent->size() == 1 && !(*only_absent)[0].has_value());

    // LoRA and salt.
    kvc::Request lora(prompt);
    lora.lora(5, std::string("adapter")).cache_salt("salt");
    kvc_admission l = engine.add(lora);
    CHECK(l.tokens_cached == 0);

    for (uint64_t id : {b.request_id, c.request_id, d.request_id, l.request_id}) {
        engine.cancel(id);
    }
    kvc_counters counters = engine.counters();
    CHECK(counters.requests_admitted == 5 && counters.requests_live == 0);
    // The image chain's three prompt blocks are cached (the fourth, grown
    // block was never committed); the other requests committed nothing.
    CHECK(engine.evict(100) == 3);
    engine.step();
    CHECK(engine.drain_events().size() == 3);
    CHECK(engine.model_info().find("\"image_routing_version\":1") != std::string::npos);
}

static void errors() {
    kvc::Engine engine(config());
    const std::vector<uint32_t> prompt = {1, 2, 3, 4, 5};
    kvc_admission a = engine.add(kvc::Request(prompt));
    engine.commit(a.request_id, 5);
    engine.finish(a.request_id);
    // Double finish: a stale id.
    expect_error([&] { engine.finish(a.request_id); }, KVC_STATUS_UNKNOWN_ID, __LINE__);
    expect_error([&] { engine.uuids(a.request_id); }, KVC_STATUS_UNKNOWN_ID, __LINE__);
    expect_error([&] { engine.add(kvc::Request({})); }, KVC_STATUS_EMPTY_PROMPT, __LINE__);
    // Invalid UTF-8 in a UUID.
    kvc::Request bad(prompt);
    bad.image_bytes({1}, {{0, 2}}, std::string("\xff\xfe"));
    expect_error([&] { engine.add(bad); }, KVC_STATUS_INVALID_UTF8, __LINE__);
    CHECK(engine.last_error().find("UUID") != std::string::npos);
    // Bad config.
    kvc_config c = config();
    c.block_size_tokens = 5000;
    expect_error([&] { kvc::Engine e(c); }, KVC_STATUS_INVALID_CONFIG, __LINE__);
    // Nothing was lost: the engine still admits, and only the two engine
    // refusals were counted.
    kvc_admission b = engine.add(kvc::Request(prompt));
    CHECK(b.tokens_cached == 4);
    CHECK(engine.counters().requests_rejected == 2);
    engine.finish(b.request_id);
}

static void ownership() {
    kvc::Engine a(config());
    kvc::Engine b(std::move(a));
    CHECK(a.get() == nullptr && b.get() != nullptr);
    // A moved-from engine refuses calls with NULL_ARGUMENT instead of crashing.
    expect_error([&] { a.counters(); }, KVC_STATUS_NULL_ARGUMENT, __LINE__);
    kvc::Engine c(config());
    c = std::move(b);  // frees c's first engine
    CHECK(b.get() == nullptr && c.get() != nullptr);

    // Several engines in one container; each keeps its own cache.
    std::vector<kvc::Engine> engines;
    for (int i = 0; i < 4; i++) {
        engines.emplace_back(config());
    }
    const std::vector<uint32_t> prompt = {7, 7, 7, 7, 7};
    kvc_admission first = engines[0].add(kvc::Request(prompt));
    engines[0].commit(first.request_id, 5);
    engines[0].finish(first.request_id);
    CHECK(engines[0].add(kvc::Request(prompt)).tokens_cached == 4);
    for (size_t i = 1; i < engines.size(); i++) {
        CHECK(engines[i].add(kvc::Request(prompt)).tokens_cached == 0);
    }
}

static void publisher() {
    kvc::Engine engine(config());
    kvc_publisher_config pc;
    kvc_publisher_config_default(&pc);
    pc.endpoint = "tcp://127.0.0.1:*";
    engine.start_publisher(pc);
    CHECK(engine.publisher_endpoint().rfind("tcp://127.0.0.1:", 0) == 0);
    expect_error([&] { engine.start_publisher(pc); }, KVC_STATUS_PUBLISHER_RUNNING, __LINE__);
    const std::vector<uint32_t> prompt = {1, 2, 3, 4, 5};
    kvc_admission a = engine.add(kvc::Request(prompt));
    engine.commit(a.request_id, 5);
    engine.finish(a.request_id);
    engine.step();
    CHECK(engine.publisher_stats().batches_reserved == 1);
    std::vector<uint8_t> wire = engine.drain_events_wire();
    CHECK(wire.size() > 4 && wire[4] == 0x93);
    CHECK(engine.drain_events_wire().empty());
    engine.stop_publisher();
    expect_error([&] { engine.stop_publisher(); }, KVC_STATUS_PUBLISHER_NOT_RUNNING, __LINE__);
}

// The call log: opened on a fresh engine, refused a second time, closed with
// the number of calls it holds (one admission, one commit, one finish, one
// step, and the drain by which the C step moves its closed batch onto the
// handle), refused once closed.
static void call_log() {
    const char *dir = std::getenv("TMPDIR");
    const std::string path = std::string(dir ? dir : "/tmp") + "/kvcore-wrapper-calls.bin";
    kvc::Engine engine(config());
    engine.open_call_log(path);
    expect_error([&] { engine.open_call_log(path); }, KVC_STATUS_CALL_LOG_REFUSED, __LINE__);
    const std::vector<uint32_t> prompt = {1, 2, 3, 4, 5};
    kvc_admission a = engine.add(kvc::Request(prompt));
    engine.commit(a.request_id, 5);
    engine.finish(a.request_id);
    engine.step();
    CHECK(engine.close_call_log() == 5);
    expect_error([&] { engine.close_call_log(); }, KVC_STATUS_CALL_LOG_NOT_OPEN, __LINE__);
    std::remove(path.c_str());
}

// The GPU methods: without an open GPU they throw with their statuses and
// the engine goes on serving; gpu_open either opens device 0 or throws
// GPU_UNAVAILABLE (tests/gpu.rs covers an open device with a real pool).
static void gpu() {
    kvc_config c;
    kvc_config_default(&c);
    c.block_size_tokens = 4;
    c.blocks_device = 8;
    kvc::Engine engine(c);
    expect_error([&] { engine.copy_blocks(); }, KVC_STATUS_KV_POOL_NOT_ATTACHED, __LINE__);
    expect_error([&] { engine.digest_device({kvc_device_bytes{0x7f0000001000ull, 64}}); },
                 KVC_STATUS_GPU_UNAVAILABLE, __LINE__);
    CHECK(engine.digest_device({}).empty());
    expect_error([&] { engine.attach_kv_pool({0x7f0000000000ull}, 1, 64, 8); }, KVC_STATUS_GPU_UNAVAILABLE,
                 __LINE__);
    const std::vector<uint32_t> prompt = {1, 2, 151655, 151655, 5};
    kvc::Request device_image(prompt);
    device_image.image_device(0x7f0000001000ull, 64, {kvc_token_run{2, 2}}, std::string("img"));
    expect_error([&] { engine.add(device_image); }, KVC_STATUS_GPU_UNAVAILABLE, __LINE__);
    CHECK(engine.counters().requests_live == 0);
    kvc::Request host_image(prompt);
    host_image.image_bytes(std::vector<uint8_t>(64, 3), {kvc_token_run{2, 2}}, std::string("img"));
    engine.add(host_image);
    CHECK(engine.counters().requests_live == 1);
    try {
        engine.gpu_open(0);
    } catch (const kvc::Error &e) {
        CHECK(e.status() == KVC_STATUS_GPU_UNAVAILABLE);
    }
}

// kvc::status_name names exactly the codes the linked library describes
// (every code up to 999 is asked), each by a name of the header's form; a
// status the library has and the wrapper lacks fails here at run time, as
// one the header has and the wrapper lacks fails its compilation.
static void status_names() {
    int named = 0;
    for (uint32_t code = 0; code < 1000; code++) {
        const char *name = kvc::status_name(static_cast<kvc_status>(code));
        const bool described = std::strcmp(kvc_status_str(code), "unknown status code") != 0;
        CHECK((name != nullptr) == described);
        if (name != nullptr) {
            named++;
            CHECK(std::strncmp(name, "KVC_STATUS_", 11) == 0);
        }
    }
    CHECK(named > 0);
    CHECK(std::strcmp(kvc::status_name(KVC_STATUS_GPU_FAILED), "KVC_STATUS_GPU_FAILED") == 0);
    CHECK(kvc::status_name(static_cast<kvc_status>(12345)) == nullptr);
}

// const is safe to share: four threads admit the same const Request, with
// three images and a UUID list, into engines of their own, over and over.
// Each admission must carry exactly the request's tokens and UUIDs, and
// the second and later ones must find its prefix cached. (Request::c_request
// used to rebuild buffers inside the const object: the threads overwrote
// each other's C descriptions mid-call.)
static void shared_const_request() {
    std::vector<uint32_t> prompt(64);
    for (uint32_t i = 0; i < prompt.size(); i++) {
        prompt[i] = 1000 + i;
    }
    kvc::Request built(prompt);
    built.image_bytes({'a', 'b', 'c'}, {{4, 4}}, std::string("sku-a"))
        .image_bytes({'d', 'e'}, {{16, 8}}, std::string("sku-b"))
        .image_digest(std::array<uint8_t, 32>{7}, {{40, 4}, {48, 4}});
    const kvc::Request &shared = built;
    const kvc::UuidList want = std::vector<std::optional<std::string>>{
        std::string("sku-a"), std::string("sku-b"), std::nullopt};
    std::atomic<int> thread_failures{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; t++) {
        threads.emplace_back([&shared, &want, &thread_failures, &prompt] {
            kvc_config c = kvc::default_config();
            c.block_size_tokens = 4;
            c.blocks_device = 64;
            kvc::Engine engine(c);
            for (int i = 0; i < 300; i++) {
                kvc_admission a = engine.add(shared);
                const kvc_request_info info = engine.info(a.request_id);
                const bool ok = info.tokens == prompt.size() && engine.uuids(a.request_id) == want &&
                                (i == 0 || a.tokens_cached == prompt.size() - 4);
                if (!ok) {
                    thread_failures++;
                }
                engine.commit(a.request_id, prompt.size());
                engine.finish(a.request_id);
                engine.step();
            }
        });
    }
    for (std::thread &t : threads) {
        t.join();
    }
    CHECK(thread_failures.load() == 0);
    // A CRequest owns its arrays: two built from one Request are equal and
    // stay valid after a move.
    kvc::CRequest first = shared.c_request();
    kvc::CRequest moved = shared.c_request();
    kvc::CRequest second = std::move(moved);
    CHECK(first->items_len == 3 && second->items_len == 3 && first->items != second->items);
    CHECK(second->items[1].content_len == 2 && second->uuids[0].len == 5);
}

// A two-group engine through the wrapper: each group's table, the window's
// null page once its blocks fall out of it, what each group holds, and an
// unknown group thrown as kvc::Error.
static void groups() {
    kvc_config c = kvc::default_config();
    c.block_size_tokens = 4;
    const std::vector<kvc_group_config> list = {
        {KVC_GROUP_KIND_FULL_ATTENTION, 0, 12, 0},
        {KVC_GROUP_KIND_SLIDING_WINDOW, 4, 6, 0},
    };
    kvc::with_groups(c, list);
    kvc::Engine engine(c);
    kvc::Request request(std::vector<uint32_t>{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13});
    kvc_admission a = engine.add(request);
    CHECK(engine.block_table(a.request_id, 0) == engine.block_table(a.request_id));
    engine.commit(a.request_id, 13);
    const std::vector<uint32_t> window = engine.block_table(a.request_id, 1);
    // The next token (position 13) reads tokens 10..13: blocks 2 and 3.
    CHECK(window.size() == 4 && window[0] == 0 && window[1] == 0 && window[2] != 0 && window[3] != 0);
    CHECK(engine.group_usage(0).blocks_referenced == 4 && engine.group_usage(1).blocks_referenced == 2);
    CHECK(engine.group_usage(1).pages_device == 5);
    expect_error([&] { engine.block_table(a.request_id, 2); }, KVC_STATUS_UNKNOWN_GROUP, __LINE__);
}

int main() {
    shared_const_request();
    groups();
    serving_loop();
    status_names();
    gpu();
    errors();
    ownership();
    publisher();
    call_log();
    if (failures != 0) {
        std::fprintf(stderr, "wrapper: %d check(s) failed\n", failures);
        return 1;
    }
    std::printf("wrapper: all checks passed\n");
    return 0;
}
