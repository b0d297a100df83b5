//! CPU time and memory of processes, from `/proc` and the allocator (Linux).

use std::time::Duration;

/// User + system CPU time a process has used so far; `None` if it cannot be read.
pub fn cpu_time(pid: u32) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces; the fields after its `)` are plain.
    let rest = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the whole line: 12 and 13 after the name.
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    // SAFETY: sysconf has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    let ticks = u64::try_from(ticks).ok().filter(|t| *t > 0)?;
    Some(Duration::from_nanos(
        (utime + stime) * 1_000_000_000 / ticks,
    ))
}

/// The resident set size of this process in bytes (`VmRSS` of `/proc/self/status`).
pub fn rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Bytes of heap this process has allocated and not freed (glibc's `mallinfo2`: small chunks
/// in use plus mmapped ones). Unlike RSS it falls when memory is freed, so it shows what
/// passivation gives back; `None` where the allocator is not glibc's.
pub fn heap_in_use_bytes() -> Option<u64> {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallinfo2 only reads the allocator's counters.
        let info = unsafe { libc::mallinfo2() };
        Some((info.uordblks + info.hblkhd) as u64)
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        None
    }
}

/// CPU used by this process and by the server (or the servers of a cluster) between two
/// readings.
#[derive(Debug, Clone)]
pub struct CpuMeter {
    server_pids: Vec<u32>,
    client_start: Option<Duration>,
    server_start: Option<Duration>,
}

/// CPU time spent over a measured interval.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct CpuSpent {
    /// This process (the client side), seconds.
    pub client_secs: f64,
    /// The server processes, seconds.
    pub server_secs: f64,
}

impl CpuMeter {
    /// Starts measuring this process and the servers with pids `server_pids`.
    pub fn start(server_pids: &[u32]) -> Self {
        Self {
            server_pids: server_pids.to_vec(),
            client_start: cpu_time(std::process::id()),
            server_start: servers_cpu_time(server_pids),
        }
    }

    /// CPU used since [`start`](Self::start); zero where a reading failed.
    pub fn spent(&self) -> CpuSpent {
        let since = |start: Option<Duration>, now: Option<Duration>| match (start, now) {
            (Some(start), Some(now)) => now.saturating_sub(start).as_secs_f64(),
            _ => 0.0,
        };
        CpuSpent {
            client_secs: since(self.client_start, cpu_time(std::process::id())),
            server_secs: since(self.server_start, servers_cpu_time(&self.server_pids)),
        }
    }
}

/// The CPU time of all of `pids` together; `None` if one cannot be read.
fn servers_cpu_time(pids: &[u32]) -> Option<Duration> {
    pids.iter().map(|pid| cpu_time(*pid)).sum()
}

/// The memory the kernel says is available for new work (`MemAvailable`), in bytes.
pub fn available_memory_bytes() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = meminfo.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}
