//! A criterion measurement of the calling thread's CPU time.
//!
//! The development machines are shared 2-core VMs where other builds often
//! run: wall-clock figures then measure the scheduler more than the code.
//! CPU time of the benchmarking thread leaves out the time it spent
//! preempted, so side-by-side ratios stay meaningful under load (cache
//! pollution by neighbours is still in the figure).

use std::time::Duration;

use criterion::Throughput;
use criterion::measurement::{Measurement, ValueFormatter};

/// The calling thread's CPU time so far.
pub fn thread_cpu_time() -> Duration {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid, writable timespec for the duration of the call,
    // and CLOCK_THREAD_CPUTIME_ID is supported on every Linux kernel we run on.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID) works on Linux");
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Thread CPU time as a criterion measurement.
pub struct ThreadCpuTime;

/// Formats nanoseconds like criterion's wall time does.
pub struct NanosFormatter;

impl ValueFormatter for NanosFormatter {
    fn scale_values(&self, typical: f64, values: &mut [f64]) -> &'static str {
        let (factor, unit) = match typical {
            t if t < 1e3 => (1.0, "ns"),
            t if t < 1e6 => (1e-3, "µs"),
            t if t < 1e9 => (1e-6, "ms"),
            _ => (1e-9, "s"),
        };
        values.iter_mut().for_each(|v| *v *= factor);
        unit
    }

    fn scale_throughputs(&self, _typical: f64, throughput: &Throughput, values: &mut [f64]) -> &'static str {
        let per = match throughput {
            Throughput::Elements(n) | Throughput::Bytes(n) | Throughput::BytesDecimal(n) | Throughput::Bits(n) => {
                *n as f64
            }
            Throughput::ElementsAndBytes { elements, .. } => *elements as f64,
        };
        values.iter_mut().for_each(|v| *v = per * 1e9 / *v);
        "elem/s (cpu)"
    }

    fn scale_for_machines(&self, _values: &mut [f64]) -> &'static str {
        "ns"
    }
}

impl Measurement for ThreadCpuTime {
    type Intermediate = Duration;
    type Value = Duration;

    fn start(&self) -> Duration {
        thread_cpu_time()
    }
    fn end(&self, start: Duration) -> Duration {
        thread_cpu_time() - start
    }
    fn add(&self, a: &Duration, b: &Duration) -> Duration {
        *a + *b
    }
    fn zero(&self) -> Duration {
        Duration::ZERO
    }
    fn to_f64(&self, v: &Duration) -> f64 {
        v.as_nanos() as f64
    }
    fn formatter(&self) -> &dyn ValueFormatter {
        &NanosFormatter
    }
}
