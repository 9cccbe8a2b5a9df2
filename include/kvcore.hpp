// SPDX-License-Identifier: Apache-2.0
//
// kvcore.hpp: a header-only C++17 RAII wrapper over the C API in kvcore.h.
// Hand-written (kvcore.h is generated). See docs/c-api.md.
//
// * kvc::Engine owns one kvc_engine: move-only, freed by its destructor.
// * Every failed call throws kvc::Error, which carries the kvc_status and the
//   engine's detailed last-error message. Nothing else is thrown except
//   std::bad_alloc.
// * Threading is the C API's: one thread at a time per engine; different
//   engines are independent. A call racing another on the same engine throws
//   kvc::Error with KVC_STATUS_ENGINE_BUSY.
// * const means safe to share: every const member function only reads its
//   object, so one const object may be used by any number of threads at once
//   (a const kvc::Request admitted into several engines from several
//   threads, say). Non-const member functions need the object to themselves,
//   as with the standard library's types.
// * kvc::Engine is not shareable, const or not: every call on it, its const
//   last_error() included, takes the engine's lock, and a second thread gets
//   KVC_STATUS_ENGINE_BUSY (last_error() then returns ""). Give each thread
//   its own engine, or serialise the calls yourself.
// * kvc::Request builds the C request description and owns its buffers, so
//   a Request can be reused and outlives nothing it points to. c_request()
//   builds the C description into a new kvc::CRequest each call and never
//   writes the Request. It fills every field of the C structs by name
//   (tests/ffi.rs checks that it does).
// * kvc::status_name gives a status's name as the header spells it.
#ifndef KVCORE_HPP
#define KVCORE_HPP

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "kvcore.h"

namespace kvc {

// A failed kvcore call: the status and the detailed message.
class Error : public std::runtime_error {
public:
    Error(kvc_status status, const std::string &message)
        : std::runtime_error(std::string(kvc_status_str(static_cast<uint32_t>(status))) +
                             (message.empty() ? std::string() : ": " + message)),
          status_(status) {}

