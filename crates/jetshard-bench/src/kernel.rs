//! What the kernel does for the client per pass: counts, not times, so they
//! hold on a loaded machine where the CPU time of a task hop does not.
//!
//! - **Context switches** of the whole process (`getrusage(RUSAGE_SELF)`: every thread's,
//!   those of threads that ended included), voluntary (a thread blocked: parked on a futex or
//!   in `epoll_wait`) and involuntary (preempted). No permission needed.
//! - **System calls by kind and wake-ups made** ([`Syscalls`]): one tracepoint counter per
//!   thread and event (`perf_event_open`, `PERF_TYPE_TRACEPOINT`, ids from tracefs), opened by
//!   [`count_this_thread`] on the same threads as [`crate::instructions`]' counters (at most
//!   `MAX_THREADS`) and summed.
//!   The kernel allows them to root or with `perf_event_paranoid` at -1; elsewhere the figures
//!   are "n/a" and the bench goes on. Opened only with `BENCH_SYSCALLS=1` ([`SWITCH`]): while a
//!   system call tracepoint is open, the kernel takes every thread of the machine, the
//!   servers' included, through its traced system call path, which would tax every figure of
//!   the run a little.

use std::sync::{Mutex, PoisonError};

/// The tracepoints counted, in [`Syscalls`]' order: every system call, then by kind.
const TRACEPOINTS: [&str; 7] = [
    "raw_syscalls/sys_enter",
    "syscalls/sys_enter_futex",
    "syscalls/sys_enter_writev",
    "syscalls/sys_enter_recvfrom",
    "syscalls/sys_enter_epoll_wait",
    "syscalls/sys_enter_sendto",
    "sched/sched_wakeup",
];

/// What the kernel counted for this process.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct Kernel {
    /// Voluntary context switches (a thread blocked).
    pub voluntary_switches: u64,
    /// Involuntary context switches (a thread preempted).
    pub involuntary_switches: u64,
    /// CPU time in user space, microseconds (`ru_utime`).
    pub user_us: u64,
    /// CPU time in the kernel on the process's behalf, microseconds (`ru_stime`): its system
    /// calls, and on a loopback connection the receiving side's TCP work its writes do.
    pub system_us: u64,
    /// System calls by kind; `None` where the kernel refused the tracepoint counters.
    pub syscalls: Option<Syscalls>,
}

/// System calls and wake-ups this process's counted threads made.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Syscalls {
    /// Every system call.
    pub all: u64,
    /// `futex` (waits and wakes: a tokio worker parking or unparking another).
    pub futex: u64,
    /// `writev`: the connection's socket writes (async-nats writes vectored).
    pub writev: u64,
    /// `recvfrom`: the connection's socket reads.
    pub recvfrom: u64,
    /// `epoll_wait`: a worker polling the reactor.
    pub epoll_wait: u64,
    /// `sendto`: socket writes not vectored.
    pub sendto: u64,
    /// Wake-ups made (`sched_wakeup` in a counted thread: a thread it woke, of this process or,
    /// through the loopback socket, of the server's).
    pub wakeups: u64,
}

impl Kernel {
    /// What was counted since `earlier`.
    pub fn since(self, earlier: Kernel) -> Kernel {
        Kernel {
            voluntary_switches: self
                .voluntary_switches
                .saturating_sub(earlier.voluntary_switches),
            involuntary_switches: self
                .involuntary_switches
                .saturating_sub(earlier.involuntary_switches),
            user_us: self.user_us.saturating_sub(earlier.user_us),
            system_us: self.system_us.saturating_sub(earlier.system_us),
            syscalls: self
                .syscalls
                .zip(earlier.syscalls)
                .map(|(now, then)| now.since(then)),
        }
    }

