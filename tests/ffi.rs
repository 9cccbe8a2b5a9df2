//! The C ABI as C and C++ see it: the generated header is current, its version
//! macros match Cargo.toml, and the programs in ffi-tests/ compile warning-free
//! against include/kvcore.h(.hpp), link the static library and pass.
//!
//! The programs are built with the system `cc` and `c++`. With
//! `KVC_FFI_SANITIZE=address,undefined` (what .ci/run sets) they are built with
//! those sanitizers, and the test checks with `nm` that the sanitizer runtime
//! really linked; `.ci/run` also builds the C++ programs with
//! `KVC_FFI_SANITIZE=thread` (ThreadSanitizer: the wrapper's threads share
//! const objects). With `KVC_FFI_VALGRIND=1` they run under valgrind instead.

use std::path::{Path, PathBuf};
use std::process::Command;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// The header as cbindgen generates it now from src/ffi.
fn generate_header() -> String {
    let config = cbindgen::Config::from_file(Path::new(ROOT).join("cbindgen.toml")).expect("cbindgen.toml parses");
    let mut out = Vec::new();
    cbindgen::Builder::new()
        .with_config(config)
        .with_src(Path::new(ROOT).join("src/ffi/mod.rs"))
        .generate()
        .expect("cbindgen generates the header")
        .write(&mut out);
    String::from_utf8(out).expect("the header is UTF-8")
}

/// The checked-in header equals what cbindgen generates from src/ffi now;
/// method: regenerate in memory and compare (KVC_BLESS=1 writes it instead).
#[test]
fn header_is_current() {
    let generated = generate_header();
    let path = Path::new(ROOT).join("include/kvcore.h");
    if std::env::var_os("KVC_BLESS").is_some() {
        std::fs::write(&path, &generated).expect("write include/kvcore.h");
        return;
    }
    let checked_in = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        checked_in == generated,
        "include/kvcore.h is out of date with src/ffi; regenerate with `KVC_BLESS=1 cargo test --test ffi header_is_current`"
    );
}

/// Every function the header declares carries its documentation there: a
/// comment block right above it with a `# Safety` section; method: scan the
/// checked-in header line by line.
#[test]
fn every_export_is_documented_in_the_header() {
    let header = std::fs::read_to_string(Path::new(ROOT).join("include/kvcore.h")).expect("read kvcore.h");
    let lines: Vec<&str> = header.lines().collect();
    let mut functions = 0;
    for (i, line) in lines.iter().enumerate() {
        let is_decl =
            !line.starts_with(' ') && !line.starts_with('#') && line.contains(" kvc_") && line.ends_with(");");
        if !is_decl {
            continue;
        }
        functions += 1;
        assert!(i > 0 && lines[i - 1].trim() == "*/", "{line}: no comment right above");
        let start = lines[..i].iter().rposition(|l| l.trim_start().starts_with("/**")).expect("comment start");
        let doc = lines[start..i].join("\n");
        assert!(doc.contains("# Safety"), "{line}: no `# Safety` section in its comment");
    }
    assert!(functions >= 20, "only {functions} functions found in kvcore.h");
}

/// Reads a file of the repository.
fn read(path: &str) -> String {
    std::fs::read_to_string(Path::new(ROOT).join(path)).unwrap_or_else(|e| panic!("read {path}: {e}"))
}

/// The text of `text` from the line that starts with `start` to the next line
/// that starts with `end`.
fn section<'a>(text: &'a str, start: &str, end: &str) -> &'a str {
    let from = text.find(start).unwrap_or_else(|| panic!("no {start:?}"));
    let rest = &text[from..];
    let to = rest[start.len()..].find(end).map_or(rest.len(), |i| i + start.len());
    &rest[..to]
}

/// The `KVC_STATUS_*` enumerators of the checked-in header with their codes.
fn header_statuses() -> std::collections::BTreeMap<u32, String> {
    let header = read("include/kvcore.h");
    let body = section(&header, "enum kvc_status\n", "typedef enum kvc_status kvc_status;");
    body.lines()
        .filter_map(|l| l.trim().strip_suffix(',')?.split_once(" = "))
        .map(|(name, code)| (code.parse().expect("numeric status code"), name.to_owned()))
        .collect()
}

