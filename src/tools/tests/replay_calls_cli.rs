//! `kvcore replay-calls FILE`, run as the real binary on a call log that a C
//! program recorded through the C ABI (ffi-tests/c/call_log.c, compiled here
//! against the static library this test was built with): the log replays in
//! this other process with every output matching; a tampered digest is
//! reported at its call (exit 1); a log cut short replays to the cut; a file
//! that is not a log is refused (exit 2).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use kvcore::CallLogReader;

const ROOT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");

fn run(cmd: &mut Command, what: &str) -> Output {
    cmd.output().unwrap_or_else(|e| panic!("{what}: cannot start: {e}"))
}

fn text(out: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

/// Compiles ffi-tests/c/call_log.c against `libkvcore.a`, which cargo built
/// beside this test (every crate type of the library comes out of the one
/// compilation of kvcore this package links).
fn compile_c_program(out_dir: &Path) -> PathBuf {
    let deps = std::env::current_exe().unwrap().parent().unwrap().to_path_buf();
    let lib = deps.join("libkvcore.a");
    assert!(lib.exists(), "no libkvcore.a in {} (cargo builds it with kvcore)", deps.display());
    let exe = out_dir.join("call_log");
    let out = run(
        Command::new("cc")
            .args(["-std=c11", "-Werror", "-Wall", "-Wextra", "-Wpedantic", "-g", "-pthread"])
            .arg(format!("-I{ROOT}/include"))
            .arg(format!("-I{ROOT}/ffi-tests/c"))
            .arg(format!("{ROOT}/ffi-tests/c/call_log.c"))
            .arg("-o")
            .arg(&exe)
            .arg(&lib)
            .args(["-lpthread", "-ldl", "-lm", "-lrt", "-lstdc++"]),
        "cc",
    );
    assert!(out.status.success(), "compiling call_log.c:\n{}", text(&out));
    exe
}

fn replay(path: &Path) -> Output {
    run(Command::new(env!("CARGO_BIN_EXE_kvcore")).arg("replay-calls").arg(path), "kvcore replay-calls")
}

/// Record offsets of a log.
fn offsets(log: &[u8]) -> Vec<u64> {
    let mut r = CallLogReader::new(log).unwrap();
    let mut out = Vec::new();
    while let Some(rec) = r.next_record().unwrap() {
        out.push(rec.offset);
    }
    out
}

#[test]
fn a_log_recorded_through_the_c_abi_replays_with_the_cli() {
    let dir = std::env::temp_dir().join(format!("kvcore-replay-calls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let exe = compile_c_program(&dir);
    let log_path = dir.join("calls.bin");
    let out = run(Command::new(&exe).arg(&log_path), "call_log");
    let said = text(&out);
    assert!(out.status.success() && said.contains("all checks passed"), "call_log said:\n{said}");
    let calls: u64 = said
        .lines()
        .find_map(|l| l.strip_prefix("call log: "))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|n| n.parse().ok())
        .expect("the program names its log and its calls");

    // The log as recorded: every call matches in this other process.
    let out = replay(&log_path);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(text(&out).contains(&format!("{calls} calls replayed, every output matched")), "{}", text(&out));

    // One digest changed: reported at its call, exit 1.
    let log = std::fs::read(&log_path).unwrap();
    let recs = offsets(&log);
    assert_eq!(recs.len() as u64, calls);
    let k = recs.len() / 2;
    let mut tampered = log.clone();
    tampered[recs[k + 1] as usize - 1] ^= 1;
    let tampered_path = dir.join("tampered.bin");
    std::fs::write(&tampered_path, &tampered).unwrap();
    let out = replay(&tampered_path);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let want = format!("{k} calls matched; first divergence: call {k} (");
    assert!(text(&out).contains(&want), "expected `{want}` in:\n{}", text(&out));
    assert!(text(&out).contains("output Counters differs"), "{}", text(&out));

    // Cut inside a record: the calls before it replay.
    let cut_path = dir.join("cut.bin");
    std::fs::write(&cut_path, &log[..recs[k] as usize + 1]).unwrap();
    let out = replay(&cut_path);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(
        text(&out).contains(&format!(
            "{k} calls replayed, every output matched; the log ends inside the record at byte {}",
            recs[k]
        )),
        "{}",
        text(&out)
    );

    // Not a call log.
    let junk_path = dir.join("junk.bin");
    std::fs::write(&junk_path, b"not a call log at all").unwrap();
    let out = replay(&junk_path);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("no KVCCALLS magic"), "{}", text(&out));
    std::fs::remove_dir_all(&dir).ok();
}