    /// The counts per command of `commands`, as the pass report prints them.
    pub fn line(&self, commands: usize) -> String {
        let per = |n: u64| n as f64 / commands.max(1) as f64;
        let mut line = format!(
            "CPU {:.1} us user, {:.1} us system per cmd; context switches {:.3} per cmd ({:.3} voluntary, {:.3} involuntary)",
            per(self.user_us),
            per(self.system_us),
            per(self.voluntary_switches + self.involuntary_switches),
            per(self.voluntary_switches),
            per(self.involuntary_switches),
        );
        match self.syscalls {
            Some(s) => line.push_str(&format!(
                "; system calls {:.3} per cmd: futex {:.3}, writev {:.3}, sendto {:.3}, recvfrom {:.3}, epoll_wait {:.3}; wake-ups made {:.3}{}",
                per(s.all),
                per(s.futex),
                per(s.writev),
                per(s.sendto),
                per(s.recvfrom),
                per(s.epoll_wait),
                per(s.wakeups),
                match uncounted() {
                    0 => String::new(),
                    n => format!(" ({n} threads past the first {MAX_THREADS} not counted)"),
                },
            )),
            None => line.push_str(&format!(
                "; system calls n/a ({})",
                refused().unwrap_or_else(|| "no counted thread".to_owned())
            )),
        }
        line
    }
}

impl Syscalls {
    fn since(self, earlier: Syscalls) -> Syscalls {
        let [a, b] = [self.to_array(), earlier.to_array()];
        Syscalls::from_array(std::array::from_fn(|i| a[i].saturating_sub(b[i])))
    }

    fn to_array(self) -> [u64; TRACEPOINTS.len()] {
        [
            self.all,
            self.futex,
            self.writev,
            self.recvfrom,
            self.epoll_wait,
            self.sendto,
            self.wakeups,
        ]
    }

    fn from_array(a: [u64; TRACEPOINTS.len()]) -> Syscalls {
        let [all, futex, writev, recvfrom, epoll_wait, sendto, wakeups] = a;
        Syscalls {
            all,
            futex,
            writev,
            recvfrom,
            epoll_wait,
            sendto,
            wakeups,
        }
    }
}

/// Every counted thread's tracepoint counters, and why the kernel refused, if it did.
static COUNTERS: Mutex<Counters> = Mutex::new(Counters {
    threads: Vec::new(),
    refused: None,
    uncounted: 0,
});

/// Threads counted at most: a thread's descriptors stay open after it exits (its counts stay
/// readable), and the runtime's blocking pool starts threads over a long run; past this, the
/// descriptors would eat into the process's file limit.
const MAX_THREADS: usize = 64;

struct Counters {
    threads: Vec<Vec<std::os::fd::OwnedFd>>,
    refused: Option<String>,
    /// Threads started past [`MAX_THREADS`], not counted.
    uncounted: usize,
}

/// The environment variable that switches the tracepoint counters on (`1`).
pub const SWITCH: &str = "BENCH_SYSCALLS";

/// Opens the calling thread's tracepoint counters if [`SWITCH`] is `1`; a refusal is
/// remembered, never an error.
pub fn count_this_thread() {
    let mut counters = COUNTERS.lock().unwrap_or_else(PoisonError::into_inner);
    if counters.refused.is_some() {
        return;
    }
    if std::env::var_os(SWITCH).is_none_or(|on| on != "1") {
        counters.refused = Some(format!("off ({SWITCH}=1 counts them)"));
        return;
    }
    if counters.threads.len() >= MAX_THREADS {
        counters.uncounted += 1;
        return;
    }
    let opened: Result<Vec<_>, String> = TRACEPOINTS
        .iter()
        .map(|name| {
            let id = tracepoint_id(name)?;
            tracepoint::open(id).map_err(|e| format!("perf_event_open of {name}: {e}"))
        })
        .collect();
    match opened {
        Ok(fds) => counters.threads.push(fds),
        Err(e) => counters.refused = Some(e),
    }
}

/// The tracepoint's id in tracefs.
fn tracepoint_id(name: &str) -> Result<u64, String> {
    for root in ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"] {
        if let Ok(id) = std::fs::read_to_string(format!("{root}/events/{name}/id")) {
            return id.trim().parse().map_err(|e| format!("{name}'s id: {e}"));
        }
    }
    Err(format!("{name}: no tracefs id readable"))
}

/// Why the tracepoint counters are not counted (`None`: they are, or none was opened yet).
pub fn refused() -> Option<String> {
    COUNTERS
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .refused
        .clone()
}