/// The one status table covers everything, and everyone lists the same set:
/// each status of `kvc_status::ALL` round-trips through `kvc_status_str` (its
/// own text, found again from the code), codes are unique, and the header's
/// enumerators, the status table of docs/c-api.md and `kvc::status_name` in
/// kvcore.hpp name exactly those codes; method: parse the three texts.
#[test]
fn every_status_is_listed_once_everywhere() {
    use kvcore::ffi::{kvc_status, kvc_status_str};
    let mut texts = std::collections::HashSet::new();
    let mut codes = std::collections::BTreeSet::new();
    for status in kvc_status::ALL {
        let code = *status as u32;
        assert!(codes.insert(code), "code {code} appears once");
        // SAFETY: any code is accepted; the result is a static C string.
        let text = unsafe { std::ffi::CStr::from_ptr(kvc_status_str(code)) };
        assert_eq!(text, status.message(), "kvc_status_str({code})");
        assert_ne!(text, c"unknown status code", "code {code} is described");
        assert!(texts.insert(text), "code {code} has its own text");
        assert_eq!(kvc_status::from_code(code), Some(*status), "code {code} comes back");
    }
    // SAFETY: as above.
    assert_eq!(unsafe { std::ffi::CStr::from_ptr(kvc_status_str(12345)) }, c"unknown status code");

    let header = header_statuses();
    assert_eq!(header.keys().copied().collect::<std::collections::BTreeSet<_>>(), codes, "kvcore.h");

    let docs = read("docs/c-api.md");
    let table = section(&docs, "## Statuses", "\n## ");
    let documented: std::collections::BTreeMap<u32, String> = table
        .lines()
        .filter_map(|l| {
            let mut cells = l.split('|').map(str::trim).skip(1);
            let code = cells.next()?.parse().ok()?;
            Some((code, cells.next()?.trim_matches('`').to_owned()))
        })
        .collect();
    assert_eq!(documented, header, "the status table of docs/c-api.md");

    let hpp = read("include/kvcore.hpp");
    let names = section(&hpp, "inline const char *status_name(", "\n}");
    let cases: Vec<&str> = names.lines().filter_map(|l| l.trim().strip_prefix("case ")?.strip_suffix(':')).collect();
    for name in &cases {
        assert!(names.contains(&format!("return \"{name}\";")), "kvc::status_name({name}) returns its name");
    }
    let mut in_header: Vec<&str> = header.values().map(String::as_str).collect();
    let mut in_hpp = cases.clone();
    in_header.sort_unstable();
    in_hpp.sort_unstable();
    assert_eq!(in_hpp, in_header, "kvc::status_name in kvcore.hpp");
}

/// The fields of one struct of the checked-in header.
fn header_fields(header: &str, name: &str) -> Vec<String> {
    let body = section(header, &format!("typedef struct {name} {{"), &format!("}} {name};"));
    body.lines()
        .skip(1)
        .map(str::trim)
        .filter(|l| !l.starts_with('*') && !l.starts_with('/'))
        .filter_map(|l| {
            let decl = l.strip_suffix(';')?;
            let field = decl.rsplit([' ', '*']).next()?;
            Some(field.split('[').next().unwrap_or(field).to_owned())
        })
        .collect()
}

/// The mirrors outside Rust name every field: kvcore.hpp assigns each field
/// of every C struct it fills by name (`.field =`), and the guide's request
/// section names each field of `kvc_request`; method: the header's struct
/// bodies against the two texts. (The Rust conversions are checked by the
/// compiler: they name every field on both sides without `..`.)
#[test]
fn wrapper_and_guide_name_every_field() {
    let header = read("include/kvcore.h");
    let hpp = read("include/kvcore.hpp");
    for name in ["kvc_request", "kvc_image_item", "kvc_kv_pool", "kvc_bytes"] {
        let fields = header_fields(&header, name);
        assert!(!fields.is_empty(), "{name} has fields");
        for field in fields {
            assert!(hpp.contains(&format!(".{field} = ")), "kvcore.hpp fills {name}.{field} by name");
        }
    }
    let docs = read("docs/c-api.md");
    let requests = section(&docs, "## Requests", "\n## ");
    for field in header_fields(&header, "kvc_request") {
        assert!(requests.contains(&format!("`{field}`")), "docs/c-api.md, Requests, names kvc_request.{field}");
    }
}

/// Reads `version = "x.y.z"` of the `[package]` table of Cargo.toml.
fn cargo_toml_version() -> (u32, u32, u32) {
    let text = std::fs::read_to_string(Path::new(ROOT).join("Cargo.toml")).expect("read Cargo.toml");
    let package =
        text.split("\n[").find(|t| t.starts_with("[package]") || t.starts_with("package]")).expect("[package]");
    let line = package.lines().find(|l| l.trim_start().starts_with("version")).expect("package version");
    let v = line.split('"').nth(1).expect("quoted version");
    let mut parts = v.split(['.', '-', '+']).map(|p| p.parse::<u32>().expect("numeric version"));
    (parts.next().unwrap(), parts.next().unwrap(), parts.next().unwrap())
}