    // The status code the C call returned.
    kvc_status status() const noexcept { return status_; }

private:
    kvc_status status_;
};

// The name of a status as kvcore.h spells it ("KVC_STATUS_OK"), for logs;
// nullptr for a code that is no status. The switch names every status of the
// header, so one added there and missing here is a -Wswitch warning (an error
// under -Werror), and tests/ffi.rs checks that this list, the header and
// docs/c-api.md name the same statuses.
inline const char *status_name(kvc_status status) noexcept {
    switch (status) {
        case KVC_STATUS_OK:
            return "KVC_STATUS_OK";
        case KVC_STATUS_NULL_ARGUMENT:
            return "KVC_STATUS_NULL_ARGUMENT";
        case KVC_STATUS_INVALID_ARGUMENT:
            return "KVC_STATUS_INVALID_ARGUMENT";
        case KVC_STATUS_UNKNOWN_ID:
            return "KVC_STATUS_UNKNOWN_ID";
        case KVC_STATUS_INVALID_CONFIG:
            return "KVC_STATUS_INVALID_CONFIG";
        case KVC_STATUS_INVALID_UTF8:
            return "KVC_STATUS_INVALID_UTF8";
        case KVC_STATUS_EMPTY_PROMPT:
            return "KVC_STATUS_EMPTY_PROMPT";
        case KVC_STATUS_INVALID_IMAGE_RUNS:
            return "KVC_STATUS_INVALID_IMAGE_RUNS";
        case KVC_STATUS_BAD_DIGEST_LENGTH:
            return "KVC_STATUS_BAD_DIGEST_LENGTH";
        case KVC_STATUS_UUID_COUNT_MISMATCH:
            return "KVC_STATUS_UUID_COUNT_MISMATCH";
        case KVC_STATUS_BAD_COMPUTED_COUNT:
            return "KVC_STATUS_BAD_COMPUTED_COUNT";
        case KVC_STATUS_BUFFER_TOO_SMALL:
            return "KVC_STATUS_BUFFER_TOO_SMALL";
        case KVC_STATUS_ENGINE_BUSY:
            return "KVC_STATUS_ENGINE_BUSY";
        case KVC_STATUS_LORA_NAME_REQUIRED:
            return "KVC_STATUS_LORA_NAME_REQUIRED";
        case KVC_STATUS_UNKNOWN_GROUP:
            return "KVC_STATUS_UNKNOWN_GROUP";
        case KVC_STATUS_OUT_OF_BLOCKS:
            return "KVC_STATUS_OUT_OF_BLOCKS";
        case KVC_STATUS_TOO_MANY_REQUESTS:
            return "KVC_STATUS_TOO_MANY_REQUESTS";
        case KVC_STATUS_TOO_MANY_ITEMS:
            return "KVC_STATUS_TOO_MANY_ITEMS";
        case KVC_STATUS_REQUEST_TOO_LONG:
            return "KVC_STATUS_REQUEST_TOO_LONG";
        case KVC_STATUS_TOO_MANY_ITEMS_PER_REQUEST:
            return "KVC_STATUS_TOO_MANY_ITEMS_PER_REQUEST";
        case KVC_STATUS_OUT_OF_MEMORY:
            return "KVC_STATUS_OUT_OF_MEMORY";
        case KVC_STATUS_GPU_UNAVAILABLE:
            return "KVC_STATUS_GPU_UNAVAILABLE";
        case KVC_STATUS_GPU_FAILED:
            return "KVC_STATUS_GPU_FAILED";
        case KVC_STATUS_KV_POOL_NOT_ATTACHED:
            return "KVC_STATUS_KV_POOL_NOT_ATTACHED";
        case KVC_STATUS_PUBLISHER_RUNNING:
            return "KVC_STATUS_PUBLISHER_RUNNING";
        case KVC_STATUS_PUBLISHER_START_FAILED:
            return "KVC_STATUS_PUBLISHER_START_FAILED";
        case KVC_STATUS_PUBLISHER_NOT_RUNNING:
            return "KVC_STATUS_PUBLISHER_NOT_RUNNING";
        case KVC_STATUS_CALL_LOG_REFUSED:
            return "KVC_STATUS_CALL_LOG_REFUSED";
        case KVC_STATUS_CALL_LOG_FAILED:
            return "KVC_STATUS_CALL_LOG_FAILED";
        case KVC_STATUS_CALL_LOG_NOT_OPEN:
            return "KVC_STATUS_CALL_LOG_NOT_OPEN";
        case KVC_STATUS_PANIC:
            return "KVC_STATUS_PANIC";
        case KVC_STATUS_POISONED:
            return "KVC_STATUS_POISONED";
        case KVC_STATUS_INTERNAL:
            return "KVC_STATUS_INTERNAL";
    }
    return nullptr;
}

// The default configuration (kvc_config_default); change fields, then build an Engine.
// For a hybrid model set `groups` and `groups_len` (see with_groups), which
// kvc_engine_new copies.
inline kvc_config default_config() {
    kvc_config c;
    kvc_status s = kvc_config_default(&c);
    if (s != KVC_STATUS_OK) {
        throw Error(s, "kvc_config_default");
    }
    return c;
}

// Points `config` at `groups` (group 0 full attention, the others sliding
// windows) and sets its page totals to the groups' sums. `groups` must
// outlive the Engine's construction only (kvc_engine_new copies it).
inline void with_groups(kvc_config &config, const std::vector<kvc_group_config> &groups) {
    config.groups = groups.data();
    config.groups_len = groups.size();
    config.blocks_device = 0;
    config.blocks_host = 0;
    for (const kvc_group_config &g : groups) {
        config.blocks_device += g.blocks_device;
        config.blocks_host += g.blocks_host;
    }
}

// The UUID list of a request: absent (std::nullopt) when it was given none;
// otherwise one entry per image item, each absent or a UUID.
using UuidList = std::optional<std::vector<std::optional<std::string>>>;

// The C description of a kvc::Request: the kvc_request and the arrays it
// points to, which it owns. Valid while the Request it was built from lives
// and is not modified. Move-only (a copy would point into the original).
class CRequest {
public:
    CRequest(const CRequest &) = delete;
    CRequest &operator=(const CRequest &) = delete;
    CRequest(CRequest &&) = default;
    CRequest &operator=(CRequest &&) = default;