/// Threads started past [`MAX_THREADS`], whose system calls are not counted.
fn uncounted() -> usize {
    COUNTERS
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .uncounted
}

/// The counts so far.
pub fn now() -> Kernel {
    let Usage {
        voluntary_switches,
        involuntary_switches,
        user_us,
        system_us,
    } = usage();
    let counters = COUNTERS.lock().unwrap_or_else(PoisonError::into_inner);
    let syscalls = (counters.refused.is_none() && !counters.threads.is_empty())
        .then(|| {
            let mut sum = [0u64; TRACEPOINTS.len()];
            for thread in &counters.threads {
                for (total, fd) in sum.iter_mut().zip(thread) {
                    *total += tracepoint::read(fd)?;
                }
            }
            Some(Syscalls::from_array(sum))
        })
        .flatten();
    Kernel {
        voluntary_switches,
        involuntary_switches,
        user_us,
        system_us,
        syscalls,
    }
}

/// The process's `getrusage` figures the pass report prints.
#[derive(Default)]
struct Usage {
    voluntary_switches: u64,
    involuntary_switches: u64,
    user_us: u64,
    system_us: u64,
}

/// The process's context switches and CPU times so far (zero where the call fails).
fn usage() -> Usage {
    // SAFETY: `rusage` is plain data the call fills in; zeroed is a valid value of it.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `usage` is a valid, writable `rusage`.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) } != 0 {
        return Usage::default();
    }
    let micros = |t: libc::timeval| {
        u64::try_from(t.tv_sec).unwrap_or(0) * 1_000_000 + u64::try_from(t.tv_usec).unwrap_or(0)
    };
    Usage {
        voluntary_switches: u64::try_from(usage.ru_nvcsw).unwrap_or(0),
        involuntary_switches: u64::try_from(usage.ru_nivcsw).unwrap_or(0),
        user_us: micros(usage.ru_utime),
        system_us: micros(usage.ru_stime),
    }
}

/// `perf_event_open(2)` of one tracepoint for the calling thread.
#[cfg(target_os = "linux")]
mod tracepoint {
    use std::os::fd::{AsRawFd, OwnedFd};

    /// `PERF_TYPE_TRACEPOINT`.
    const TYPE_TRACEPOINT: u32 = 2;

    /// Opens a counter of tracepoint `id` for the calling thread, counting from now.
    pub(super) fn open(id: u64) -> std::io::Result<OwnedFd> {
        crate::instructions::perf::open_event(TYPE_TRACEPOINT, id, 0, 0)
    }

    /// The counter's value.
    pub(super) fn read(fd: &OwnedFd) -> Option<u64> {
        let mut value = 0u64;
        // SAFETY: `value` is writable for its whole size, the size passed.
        let n = unsafe {
            libc::read(
                fd.as_raw_fd(),
                (&mut value as *mut u64).cast(),
                std::mem::size_of::<u64>(),
            )
        };
        (usize::try_from(n).ok()? == std::mem::size_of::<u64>()).then_some(value)
    }
}

#[cfg(not(target_os = "linux"))]
mod tracepoint {
    use std::os::fd::OwnedFd;

    pub(super) fn open(_id: u64) -> std::io::Result<OwnedFd> {
        Err(std::io::Error::from(std::io::ErrorKind::Unsupported))
    }

    pub(super) fn read(_fd: &OwnedFd) -> Option<u64> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sleep_is_a_voluntary_switch_and_system_calls_are_counted_where_allowed() {
        count_this_thread();
        let before = now();
        // Each sleep blocks the thread: a voluntary context switch, and a system call.
        for _ in 0..5 {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let spent = now().since(before);
        assert!(
            spent.voluntary_switches >= 5,
            "voluntary switches: {}",
            spent.voluntary_switches
        );
        match spent.syscalls {
            Some(syscalls) => assert!(syscalls.all >= 5, "system calls: {syscalls:?}"),
            // Refused (not root, perf_event_paranoid above -1): said why.
            None => assert!(refused().is_some()),
        }
        let line = spent.line(5);
        assert!(line.contains(" voluntary, "), "{line}");
    }
}