/// Reads `#define NAME value` from the checked-in header.
fn header_define(header: &str, name: &str) -> u32 {
    let prefix = format!("#define {name} ");
    let line =
        header.lines().find(|l| l.starts_with(&prefix)).unwrap_or_else(|| panic!("{name} missing from kvcore.h"));
    line[prefix.len()..].trim().parse().expect("numeric macro")
}

/// The header's KVCORE_VERSION_* macros equal Cargo.toml's package version;
/// method: parse both files as text.
#[test]
fn version_macros_match_cargo_toml() {
    let header = std::fs::read_to_string(Path::new(ROOT).join("include/kvcore.h")).expect("read kvcore.h");
    let got = (
        header_define(&header, "KVCORE_VERSION_MAJOR"),
        header_define(&header, "KVCORE_VERSION_MINOR"),
        header_define(&header, "KVCORE_VERSION_PATCH"),
    );
    assert_eq!(got, cargo_toml_version());
}

/// Where the programs are built, and with what.
struct Build {
    lib_dir: PathBuf,
    out_dir: PathBuf,
    sanitize: Option<String>,
}

/// Finds the static library that the cargo invocation which built this test
/// also built, and returns where the programs go.
///
/// Cargo compiles every crate type of the library target (rlib, staticlib,
/// cdylib) in one compiler run, so `deps/libkvcore.a` beside this test comes
/// from the same compilation as the rlib the test links (cargo copies it up
/// to the profile folder only for a `cargo build`). Building it again here
/// (`cargo build -p kvcore`) would resolve the dependencies' features for
/// kvcore alone and overwrite the rlib that the workspace's other crates
/// were compiled against.
fn build() -> Build {
    let exe = std::env::current_exe().expect("test path");
    // <target>/<profile>/deps/ffi-<hash>
    let deps_dir = exe.parent().expect("deps dir").to_path_buf();
    let profile_dir = deps_dir.parent().expect("profile dir").to_path_buf();
    let target_dir = profile_dir.parent().expect("target dir").to_path_buf();
    assert!(
        deps_dir.join("libkvcore.a").exists(),
        "no libkvcore.a in {} (cargo builds it with the tests)",
        deps_dir.display()
    );
    let sanitize = std::env::var("KVC_FFI_SANITIZE").ok().filter(|s| !s.is_empty());
    let out_dir = target_dir.join(match &sanitize {
        Some(s) => format!("ffi-tests-{}", s.replace(',', "-")),
        None => "ffi-tests".to_owned(),
    });
    std::fs::create_dir_all(&out_dir).expect("create ffi-tests output dir");
    Build { lib_dir: deps_dir, out_dir, sanitize }
}

/// Runs a command, panicking with its output when it fails.
fn run(cmd: &mut Command, what: &str) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{what}: cannot start: {e}"));
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{what} failed ({}):\n{text}", out.status);
    text
}

