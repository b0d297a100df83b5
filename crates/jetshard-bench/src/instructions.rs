//! Instructions the client executes per command: a CPU yardstick that holds on a loaded
//! machine, where CPU time per command moves between two runs of one binary more than most cuts
//! do. Two sources, each read at a drain pass's boundaries ([`crate::drain`]):
//!
//! - **Hardware counters** ([`Counted`]): user-space instructions and cycles of this process,
//!   from `perf_event_open`. A counter opened with `inherit` folds a thread's counts into its
//!   parent's only when the thread exits, so every thread opens its own
//!   ([`count_this_thread`]: the main thread, and every thread of the harness's tokio runtime
//!   through `on_thread_start`) and a reading sums them. Threads started outside the runtime
//!   (the testkit's reader of a server's log) are not counted. Where the kernel refuses (a
//!   virtual machine without a PMU, `perf_event_paranoid` above 2, a container's seccomp) the
//!   figures are "n/a" and the bench goes on.
//! - **callgrind** ([`callgrind`]): run under `valgrind --tool=callgrind --instr-atstart=no`,
//!   the harness instruments only the passes, dumps callgrind's counts at each pass's end and
//!   reads the instructions from the dump. It needs no PMU, so it is the yardstick of a virtual
//!   machine; the client runs some 50x slower under it, which fills pull batches fuller than a
//!   native run would, so compare its figures with each other, not with the hardware's.

use std::sync::{Mutex, PoisonError};

/// User-space instructions and cycles this process's counted threads executed.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct Counted {
    /// Instructions retired in user space.
    pub instructions: u64,
    /// CPU cycles in user space; `None` where the kernel refused a cycle counter.
    pub cycles: Option<u64>,
    /// Whether a counter was multiplexed (shared the PMU with other events) and its count
    /// scaled up from the time it ran: an estimate then, not a count.
    pub scaled: bool,
}

impl Counted {
    /// What was counted since `earlier`.
    pub fn since(self, earlier: Counted) -> Counted {
        Counted {
            instructions: self.instructions.saturating_sub(earlier.instructions),
            cycles: self
                .cycles
                .zip(earlier.cycles)
                .map(|(now, then)| now.saturating_sub(then)),
            scaled: self.scaled || earlier.scaled,
        }
    }
}

/// One thread's counters.
struct ThreadCounters {
    instructions: std::os::fd::OwnedFd,
    cycles: Option<std::os::fd::OwnedFd>,
}

/// Every counted thread's counters (a thread's stay readable after it exits), and why the
/// kernel refused, if it did.
static COUNTERS: Mutex<Counters> = Mutex::new(Counters {
    threads: Vec::new(),
    refused: None,
});

struct Counters {
    threads: Vec<ThreadCounters>,
    refused: Option<std::io::Error>,
}

/// Opens the calling thread's counters; a refusal is remembered (see [`refused`]), never an
/// error. Call it first thing on every thread whose work is to be counted.
pub fn count_this_thread() {
    let mut counters = COUNTERS.lock().unwrap_or_else(PoisonError::into_inner);
    if counters.refused.is_some() {
        return;
    }
    match perf::open(perf::INSTRUCTIONS) {
        Ok(instructions) => {
            let cycles = perf::open(perf::CYCLES).ok();
            counters.threads.push(ThreadCounters {
                instructions,
                cycles,
            });
        }
        Err(e) => counters.refused = Some(e),
    }
}

/// Why the kernel refused the counters (`None`: it did not, or none was opened yet).
pub fn refused() -> Option<String> {
    let counters = COUNTERS.lock().unwrap_or_else(PoisonError::into_inner);
    counters.refused.as_ref().map(ToString::to_string)
}

/// The counted threads' counts so far; `None` when the kernel refused or no thread is counted.
pub fn now() -> Option<Counted> {
    let counters = COUNTERS.lock().unwrap_or_else(PoisonError::into_inner);
    if counters.refused.is_some() || counters.threads.is_empty() {
        return None;
    }
    let mut total = Counted {
        cycles: Some(0),
        ..Counted::default()
    };
    for thread in &counters.threads {
        let (instructions, scaled) = perf::read(&thread.instructions)?;
        total.instructions += instructions;
        total.scaled |= scaled;
        match (total.cycles, thread.cycles.as_ref().and_then(perf::read)) {
            (Some(sum), Some((cycles, scaled))) => {
                total.cycles = Some(sum + cycles);
                total.scaled |= scaled;
            }
            _ => total.cycles = None,
        }
    }
    Some(total)
}

