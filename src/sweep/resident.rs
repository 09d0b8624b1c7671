//! Trials that stay resident between rungs. A scheduled sweep's trial trains to its rung and
//! writes everything a trial that exits there writes (backup, summary, `run.json`), then, instead
//! of exiting, says so on a control socket the driver handed it and waits: for an [`DriverOrder`] to
//! train on to a later rung, which it does in the same process, keeping its data and its
//! model's buffers, restoring from the backup it just wrote (so the bits are those of a process
//! started anew), or for the socket to close (the driver stopped it, or died), when it exits.
//! A trial killed while it waits is resumed from its backup by a new process, as one that exited.
//!
//! The socket is one end of a socket pair whose number the trial finds in [`CONTROL_VAR`]; the
//! trial says `paused` on a line of its own, the driver answers with an [`DriverOrder`] as a JSON line.

use serde::{Deserialize, Serialize};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;

/// The variable naming the descriptor of a trial's end of its control socket.
pub const CONTROL_VAR: &str = "TRAINRUN_SWEEP_CONTROL";

/// What a trial says when it has written its rung and waits.
pub const PAUSED: &str = "paused";

/// What the driver tells a paused trial.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum DriverOrder {
    /// Train on as a new process started with `command` would: the same spec with these
    /// `--set`s, under this environment (the trial's variable names the later rung's hash).
    Continue {
        /// The `--set`s, in order.
        sets: Vec<String>,
        /// The whole environment of the new launch.
        env: Vec<(String, String)>,
        /// The command line `run.json` records.
        command: Vec<String>,
    },
    /// Exit.
    Stop,
}

impl DriverOrder {
    /// The order as the line the driver writes.
    pub fn line(&self) -> String {
        serde_json::to_string(self).map_or_else(|_| "\"stop\"\n".to_string(), |s| s + "\n")
    }
}

/// A trial's end of its control socket.
pub struct TrialControl {
    stream: BufReader<UnixStream>,
}

impl TrialControl {
    /// The control socket `env` names, if this process was handed one: a descriptor above 2
    /// that is a socket. It is made close-on-exec, so it goes no further than this process.
    pub fn from_env(env: &[(String, String)]) -> Option<TrialControl> {
        use std::os::fd::{FromRawFd, RawFd};
        let fd: RawFd = env.iter().find(|(k, _)| k == CONTROL_VAR)?.1.parse().ok().filter(|fd| *fd > 2)?;
        let (mut kind, mut len): (libc::c_int, libc::socklen_t) = (0, size_of::<libc::c_int>() as libc::socklen_t);
        // SAFETY: getsockopt writes at most `len` bytes into `kind`; on a descriptor that is
        // not a socket it fails and writes nothing.
        let asked =
            unsafe { libc::getsockopt(fd, libc::SOL_SOCKET, libc::SO_TYPE, (&raw mut kind).cast(), &raw mut len) };
        if asked != 0 || kind != libc::SOCK_STREAM {
            return None;
        }
        // SAFETY: `fd` is an open stream socket this process inherited from the sweep driver,
        // owned by nothing else here; from now on the stream owns it.
        let stream = unsafe {
            libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC);
            UnixStream::from_raw_fd(fd)
        };
        Some(TrialControl { stream: BufReader::new(stream) })
    }

    /// Says the rung is written and waits for the next order; a closed or broken socket, or a
    /// line that is not an order, is [`DriverOrder::Stop`].
    pub fn pause(&mut self) -> DriverOrder {
        if writeln!(self.stream.get_mut(), "{PAUSED}").is_err() {
            return DriverOrder::Stop;
        }
        let mut line = String::new();
        match self.stream.read_line(&mut line) {
            Ok(n) if n > 0 => serde_json::from_str(line.trim()).unwrap_or(DriverOrder::Stop),
            Ok(_) | Err(_) => DriverOrder::Stop,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::IntoRawFd;

    #[test]
    fn a_paused_trial_hears_its_order_and_stops_when_the_socket_closes() {
        let (driver, trial) = UnixStream::pair().unwrap();
        let fd = trial.into_raw_fd();
        let env = vec![(CONTROL_VAR.to_string(), fd.to_string())];
        let mut control = TrialControl::from_env(&env).unwrap();
        let order = DriverOrder::Continue {
            sets: vec!["train.epochs=3".into()],
            env: vec![("A".into(), "b".into())],
            command: vec!["trainrun".into()],
        };
        let mut reader = BufReader::new(driver.try_clone().unwrap());
        let answer = std::thread::spawn({
            let order = order.clone();
            let mut driver = driver;
            move || {
                let mut said = String::new();
                reader.read_line(&mut said).unwrap();
                driver.write_all(order.line().as_bytes()).unwrap();
                said.clear();
                reader.read_line(&mut said).unwrap();
                said
            }
        });
        assert_eq!(control.pause(), order);
        // The driver hung up after the second `paused`.
        assert_eq!(control.pause(), DriverOrder::Stop);
        assert_eq!(answer.join().unwrap(), "paused\n");
    }

    #[test]
    fn only_an_inherited_socket_is_taken() {
        for bad in ["", "x", "1", "2", "-4", "999999"] {
            assert!(TrialControl::from_env(&[(CONTROL_VAR.to_string(), bad.to_string())]).is_none(), "{bad}");
        }
        let file = std::fs::File::open("/dev/null").unwrap();
        let fd = file.into_raw_fd();
        assert!(TrialControl::from_env(&[(CONTROL_VAR.to_string(), fd.to_string())]).is_none());
        // SAFETY: the descriptor opened above, refused and so still ours.
        drop(unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(fd) });
    }
}