/// Compiles one C or C++ test program warning-free and links it against the
/// static library; returns the executable.
fn compile(build: &Build, source: &Path) -> PathBuf {
    let cpp = source.extension().is_some_and(|e| e == "cc");
    let exe = build.out_dir.join(source.file_stem().expect("file name"));
    let mut cmd = Command::new(if cpp { "c++" } else { "cc" });
    cmd.arg(if cpp { "-std=c++17" } else { "-std=c11" })
        .args(["-Werror", "-Wall", "-Wextra", "-Wpedantic", "-g", "-pthread"])
        .arg(format!("-I{ROOT}/include"))
        .arg(format!("-I{ROOT}/ffi-tests/c"));
    if let Some(s) = &build.sanitize {
        cmd.arg(format!("-fsanitize={s}")).args(["-fno-sanitize-recover=all", "-fno-omit-frame-pointer"]);
    }
    cmd.arg(source).arg("-o").arg(&exe);
    if build.sanitize.as_deref().is_some_and(|s| s.contains("thread")) {
        // ThreadSanitizer checks the programs and the wrapper, not the
        // library: its Rust code is not instrumented and its synchronisation
        // (futexes, atomics) is invisible to TSan, which would report its
        // allocations handed between its own threads as races.
        // ffi-tests/tsan.supp ignores what TSan's interceptors see called
        // from libkvcore.so (`called_from_lib`), so those programs link the
        // shared library, copied under the name its soname gives.
        let lib = build.out_dir.join("lib");
        std::fs::create_dir_all(&lib).expect("create the shared library dir");
        let (major, minor) = (env!("CARGO_PKG_VERSION_MAJOR"), env!("CARGO_PKG_VERSION_MINOR"));
        let soname = if major == "0" { format!("libkvcore.so.0.{minor}") } else { format!("libkvcore.so.{major}") };
        for name in ["libkvcore.so".to_owned(), soname] {
            std::fs::copy(build.lib_dir.join("libkvcore.so"), lib.join(&name)).expect("copy libkvcore.so");
        }
        cmd.arg(format!("-L{}", lib.display())).arg("-lkvcore").arg(format!("-Wl,-rpath,{}", lib.display()));
    } else {
        cmd.arg(build.lib_dir.join("libkvcore.a"));
    }
    // What a Rust static library needs from the system on Linux; the C++
    // runtime comes with `c++` and is needed once libzmq is linked in.
    cmd.args(["-lpthread", "-ldl", "-lm", "-lrt"]);
    if !cpp {
        cmd.arg("-lstdc++");
    }
    run(&mut cmd, &format!("compiling {}", source.display()));
    if let Some(s) = &build.sanitize {
        let symbols = run(Command::new("nm").arg(&exe), "nm");
        if s.contains("address") {
            assert!(symbols.contains("__asan_init"), "{} was not linked with AddressSanitizer", exe.display());
        }
        if s.contains("undefined") {
            assert!(symbols.contains("__ubsan_handle"), "{} was not linked with UBSan", exe.display());
        }
        if s.contains("thread") {
            assert!(symbols.contains("__tsan_init"), "{} was not linked with ThreadSanitizer", exe.display());
        }
    }
    exe
}