/// `perf_event_open(2)` for one thread's user-space hardware counter ([`open`]), or any
/// counting event ([`open_event`]: the kernel's tracepoints, `crate::kernel`).
#[cfg(target_os = "linux")]
pub(crate) mod perf {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

    /// `PERF_COUNT_HW_CPU_CYCLES`.
    pub(super) const CYCLES: u64 = 0;
    /// `PERF_COUNT_HW_INSTRUCTIONS`.
    pub(super) const INSTRUCTIONS: u64 = 1;

    /// `PERF_TYPE_HARDWARE`.
    const TYPE_HARDWARE: u32 = 0;
    /// `PERF_FORMAT_TOTAL_TIME_ENABLED | PERF_FORMAT_TOTAL_TIME_RUNNING`.
    const READ_TIMES: u64 = 1 | 2;
    /// The attribute flags' bits `exclude_kernel` (5) and `exclude_hv` (6): user space only,
    /// which `perf_event_paranoid` 2 (the usual default) allows for one's own threads.
    const USER_ONLY: u64 = (1 << 5) | (1 << 6);
    /// `PERF_FLAG_FD_CLOEXEC`.
    const FD_CLOEXEC: libc::c_ulong = 8;

    /// `struct perf_event_attr` up to `PERF_ATTR_SIZE_VER0` (64 bytes), all the kernel needs
    /// for a counting (not sampling) event.
    #[repr(C)]
    struct Attr {
        kind: u32,
        size: u32,
        config: u64,
        sample_period: u64,
        sample_type: u64,
        read_format: u64,
        flags: u64,
        wakeup_events: u32,
        bp_type: u32,
        config1: u64,
    }

    /// Opens hardware counter `config` for the calling thread, counting from now.
    pub(super) fn open(config: u64) -> std::io::Result<OwnedFd> {
        open_event(TYPE_HARDWARE, config, READ_TIMES, USER_ONLY)
    }

    /// Opens a counting event of type `kind` (`PERF_TYPE_*`) and `config` for the calling
    /// thread, counting from now.
    pub(crate) fn open_event(
        kind: u32,
        config: u64,
        read_format: u64,
        flags: u64,
    ) -> std::io::Result<OwnedFd> {
        let attr = Attr {
            kind,
            size: std::mem::size_of::<Attr>() as u32,
            config,
            sample_period: 0,
            sample_type: 0,
            read_format,
            flags,
            wakeup_events: 0,
            bp_type: 0,
            config1: 0,
        };
        // The calling thread, on any CPU, in no group.
        let (thread, any_cpu, no_group): (libc::pid_t, libc::c_int, libc::c_int) = (0, -1, -1);
        // SAFETY: `attr` is a valid `perf_event_attr` of the size it declares and outlives the
        // call; the other arguments are plain values.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_perf_event_open,
                &attr as *const Attr,
                thread,
                any_cpu,
                no_group,
                FD_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let fd = libc::c_int::try_from(fd).map_err(std::io::Error::other)?;
        // SAFETY: the kernel just returned this descriptor and nothing else owns it.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    /// The counter's value (scaled up if it was multiplexed) and whether it was scaled.
    pub(super) fn read(fd: &OwnedFd) -> Option<(u64, bool)> {
        let mut values = [0u64; 3];
        // SAFETY: `values` is writable for its whole size, the size passed.
        let n = unsafe {
            libc::read(
                fd.as_raw_fd(),
                values.as_mut_ptr().cast(),
                std::mem::size_of_val(&values),
            )
        };
        if usize::try_from(n).ok()? != std::mem::size_of_val(&values) {
            return None;
        }
        let [value, enabled, running] = values;
        if running == 0 || running >= enabled {
            return Some((value, false));
        }
        Some((
            (value as u128 * enabled as u128 / running as u128) as u64,
            true,
        ))
    }
}

#[cfg(not(target_os = "linux"))]
pub(crate) mod perf {
    use std::os::fd::OwnedFd;

    pub(super) const CYCLES: u64 = 0;
    pub(super) const INSTRUCTIONS: u64 = 1;

    pub(super) fn open(_config: u64) -> std::io::Result<OwnedFd> {
        Err(std::io::Error::from(std::io::ErrorKind::Unsupported))
    }