    // The description to pass to kvc_engine_add_request.
    const kvc_request *get() const noexcept { return &request_; }
    const kvc_request &operator*() const noexcept { return request_; }
    const kvc_request *operator->() const noexcept { return &request_; }

private:
    friend class Request;
    CRequest() = default;

    std::vector<kvc_image_item> items_;
    std::vector<kvc_bytes> uuids_;
    kvc_request request_{};
};

// A request to admit. Owns copies of everything the C description points to.
class Request {
public:
    explicit Request(std::vector<uint32_t> tokens) : tokens_(std::move(tokens)) {}

    // Runs the request under a LoRA adapter.
    Request &lora(uint32_t id, std::optional<std::string> name = std::nullopt) {
        lora_id_ = id;
        lora_name_ = std::move(name);
        return *this;
    }

    // Sets the cache salt (requests with different salts never share blocks).
    Request &cache_salt(std::string salt) {
        cache_salt_ = std::move(salt);
        return *this;
    }

    // Adds an image by its content bytes (kvcore computes the digest).
    Request &image_bytes(std::vector<uint8_t> content, std::vector<kvc_token_run> runs,
                         std::optional<std::string> uuid = std::nullopt) {
        return add_image(KVC_IMAGE_CONTENT_BYTES, std::move(content), std::move(runs), std::move(uuid));
    }

    // Adds an image by a BLAKE3-256 digest computed by the caller.
    Request &image_digest(const std::array<uint8_t, 32> &digest, std::vector<kvc_token_run> runs,
                          std::optional<std::string> uuid = std::nullopt) {
        return add_image(KVC_IMAGE_CONTENT_DIGEST, std::vector<uint8_t>(digest.begin(), digest.end()),
                         std::move(runs), std::move(uuid));
    }

    // Adds an image whose bytes live on the GPU (a CUdeviceptr and a length):
    // kvcore hashes them on the device opened by Engine::gpu_open.
    Request &image_device(uint64_t device_ptr, size_t len, std::vector<kvc_token_run> runs,
                          std::optional<std::string> uuid = std::nullopt) {
        add_image(KVC_IMAGE_CONTENT_DEVICE, {}, std::move(runs), std::move(uuid));
        images_.back().device_ptr = device_ptr;
        images_.back().device_len = len;
        return *this;
    }

    // Sends a UUID list even if no image was given a UUID (all entries absent).
    Request &with_uuid_list() {
        uuid_list_ = true;
        return *this;
    }

    // Marks a warm-up request (allocates, never indexed, no events).
    Request &dummy(bool on = true) {
        dummy_ = on;
        return *this;
    }

    // The C description, built anew into the returned object (this Request
    // is only read, so threads may share a const Request). Valid while this
    // Request lives and is not modified.
    CRequest c_request() const {
        CRequest c;
        c.items_.reserve(images_.size());
        c.uuids_.reserve(images_.size());
        for (const Image &im : images_) {
            const bool device = im.kind == KVC_IMAGE_CONTENT_DEVICE;
            const uint8_t *content =
                device ? reinterpret_cast<const uint8_t *>(static_cast<uintptr_t>(im.device_ptr)) : im.content.data();
            // Every field by name: tests/ffi.rs checks that each field of the
            // C structs this wrapper fills is named here.
            kvc_image_item item{};
            item.content_kind = static_cast<uint32_t>(im.kind);
            item.content = content;
            item.content_len = device ? im.device_len : im.content.size();
            item.runs = im.runs.data();
            item.runs_len = im.runs.size();
            c.items_.push_back(item);
            c.uuids_.push_back(im.uuid ? bytes_of(*im.uuid) : absent());
        }
        kvc_request &r = c.request_;
        r.tokens = tokens_.data();
        r.tokens_len = tokens_.size();
        r.has_lora_id = lora_id_.has_value();
        r.lora_id = lora_id_.value_or(0);
        r.dummy = dummy_;
        r.lora_name = lora_name_ ? bytes_of(*lora_name_) : absent();
        r.cache_salt = cache_salt_ ? bytes_of(*cache_salt_) : absent();
        r.items = c.items_.data();
        r.items_len = c.items_.size();
        r.uuids = uuid_list_ ? c.uuids_.data() : nullptr;
        r.uuids_len = uuid_list_ ? c.uuids_.size() : 0;
        return c;
    }

private:
    struct Image {
        kvc_image_content kind;
        std::vector<uint8_t> content;
        std::vector<kvc_token_run> runs;
        std::optional<std::string> uuid;
        uint64_t device_ptr = 0;  // KVC_IMAGE_CONTENT_DEVICE only
        size_t device_len = 0;
    };

