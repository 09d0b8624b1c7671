//! The control-plane listener a local task inherits from the launcher: the launcher binds a
//! free port for each task and keeps the listener, so no other process can take the port
//! between its choice and the task's start (or a restarted task's); the task takes the
//! listener over instead of binding the port again.

use std::net::TcpListener;

/// The variable that names, in a task the launcher started, the file descriptor of the
/// control-plane listener the launcher bound for it.
pub const CONTROL_FD: &str = "TRAINRUN_CONTROL_FD";

/// The listener on `address` that the launcher handed down as `fd` ([`CONTROL_FD`]); `None`
/// when `fd` is not a listening socket on that address's port (the task then binds itself).
pub fn inherited_listener(fd: &str, address: &str) -> Option<TcpListener> {
    use std::os::fd::{FromRawFd, RawFd};
    let fd: RawFd = fd.parse().ok().filter(|fd| *fd > 2)?;
    let (mut listening, mut len): (libc::c_int, libc::socklen_t) = (0, size_of::<libc::c_int>() as libc::socklen_t);
    // SAFETY: getsockopt writes at most `len` bytes into `listening`; on a descriptor that is
    // not a socket it fails and writes nothing.
    let asked = unsafe {
        libc::getsockopt(fd, libc::SOL_SOCKET, libc::SO_ACCEPTCONN, (&raw mut listening).cast(), &raw mut len)
    };
    if asked != 0 || listening == 0 {
        return None;
    }
    // SAFETY: `fd` is an open listening socket this process inherited, owned by nothing else
    // here; from now on the listener owns it. The launcher cleared its close-on-exec flag to
    // hand it down: set it again, so it goes no further.
    let listener = unsafe {
        libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC);
        TcpListener::from_raw_fd(fd)
    };
    let port: u16 = address.rsplit_once(':')?.1.parse().ok()?;
    (listener.local_addr().ok()?.port() == port).then_some(listener)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::{AsRawFd, IntoRawFd};

    #[test]
    fn only_a_listener_on_the_tasks_port_is_taken_over() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let fd = listener.into_raw_fd();
        let taken = inherited_listener(&fd.to_string(), &format!("127.0.0.1:{port}")).expect("the listener");
        assert_eq!(taken.local_addr().unwrap().port(), port);
        assert_eq!(taken.as_raw_fd(), fd);

        let other = TcpListener::bind("127.0.0.1:0").unwrap().into_raw_fd();
        assert!(inherited_listener(&other.to_string(), &format!("127.0.0.1:{port}")).is_none(), "another port");
        let file = std::fs::File::open("Cargo.toml").unwrap();
        assert!(inherited_listener(&file.as_raw_fd().to_string(), &format!("127.0.0.1:{port}")).is_none(), "a file");
        for junk in ["", "x", "-1", "1", "99999"] {
            assert!(inherited_listener(junk, &format!("127.0.0.1:{port}")).is_none(), "{junk:?}");
        }
    }
}
