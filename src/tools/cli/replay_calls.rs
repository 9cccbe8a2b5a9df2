//! `kvcore replay-calls FILE`: replays a call log (recorded with
//! `Engine::record_calls` or `kvc_engine_call_log_open`) into a fresh engine
//! and reports the first call whose output differs from the log.

use std::io::BufReader;
use std::path::PathBuf;

use kvcore::replay_calls;

/// Arguments of `kvcore replay-calls`.
#[derive(clap::Args, Debug)]
pub struct ReplayCallsArgs {
    /// The call log.
    pub file: PathBuf,
}

/// Exit status: 0 when every call matched, 1 at a divergence, 2 when the log
/// cannot be read or replayed.
pub fn run(args: &ReplayCallsArgs) -> i32 {
    let file = match std::fs::File::open(&args.file) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("kvcore replay-calls: {}: {e}", args.file.display());
            return 2;
        }
    };
    let report = match replay_calls(BufReader::new(file)) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("kvcore replay-calls: {}: {e}", args.file.display());
            return 2;
        }
    };
    match &report.divergence {
        Some(d) => {
            println!("{} calls matched; first divergence: {d}", report.calls_matched);
            1
        }
        None => {
            match report.truncated_at {
                Some(at) => println!(
                    "{} calls replayed, every output matched; the log ends inside the record at byte {at}",
                    report.calls_matched
                ),
                None => println!("{} calls replayed, every output matched", report.calls_matched),
            }
            0
        }
    }
}
