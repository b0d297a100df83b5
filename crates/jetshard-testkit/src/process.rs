//! Child processes that cannot outlive the test process, and the signals sent to them.
//!
//! A server is killed and reaped when its handle drops. That does not cover a test process
//! that is itself killed (a CI timeout, `kill -9`): on Linux every server is therefore started
//! with `PR_SET_PDEATHSIG = SIGKILL`. The kernel ties that signal to the *thread* that forked,
//! so all servers are forked by one spawner thread that lives as long as the process; a
//! server started from a short-lived thread is not killed when that thread ends.

use std::io;
use std::process::{Child, Command};
use std::sync::OnceLock;
use std::sync::mpsc;

/// A signal the testkit sends, with its name for error messages.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Signal {
    Term,
    Stop,
    Cont,
}

impl Signal {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Signal::Term => "SIGTERM",
            Signal::Stop => "SIGSTOP",
            Signal::Cont => "SIGCONT",
        }
    }

    fn number(self) -> libc::c_int {
        match self {
            Signal::Term => libc::SIGTERM,
            Signal::Stop => libc::SIGSTOP,
            Signal::Cont => libc::SIGCONT,
        }
    }
}

/// Sends `signal` to `child`.
///
/// `child` has not been reaped (it is borrowed from a live `Child` whose exit was not yet
/// collected), so its pid cannot have been reused by another process.
pub(crate) fn send(child: &Child, signal: Signal) -> io::Result<()> {
    let pid = libc::pid_t::try_from(child.id())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "pid out of range"))?;
    // SAFETY: kill(2) has no memory-safety preconditions; the pid is our un-reaped child.
    let result = unsafe { libc::kill(pid, signal.number()) };
    if result == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// A command to start, and where to send the result.
struct SpawnRequest {
    command: Command,
    reply: mpsc::SyncSender<io::Result<Child>>,
}

/// Starts `command`; on Linux the child is SIGKILLed by the kernel when this process dies.
pub(crate) fn spawn(mut command: Command) -> io::Result<Child> {
    die_with_parent(&mut command);
    let Some(spawner) = spawner() else {
        return command.spawn();
    };
    let (reply, answer) = mpsc::sync_channel(1);
    let request = SpawnRequest { command, reply };
    if let Err(mpsc::SendError(mut request)) = spawner.send(request) {
        return request.command.spawn();
    }
    answer
        .recv()
        .unwrap_or_else(|_| Err(io::Error::other("the spawner thread ended")))
}

/// The channel to the spawner thread, started on first use; `None` if it could not start.
fn spawner() -> Option<&'static mpsc::Sender<SpawnRequest>> {
    static SPAWNER: OnceLock<Option<mpsc::Sender<SpawnRequest>>> = OnceLock::new();
    SPAWNER
        .get_or_init(|| {
            let (sender, requests) = mpsc::channel::<SpawnRequest>();
            let thread = std::thread::Builder::new()
                .name("jetshard-testkit-spawner".to_owned())
                .spawn(move || {
                    for mut request in requests {
                        // The test waiting for this answer may have gone; nothing to do then.
                        let _ = request.reply.send(request.command.spawn());
                    }
                });
            thread.ok().map(|_| sender)
        })
        .as_ref()
}

/// Makes the kernel SIGKILL `command`'s process when the thread that forks it ends (Linux;
/// nothing elsewhere).
#[cfg(target_os = "linux")]
pub(crate) fn die_with_parent(command: &mut Command) {
    use std::os::unix::process::CommandExt;
    let parent = libc::pid_t::try_from(std::process::id()).unwrap_or(0);
    // SAFETY: the closure runs between fork and exec and only makes async-signal-safe
    // system calls (prctl, getppid); it allocates nothing.
    unsafe {
        command.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(io::Error::last_os_error());
            }
            // The parent may have died before prctl took effect: then nobody would kill us.
            if libc::getppid() != parent {
                return Err(io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        });
    }
}

#[cfg(not(target_os = "linux"))]
pub(crate) fn die_with_parent(_command: &mut Command) {}