    static kvc_bytes bytes_of(const std::string &s) {
        // A non-NULL pointer even for an empty string: empty is not absent.
        kvc_bytes b{};
        b.ptr = reinterpret_cast<const uint8_t *>(s.data());
        b.len = s.size();
        return b;
    }

    // An absent string: NULL with length 0.
    static kvc_bytes absent() {
        kvc_bytes b{};
        b.ptr = nullptr;
        b.len = 0;
        return b;
    }

    Request &add_image(kvc_image_content kind, std::vector<uint8_t> content, std::vector<kvc_token_run> runs,
                       std::optional<std::string> uuid) {
        uuid_list_ = uuid_list_ || uuid.has_value();
        images_.push_back(Image{kind, std::move(content), std::move(runs), std::move(uuid), 0, 0});
        return *this;
    }

    std::vector<uint32_t> tokens_;
    std::optional<uint32_t> lora_id_;
    std::optional<std::string> lora_name_;
    std::optional<std::string> cache_salt_;
    std::vector<Image> images_;
    bool uuid_list_ = false;
    bool dummy_ = false;
};

// One engine. Move-only; the destructor frees it. Not shareable between
// threads, even as const (see the top of this file).
class Engine {
public:
    explicit Engine(const kvc_config &config) {
        kvc_status s = kvc_engine_new(&config, &engine_);
        if (s != KVC_STATUS_OK) {
            throw Error(s, "kvc_engine_new");
        }
    }
    Engine(const Engine &) = delete;
    Engine &operator=(const Engine &) = delete;
    Engine(Engine &&other) noexcept : engine_(std::exchange(other.engine_, nullptr)) {}
    Engine &operator=(Engine &&other) noexcept {
        if (this != &other) {
            kvc_engine_free(engine_);
            engine_ = std::exchange(other.engine_, nullptr);
        }
        return *this;
    }
    ~Engine() { kvc_engine_free(engine_); }

    // The C handle (still owned by this object), for calls the wrapper lacks.
    kvc_engine *get() const noexcept { return engine_; }

    // The detailed message of the last failed call ("" after a success).
    std::string last_error() const {
        size_t n = 0;
        if (engine_ == nullptr || kvc_engine_last_error(engine_, nullptr, 0, &n) != KVC_STATUS_OK) {
            return std::string();
        }
        std::string msg(n + 1, '\0');
        if (kvc_engine_last_error(engine_, &msg[0], msg.size(), &n) != KVC_STATUS_OK) {
            return std::string();
        }
        msg.resize(n);
        return msg;
    }

    kvc_admission add(const Request &request) {
        CRequest r = request.c_request();
        kvc_admission a{};
        check(kvc_engine_add_request(engine_, r.get(), &a));
        return a;
    }