    pub(crate) fn open_event(
        _kind: u32,
        _config: u64,
        _read_format: u64,
        _flags: u64,
    ) -> std::io::Result<OwnedFd> {
        Err(std::io::Error::from(std::io::ErrorKind::Unsupported))
    }

    pub(super) fn read(_fd: &OwnedFd) -> Option<(u64, bool)> {
        None
    }
}

/// The harness under valgrind's callgrind: client requests that instrument and count only the
/// passes, and the instructions read back from callgrind's dump. Outside valgrind every request
/// is a few no-op instructions and [`running`](callgrind::running) is false.
pub mod callgrind {
    /// Whether this process runs under valgrind.
    pub fn running() -> bool {
        request(0, RUNNING_ON_VALGRIND, 0) > 0
    }

    /// Starts instrumenting (a no-op unless run with `--instr-atstart=no`) and zeroes the
    /// counts of every thread: what is dumped next is this pass's.
    pub fn pass_started() {
        request(0, START_INSTRUMENTATION, 0);
        request(0, ZERO_STATS, 0);
    }

    /// Dumps the counts since [`pass_started`] under the name `what`, stops instrumenting, and
    /// returns the instructions the dump holds; `None` when its file is not found in the
    /// working directory under callgrind's default name (`callgrind.out.<pid>.<n>`).
    pub fn pass_ended(what: &str) -> Option<u64> {
        let what = std::ffi::CString::new(what).ok()?;
        request(0, DUMP_STATS_AT, what.as_ptr() as u64);
        request(0, STOP_INSTRUMENTATION, 0);
        instructions_of_last_dump()
    }

    /// The `totals:` (or, from an older callgrind, `summary:`) line of the newest dump of this
    /// process, whose first event is `Ir`, instructions.
    fn instructions_of_last_dump() -> Option<u64> {
        let prefix = format!("callgrind.out.{}.", std::process::id());
        let newest = std::fs::read_dir(".")
            .ok()?
            .filter_map(Result::ok)
            .filter_map(|entry| {
                let name = entry.file_name().into_string().ok()?;
                let number: u64 = name.strip_prefix(&prefix)?.parse().ok()?;
                Some((number, entry.path()))
            })
            .max_by_key(|(number, _)| *number)?
            .1;
        let dump = std::fs::read_to_string(newest).ok()?;
        let totals = dump
            .lines()
            .find_map(|l| l.strip_prefix("totals:"))
            .or_else(|| dump.lines().find_map(|l| l.strip_prefix("summary:")))?;
        totals.split_whitespace().next()?.parse().ok()
    }

    /// `VG_USERREQ__RUNNING_ON_VALGRIND`.
    const RUNNING_ON_VALGRIND: u64 = 0x1001;
    /// callgrind's requests: `VG_USERREQ_TOOL_BASE('C', 'T')` plus their number.
    const CALLGRIND: u64 = ((b'C' as u64) << 24) | ((b'T' as u64) << 16);
    const ZERO_STATS: u64 = CALLGRIND + 1;
    const DUMP_STATS_AT: u64 = CALLGRIND + 3;
    const START_INSTRUMENTATION: u64 = CALLGRIND + 4;
    const STOP_INSTRUMENTATION: u64 = CALLGRIND + 5;

    /// valgrind's client request (`VALGRIND_DO_CLIENT_REQUEST_EXPR` of `valgrind.h`, amd64):
    /// a preamble of rotations valgrind recognises, then `xchg rbx, rbx`. On a real CPU the
    /// four rotations turn `rdi` by 128 bits (unchanged) and the exchange does nothing, so
    /// `rdx` keeps `default`.
    #[cfg(target_arch = "x86_64")]
    fn request(default: u64, request: u64, argument: u64) -> u64 {
        let block: [u64; 6] = [request, argument, 0, 0, 0, 0];
        let mut result = default;
        // SAFETY: natively the sequence changes no register but the flags; under valgrind it
        // reads `block`, which lives across the call, and writes the answer to `rdx`.
        unsafe {
            std::arch::asm!(
                "rol rdi, 3",
                "rol rdi, 13",
                "rol rdi, 61",
                "rol rdi, 51",
                "xchg rbx, rbx",
                in("rax") block.as_ptr(),
                inout("rdx") result,
                options(nostack),
            );
        }
        result
    }

    #[cfg(not(target_arch = "x86_64"))]
    fn request(default: u64, _request: u64, _argument: u64) -> u64 {
        default
    }
}
