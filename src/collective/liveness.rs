//! Is a peer's process still there? Shared memory has no connection that breaks when a peer
//! dies, so a waiting rank looks at the peer's pid instead.

use std::fs;
use std::io;

/// Whether the process `pid` has exited. A pid of 0 or beyond the kernel's range (a header
/// never written, or garbage) counts as exited. A zombie counts as exited too: a killed child
/// stays one until its parent reaps it, and `kill(pid, 0)` still succeeds on it.
pub(crate) fn process_exited(pid: u64) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return true;
    };
    if pid <= 0 {
        return true;
    }
    // SAFETY: signal 0 sends nothing; the kernel only checks that the process exists.
    let r = unsafe { libc::kill(pid, 0) };
    if r == -1 && io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH) {
        return true;
    }
    match fs::read(format!("/proc/{pid}/stat")) {
        // The state letter follows the last ')' (the command name may contain one).
        Ok(stat) => {
            let state = stat.iter().rposition(|&b| b == b')').and_then(|i| stat.get(i + 2).copied());
            matches!(state, Some(b'Z' | b'X'))
        }
        Err(e) => e.kind() == io::ErrorKind::NotFound,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    #[test]
    fn sees_itself_alive_and_a_reaped_or_zombie_child_gone() {
        assert!(!process_exited(std::process::id() as u64));
        assert!(process_exited(0));
        assert!(process_exited(u64::MAX));
        let Ok(mut child) = Command::new("sleep").arg("30").spawn() else {
            return;
        };
        let pid = child.id() as u64;
        assert!(!process_exited(pid));
        let _ = child.kill();
        // Not reaped yet: a zombie.
        let t = std::time::Instant::now();
        while !process_exited(pid) && t.elapsed().as_secs() < 5 {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert!(process_exited(pid));
        let _ = child.wait();
        assert!(process_exited(pid));
    }
}