    UuidList uuids(uint64_t request_id) {
        kvc_uuid_list shape{};
        check(kvc_engine_request_uuids(engine_, request_id, nullptr, 0, nullptr, 0, &shape));
        if (shape.present == 0) {
            return std::nullopt;
        }
        std::vector<kvc_uuid_entry> entries(shape.count);
        std::vector<uint8_t> bytes(static_cast<size_t>(shape.bytes));
        // Non-NULL buffers even when empty, so this is a copy, not a size query.
        kvc_uuid_entry entry_slot{};
        uint8_t byte_slot = 0;
        check(kvc_engine_request_uuids(engine_, request_id, entries.empty() ? &entry_slot : entries.data(),
                                       entries.size(), bytes.empty() ? &byte_slot : bytes.data(), bytes.size(),
                                       &shape));
        std::vector<std::optional<std::string>> out;
        out.reserve(entries.size());
        for (const kvc_uuid_entry &e : entries) {
            if (e.present != 0) {
                out.emplace_back(std::string(reinterpret_cast<const char *>(bytes.data()) + e.offset, e.len));
            } else {
                out.emplace_back(std::nullopt);
            }
        }
        return out;
    }

    kvc_request_info info(uint64_t request_id) {
        kvc_request_info i{};
        check(kvc_engine_request_info(engine_, request_id, &i));
        return i;
    }

    std::vector<uint32_t> block_table(uint64_t request_id) {
        size_t n = 0;
        check(kvc_engine_block_table(engine_, request_id, nullptr, 0, &n));
        std::vector<uint32_t> pages(n);
        if (n != 0) {
            check(kvc_engine_block_table(engine_, request_id, pages.data(), pages.size(), &n));
        }
        return pages;
    }

    // The request's block table in KV cache group `group` (group 0 is
    // block_table's): a sliding window names its null page, page 0, for the
    // blocks that fell out of it.
    std::vector<uint32_t> block_table(uint64_t request_id, uint32_t group) {
        size_t n = 0;
        check(kvc_engine_block_table_group(engine_, request_id, group, nullptr, 0, &n));
        std::vector<uint32_t> pages(n);
        if (n != 0) {
            check(kvc_engine_block_table_group(engine_, request_id, group, pages.data(), pages.size(), &n));
        }
        return pages;
    }

    // What KV cache group `group` holds now.
    kvc_group_usage group_usage(uint32_t group) {
        kvc_group_usage u{};
        check(kvc_engine_group_usage(engine_, group, &u));
        return u;
    }

    void grow(uint64_t request_id, const std::vector<uint32_t> &tokens) {
        check(kvc_engine_grow(engine_, request_id, tokens.data(), tokens.size()));
    }

    void commit(uint64_t request_id, uint64_t tokens_computed) {
        check(kvc_engine_commit(engine_, request_id, tokens_computed));
    }

    void finish(uint64_t request_id) { check(kvc_engine_finish(engine_, request_id)); }

    void cancel(uint64_t request_id) { check(kvc_engine_cancel(engine_, request_id)); }

    // Closes the step; returns the block copies to perform before the next forward pass.
    std::vector<kvc_block_copy> step() {
        size_t n = 0;
        check(kvc_engine_step(engine_, &n));
        std::vector<kvc_block_copy> copies(n);
        if (n != 0) {
            check(kvc_engine_block_copies(engine_, copies.data(), copies.size(), &n));
        }
        return copies;
    }

    // GPU path (docs/c-api.md, "The GPU path"). Opens CUDA device `ordinal`
    // and compiles kvcore's kernels; throws with KVC_STATUS_GPU_UNAVAILABLE
    // where there is no driver or device.
    void gpu_open(uint32_t ordinal = 0) { check(kvc_engine_gpu_open(engine_, ordinal)); }

    // Attaches the paged KV pool: one device address per region, `planes`
    // planes per page, `block_bytes` per page and region, `blocks` pages
    // (the engine's device blocks). Before the first request.
    void attach_kv_pool(const std::vector<uint64_t>& region_bases, uint32_t planes, uint64_t block_bytes,
                        uint32_t blocks) {
        kvc_kv_pool pool{};
        pool.region_bases = region_bases.data();
        pool.regions = static_cast<uint32_t>(region_bases.size());
        pool.planes = planes;
        pool.block_bytes = block_bytes;
        pool.blocks = blocks;
        pool.reserved = 0;
        check(kvc_engine_attach_kv_pool(engine_, &pool));
    }

