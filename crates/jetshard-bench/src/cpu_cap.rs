//! Servers capped at a share of a core each, by a CPU cgroup of their own (Linux; cgroup v2's
//! `cpu.max`, or v1's CFS quota): a cluster on one machine then behaves as servers on machines
//! of their own, each with that much CPU, so the busiest server bounds the rate as it would in
//! a real cluster, instead of every server drawing on every core of the one machine.
//!
//! The quota is enforced over a short period ([`PERIOD`]): a server that spends its share waits
//! at most the rest of that period, not the kernel's default 100 ms.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context as _, bail};

/// The quota's period.
const PERIOD: Duration = Duration::from_millis(10);

/// Each capped process in a cgroup of its own; on drop, moved back to the parent cgroup and
/// the cgroup removed.
#[derive(Debug)]
pub struct CpuCaps {
    groups: Vec<(PathBuf, u32)>,
    parent: PathBuf,
}

/// Which cgroup interface the machine offers for CPU limits.
#[derive(Debug, Clone, Copy)]
enum Version {
    /// The unified hierarchy: `cpu.max` holds `quota period`.
    V2,
    /// The `cpu` controller's own hierarchy: `cpu.cfs_quota_us` and `cpu.cfs_period_us`.
    V1,
}

impl CpuCaps {
    /// Caps each of `pids` at `cores` (e.g. 0.25: a quarter of one core's time).
    ///
    /// # Errors
    ///
    /// When `cores` is not positive, or the machine offers no writable CPU cgroup (not Linux,
    /// not root, a container without cgroup access): the message says which.
    pub fn apply(pids: &[u32], cores: f64) -> anyhow::Result<Self> {
        if !(cores.is_finite() && cores > 0.0) {
            bail!("a server's CPU cap must be a positive number of cores, not {cores}");
        }
        let (version, parent) = hierarchy()?;
        let period = PERIOD.as_micros() as u64;
        // The kernel's least quota is 1 ms.
        let quota = ((cores * period as f64) as u64).max(1_000);
        let mut caps = Self {
            groups: Vec::new(),
            parent: parent.clone(),
        };
        for &pid in pids {
            let group = parent.join(format!("jetshard-bench-{pid}"));
            std::fs::create_dir_all(&group)
                .with_context(|| format!("create the cgroup {}", group.display()))?;
            caps.groups.push((group.clone(), pid));
            match version {
                Version::V2 => write(&group.join("cpu.max"), &format!("{quota} {period}"))?,
                Version::V1 => {
                    write(&group.join("cpu.cfs_period_us"), &period.to_string())?;
                    write(&group.join("cpu.cfs_quota_us"), &quota.to_string())?;
                }
            }
            write(&group.join("cgroup.procs"), &pid.to_string())?;
        }
        Ok(caps)
    }
}

impl Drop for CpuCaps {
    fn drop(&mut self) {
        for (group, pid) in &self.groups {
            // A process that has exited has left its cgroup already.
            let _ = std::fs::write(self.parent.join("cgroup.procs"), pid.to_string());
            let _ = std::fs::remove_dir(group);
        }
    }
}

/// The cgroup under which a capped process's own is made.
fn hierarchy() -> anyhow::Result<(Version, PathBuf)> {
    let unified = Path::new("/sys/fs/cgroup");
    let controllers = std::fs::read_to_string(unified.join("cgroup.controllers"));
    if controllers.is_ok_and(|c| c.split_whitespace().any(|c| c == "cpu")) {
        // Children get the cpu controller only if the parent hands it down.
        write(&unified.join("cgroup.subtree_control"), "+cpu")?;
        return Ok((Version::V2, unified.to_owned()));
    }
    let v1 = unified.join("cpu");
    if v1.join("cpu.cfs_quota_us").exists() {
        return Ok((Version::V1, v1));
    }
    bail!(
        "capping a server's CPU needs a writable CPU cgroup (cgroup v2's cpu controller at \
         /sys/fs/cgroup, or v1's at /sys/fs/cgroup/cpu); this machine offers neither"
    )
}

fn write(path: &Path, value: &str) -> anyhow::Result<()> {
    std::fs::write(path, value).with_context(|| format!("write {value:?} to {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cap_that_is_not_a_positive_number_of_cores_is_refused() {
        for cores in [0.0, -0.5, f64::NAN, f64::INFINITY] {
            let refused = CpuCaps::apply(&[], cores).expect_err("refused");
            assert!(
                refused.to_string().contains("positive number of cores"),
                "{refused}"
            );
        }
    }
}