/// The test programs of one language, sorted.
fn sources(dir: &str, ext: &str) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(Path::new(ROOT).join("ffi-tests").join(dir))
        .expect("ffi-tests dir")
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == ext))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no ffi-tests/{dir}/*.{ext}");
    files
}

/// Builds and runs every program of one language; each must exit 0.
fn build_and_run(dir: &str, ext: &str) {
    let build = build();
    for source in sources(dir, ext) {
        let exe = compile(&build, &source);
        // KVC_FFI_VALGRIND=1 runs each program under valgrind (memcheck, definite
        // leaks are errors); .ci/run does so where valgrind is installed.
        let mut cmd = if std::env::var_os("KVC_FFI_VALGRIND").is_some() {
            let mut c = Command::new("valgrind");
            c.args(["-q", "--error-exitcode=9", "--leak-check=full", "--errors-for-leak-kinds=definite"]).arg(&exe);
            c
        } else {
            Command::new(&exe)
        };
        if build.sanitize.is_some() {
            cmd.env("ASAN_OPTIONS", "detect_leaks=1:abort_on_error=0")
                .env("UBSAN_OPTIONS", "print_stacktrace=1")
                // Any race report fails the program (exit 66), not only at exit.
                .env("TSAN_OPTIONS", format!("halt_on_error=1:exitcode=66:suppressions={ROOT}/ffi-tests/tsan.supp"));
        }
        let out = run(&mut cmd, &format!("running {}", exe.display()));
        assert!(out.contains("all checks passed"), "{} said:\n{out}", exe.display());
    }
}

/// Every C program in ffi-tests/c (serving loop, several engines, every
/// misuse, capability gates, double include) compiles with -Werror and passes.
#[test]
fn c_programs_pass() {
    build_and_run("c", "c");
}

/// Every C++ program in ffi-tests/cpp (the kvcore.hpp wrapper) compiles with
/// -Werror as C++17 and passes.
#[test]
fn cpp_programs_pass() {
    build_and_run("cpp", "cc");
}

/// What a subscriber receives from a publisher started through the C API is,
/// event for event, what `kvc_engine_drain_events_wire` hands out; method: a
/// real ZMQ SUB socket on loopback, both payloads decoded with the codec.
#[test]
fn c_publisher_stream_matches_wire_drain() {
    use kvcore::ffi::*;
    use kvcore::wire::{decode_message, decode_payload};
    use std::mem::MaybeUninit;

    let endpoint_any = c"tcp://127.0.0.1:*";
    let mut config = MaybeUninit::<kvc_config>::uninit();
    let mut engine = std::ptr::null_mut();
    let mut pc = MaybeUninit::<kvc_publisher_config>::uninit();
    // SAFETY: every out pointer is valid for one write; the strings are NUL-terminated statics.
    let engine = unsafe {
        assert_eq!(kvc_config_default(config.as_mut_ptr()), kvc_status::Ok);
        let mut config = config.assume_init();
        config.block_size_tokens = 4;
        config.blocks_device = 256;
        config.kv_events_endpoint = endpoint_any.as_ptr();
        assert_eq!(kvc_engine_new(&config, &mut engine), kvc_status::Ok);
        assert_eq!(kvc_publisher_config_default(pc.as_mut_ptr()), kvc_status::Ok);
        assert_eq!(kvc_engine_publisher_start(engine, pc.as_ptr()), kvc_status::Ok);
        engine
    };
    let mut endpoint = [0 as std::ffi::c_char; 128];
    let mut n = 0usize;
    // SAFETY: live engine, 128-byte buffer, `n` writable.
    let status = unsafe { kvc_engine_publisher_endpoint(engine, endpoint.as_mut_ptr(), endpoint.len(), &mut n) };
    assert_eq!(status, kvc_status::Ok);
    let endpoint: String = endpoint[..n].iter().map(|c| *c as u8 as char).collect();

    let serve = |first: u32| {
        let tokens: Vec<u32> = (first..first + 9).collect();
        let request = kvc_request {
            tokens: tokens.as_ptr(),
            tokens_len: tokens.len(),
            lora_id: 0,
            has_lora_id: false,
            dummy: false,
            lora_name: kvc_bytes { ptr: std::ptr::null(), len: 0 },
            cache_salt: kvc_bytes { ptr: std::ptr::null(), len: 0 },
            items: std::ptr::null(),
            items_len: 0,
            uuids: std::ptr::null(),
            uuids_len: 0,
        };
        let mut a = MaybeUninit::<kvc_admission>::uninit();
        let mut copies = 0usize;
        // SAFETY: live engine; `request` points to `tokens`, alive for the call; out params writable.
        unsafe {
            assert_eq!(kvc_engine_add_request(engine, &request, a.as_mut_ptr()), kvc_status::Ok);
            let id = a.assume_init().request_id;
            assert_eq!(kvc_engine_commit(engine, id, 9), kvc_status::Ok);
            assert_eq!(kvc_engine_finish(engine, id), kvc_status::Ok);
            assert_eq!(kvc_engine_step(engine, &mut copies), kvc_status::Ok);
        }
    };
    let drain_wire = || -> Vec<Vec<u8>> {
        let mut need = 0usize;
        let mut buf = vec![0u8; 1 << 16];
        // SAFETY: live engine; `buf` holds 64 KiB; `need` writable.
        let status = unsafe { kvc_engine_drain_events_wire(engine, buf.as_mut_ptr(), buf.len(), &mut need) };
        assert_eq!(status, kvc_status::Ok);
        let mut payloads = Vec::new();
        let mut at = 0;
        while at < need {
            let len = u32::from_le_bytes(buf[at..at + 4].try_into().unwrap()) as usize;
            payloads.push(buf[at + 4..at + 4 + len].to_vec());
            at += 4 + len;
        }
        payloads
    };

    let ctx = zmq::Context::new();
    let sub = ctx.socket(zmq::SUB).unwrap();
    sub.set_subscribe(b"").unwrap();
    sub.connect(&endpoint).unwrap();
    // ZMQ's slow joiner: serve until the subscriber sees a batch.
    sub.set_rcvtimeo(20).unwrap();
    let mut joined = false;
    for i in 0..500 {
        serve(10_000 + i * 16);
        if sub.recv_multipart(0).is_ok() {
            joined = true;
            break;
        }
    }
    assert!(joined, "the subscriber never received a batch");
    sub.set_rcvtimeo(5000).unwrap();
    while sub.recv_multipart(zmq::DONTWAIT).is_ok() {}
    drop(drain_wire());

    serve(1);
    let frames = sub.recv_multipart(0).expect("the batch of the last step within 5 s");
    let refs: Vec<&[u8]> = frames.iter().map(Vec::as_slice).collect();
    let received = decode_message(&refs).expect("a valid message");
    let drained = drain_wire();
    assert_eq!(drained.len(), 1, "one step, one payload");
    let drained = decode_payload(&drained[0]).expect("a valid payload");
    assert_eq!(received.batch.events, drained.events);
    assert_eq!(received.batch.events.len(), 1, "one BlockStored for the two full blocks");

    // SAFETY: live engine, stopped then freed once.
    unsafe {
        assert_eq!(kvc_engine_publisher_stop(engine), kvc_status::Ok);
        kvc_engine_free(engine);
    }
}