    // Performs the last step's block copies on the attached pool; returns
    // the number of waves run (0 when already done).
    size_t copy_blocks() {
        size_t launches = 0;
        check(kvc_engine_copy_blocks(engine_, &launches));
        return launches;
    }

    // BLAKE3-256 of device-resident byte strings, in order.
    std::vector<std::array<uint8_t, 32>> digest_device(const std::vector<kvc_device_bytes>& items) {
        std::vector<std::array<uint8_t, 32>> out(items.size());
        check(kvc_engine_digest_device(engine_, items.data(), items.size(),
                                       out.empty() ? nullptr : out.front().data(), 32 * out.size()));
        return out;
    }

    // Takes every drainable event record.
    std::vector<kvc_event> drain_events() {
        size_t n = 0;
        check(kvc_engine_events_pending(engine_, &n));
        std::vector<kvc_event> events(n);
        if (n != 0) {
            check(kvc_engine_drain_events(engine_, events.data(), events.size(), &n));
            events.resize(n);
        }
        return events;
    }

    size_t evict(size_t n) {
        size_t evicted = 0;
        check(kvc_engine_evict(engine_, n, &evicted));
        return evicted;
    }

    void clear() { check(kvc_engine_clear(engine_)); }

    kvc_counters counters() {
        kvc_counters c{};
        check(kvc_engine_counters(engine_, &c));
        return c;
    }

    // The capability document (JSON).
    std::string model_info() {
        size_t n = 0;
        check(kvc_engine_model_info(engine_, nullptr, 0, &n));
        std::string doc(n + 1, '\0');
        check(kvc_engine_model_info(engine_, &doc[0], doc.size(), &n));
        doc.resize(n);
        return doc;
    }

    // Takes every drainable batch as wire payloads: each a 4-byte little-endian
    // length and the msgpack payload (see kvc_engine_drain_events_wire).
    std::vector<uint8_t> drain_events_wire() {
        size_t n = 0;
        check(kvc_engine_drain_events_wire(engine_, nullptr, 0, &n));
        std::vector<uint8_t> bytes(n);
        if (n != 0) {
            check(kvc_engine_drain_events_wire(engine_, bytes.data(), bytes.size(), &n));
            bytes.resize(n);
        }
        return bytes;
    }

    // Starts the ZMQ publisher (kvc_publisher_config_default gives the defaults).
    void start_publisher(const kvc_publisher_config &config) { check(kvc_engine_publisher_start(engine_, &config)); }

    // Stops the publisher, sending what it holds first (up to one second).
    void stop_publisher() { check(kvc_engine_publisher_stop(engine_)); }

    // Records every call from now on into the file at `path` (a fresh engine
    // only); `kvcore replay-calls FILE` replays it.
    void open_call_log(const std::string &path) { check(kvc_engine_call_log_open(engine_, path.c_str())); }

    // Flushes and closes the call log; returns the calls it holds.
    uint64_t close_call_log() {
        uint64_t calls = 0;
        check(kvc_engine_call_log_close(engine_, &calls));
        return calls;
    }

    // The publisher's bound endpoint, a `*` port resolved.
    std::string publisher_endpoint() {
        size_t n = 0;
        check(kvc_engine_publisher_endpoint(engine_, nullptr, 0, &n));
        std::string endpoint(n + 1, '\0');
        check(kvc_engine_publisher_endpoint(engine_, &endpoint[0], endpoint.size(), &n));
        endpoint.resize(n);
        return endpoint;
    }

    kvc_publisher_stats publisher_stats() {
        kvc_publisher_stats s{};
        check(kvc_engine_publisher_stats(engine_, &s));
        return s;
    }

private:
    void check(kvc_status s) const {
        if (s != KVC_STATUS_OK) {
            throw Error(s, last_error());
        }
    }

    kvc_engine *engine_ = nullptr;
};

}  // namespace kvc

#endif  // KVCORE_HPP
