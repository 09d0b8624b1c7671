//! Starting and watching a group of peer processes ([`super::peer`]): the benchmark and the
//! multi-process tests use it. A dropped group kills and reaps whatever still runs and
//! removes its shared-memory segment, so no test leaves processes or files behind.

use super::peer::{
    ENV_ALGORITHM, ENV_CONNECT_TIMEOUT_MS, ENV_HOSTS, ENV_ITERS, ENV_MODE, ENV_OP_TIMEOUT_MS, ENV_RANK, ENV_SHM_PATH,
    ENV_SIZES, ENV_TLS_CA, ENV_TLS_CERT, ENV_TLS_KEY, ENV_WIRE, ENV_WORLD, PeerMode, Wire,
};
use super::{Algorithm, CollectiveTimeouts};
use std::ffi::OsString;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

/// Which program to start as a peer, with which arguments: this binary with none in
/// production, a test binary filtered to its peer entry in tests.
#[derive(Debug, Clone)]
pub struct Launcher {
    pub program: PathBuf,
    pub args: Vec<OsString>,
}

impl Launcher {
    /// This very executable, no arguments.
    pub fn current_exe() -> io::Result<Launcher> {
        Ok(Launcher { program: std::env::current_exe()?, args: Vec::new() })
    }

    /// This test binary running only its test `entry`, the peer's body, which exits before
    /// the harness reports: how multi-process tests start their peers.
    pub fn test_entry(entry: &str) -> io::Result<Launcher> {
        let args = [entry, "--exact", "--nocapture", "--test-threads=1"].map(OsString::from).to_vec();
        Ok(Launcher { program: std::env::current_exe()?, args })
    }
}

/// What every peer of a group does.
#[derive(Debug, Clone)]
pub struct PeerSpec {
    /// Unique among groups running at once; names the shared-memory segment.
    pub label: String,
    pub mode: PeerMode,
    pub wire: Wire,
    pub world: usize,
    /// Float counts.
    pub sizes: Vec<usize>,
    pub iters: usize,
    pub timeouts: CollectiveTimeouts,
}

/// How one peer ended.
#[derive(Debug, Clone)]
pub struct PeerOutcome {
    pub rank: usize,
    /// Exit code, `None` when a signal ended it or it was still running at the deadline.
    pub code: Option<i32>,
    /// `TRAINRUN-…` lines it printed.
    pub lines: Vec<String>,
    pub stderr: String,
}

#[derive(Debug, thiserror::Error)]
pub enum GroupError {
    #[error("cannot start peer {rank} ({program}): {source}")]
    Spawn {
        rank: usize,
        program: String,
        #[source]
        source: io::Error,
    },
    #[error("peer {rank} did not report its TCP address within {secs} s; its stderr: {stderr}")]
    NoAddress { rank: usize, secs: u64, stderr: String },
    #[error("cannot make the peers' TLS certificates: {0}")]
    Certificates(String),
    #[error("cannot send the address list to peer {rank}: {source}")]
    Addresses {
        rank: usize,
        #[source]
        source: io::Error,
    },
}

/// A running group of peers.
pub struct PeerGroup {
    children: Vec<Child>,
    stdins: Vec<Option<ChildStdin>>,
    lines: mpsc::Receiver<(usize, String)>,
    seen: Vec<Vec<String>>,
    stderr: Vec<Option<JoinHandle<String>>>,
    shm_path: PathBuf,
    /// The per-host segments of [`Wire::Routed`].
    host_segments: Vec<PathBuf>,
}

impl PeerGroup {
    /// Starts `spec.world` peers running the wire's usual algorithm
    /// ([`Wire::usual_algorithm`]); for TCP, also brokers their addresses.
    pub fn spawn(launcher: &Launcher, spec: &PeerSpec) -> Result<PeerGroup, GroupError> {
        PeerGroup::spawn_with(launcher, spec, spec.wire.usual_algorithm())
    }

    /// Starts `spec.world` peers running `algorithm`; under TLS they share a CA and a
    /// certificate made for them.
    pub fn spawn_with(launcher: &Launcher, spec: &PeerSpec, algorithm: Algorithm) -> Result<PeerGroup, GroupError> {
        PeerGroup::spawn_on_hosts(launcher, spec, algorithm, &vec![0; spec.world])
    }

    /// Starts `spec.world` peers running `algorithm`, rank r told it runs on host `hosts[r]`
    /// (with [`Wire::Routed`], ranks of one host share a segment, hosts talk over TCP).
    pub fn spawn_on_hosts(
        launcher: &Launcher,
        spec: &PeerSpec,
        algorithm: Algorithm,
        hosts: &[usize],
    ) -> Result<PeerGroup, GroupError> {
        let shm_path = PathBuf::from(format!("/dev/shm/trainrun-{}-{}", spec.label, std::process::id()));
        let mut distinct = hosts.to_vec();
        distinct.sort_unstable();
        distinct.dedup();
        let host_segments = distinct.iter().map(|h| PathBuf::from(format!("{}-host{h}", shm_path.display()))).collect();
        let hosts: Vec<String> = hosts.iter().map(usize::to_string).collect();
        let sizes: Vec<String> = spec.sizes.iter().map(|s| s.to_string()).collect();
        let tls: Vec<(&str, String)> = match spec.wire {
            Wire::TcpTls => {
                let [cert, key, ca] = pems().map_err(|e| GroupError::Certificates(e.to_string()))?;
                vec![(ENV_TLS_CERT, cert), (ENV_TLS_KEY, key), (ENV_TLS_CA, ca)]
            }
            Wire::Shm | Wire::ShmArena | Wire::Tcp | Wire::Routed => Vec::new(),
        };
        let (tx, lines) = mpsc::channel();
        let mut group = PeerGroup {
            children: Vec::new(),
            stdins: Vec::new(),
            lines,
            seen: vec![Vec::new(); spec.world],
            stderr: Vec::new(),
            shm_path,
            host_segments,
        };
        for rank in 0..spec.world {
            let mut child = Command::new(&launcher.program)
                .args(&launcher.args)
                .env(ENV_MODE, spec.mode.as_str())
                .env(ENV_RANK, rank.to_string())
                .env(ENV_WORLD, spec.world.to_string())
                .env(ENV_WIRE, spec.wire.as_str())
                .env(ENV_ALGORITHM, algorithm.name())
                .env(ENV_HOSTS, hosts.join(","))
                .envs(tls.iter().map(|(k, v)| (k, v)))
                .env(ENV_SHM_PATH, &group.shm_path)
                .env(ENV_SIZES, sizes.join(","))
                .env(ENV_ITERS, spec.iters.to_string())
                .env(ENV_OP_TIMEOUT_MS, spec.timeouts.op.as_millis().to_string())
                .env(ENV_CONNECT_TIMEOUT_MS, spec.timeouts.connect.as_millis().to_string())
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .map_err(|source| GroupError::Spawn {
                    rank,
                    program: launcher.program.display().to_string(),
                    source,
                })?;
            if let Some(out) = child.stdout.take() {
                let tx = tx.clone();
                thread::spawn(move || {
                    for line in BufReader::new(out).lines().map_while(Result::ok) {
                        // A test harness may print its own text ahead of ours on a line.
                        let Some(at) = line.find("TRAINRUN-") else {
                            continue;
                        };
                        if tx.send((rank, line[at..].to_string())).is_err() {
                            break;
                        }
                    }
                });
            }
            group.stderr.push(child.stderr.take().map(|mut err| {
                thread::spawn(move || {
                    let mut s = String::new();
                    let _ = err.read_to_string(&mut s);
                    s
                })
            }));
            group.stdins.push(child.stdin.take());
            group.children.push(child);
        }
        match spec.wire {
            Wire::Tcp | Wire::TcpTls | Wire::Routed => group.broker_addresses(spec)?,
            Wire::Shm | Wire::ShmArena => {}
        }
        Ok(group)
    }

    fn broker_addresses(&mut self, spec: &PeerSpec) -> Result<(), GroupError> {
        let mut addrs = vec![String::new(); spec.world];
        for (rank, addr) in addrs.iter_mut().enumerate() {
            let line = self.wait_for_line(rank, "TRAINRUN-PORT ", spec.timeouts.connect);
            let Some(line) = line else {
                let stderr = self.kill_all_and_collect_stderr(rank);
                return Err(GroupError::NoAddress { rank, secs: spec.timeouts.connect.as_secs(), stderr });
            };
            *addr = line.trim_start_matches("TRAINRUN-PORT ").to_string();
        }
        let list = format!("TRAINRUN-ADDRS {}\n", addrs.join(","));
        for (rank, stdin) in self.stdins.iter_mut().enumerate() {
            if let Some(mut s) = stdin.take() {
                s.write_all(list.as_bytes()).map_err(|source| GroupError::Addresses { rank, source })?;
            }
        }
        Ok(())
    }

    fn kill_all_and_collect_stderr(&mut self, rank: usize) -> String {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        self.stderr.get_mut(rank).and_then(Option::take).and_then(|h| h.join().ok()).unwrap_or_default()
    }

    /// The process id of a peer.
    pub fn pid(&self, rank: usize) -> Option<u32> {
        self.children.get(rank).map(Child::id)
    }

    /// SIGKILLs a peer and leaves it unreaped (a zombie) until the group finishes, the way a
    /// launcher that is busy elsewhere would.
    pub fn kill(&mut self, rank: usize) -> io::Result<()> {
        match self.children.get_mut(rank) {
            Some(c) => c.kill(),
            None => Err(io::Error::new(io::ErrorKind::NotFound, format!("no peer {rank}"))),
        }
    }

    /// Waits until `rank` prints a line starting with `prefix`; returns it.
    pub fn wait_for_line(&mut self, rank: usize, prefix: &str, timeout: Duration) -> Option<String> {
        let deadline = Instant::now() + timeout;
        if let Some(l) = self.seen.get(rank)?.iter().find(|l| l.starts_with(prefix)) {
            return Some(l.clone());
        }
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let (r, line) = self.lines.recv_timeout(left).ok()?;
            self.seen.get_mut(r)?.push(line.clone());
            if r == rank && line.starts_with(prefix) {
                return Some(line);
            }
        }
    }

    /// Waits for every peer to exit, up to `timeout` in all, kills the ones still running,
    /// and reports how each ended.
    pub fn finish(mut self, timeout: Duration) -> Vec<PeerOutcome> {
        let deadline = Instant::now() + timeout;
        let mut codes = vec![None; self.children.len()];
        for (rank, child) in self.children.iter_mut().enumerate() {
            loop {
                match child.try_wait() {
                    Ok(Some(status)) => {
                        codes[rank] = status.code();
                        break;
                    }
                    Ok(None) if Instant::now() < deadline => thread::sleep(Duration::from_millis(5)),
                    _ => {
                        let _ = child.kill();
                        let _ = child.wait();
                        break;
                    }
                }
            }
        }
        // Every child has exited, so its stdout reader ends and the channel drains fully.
        for stdin in &mut self.stdins {
            stdin.take();
        }
        while let Ok((r, line)) = self.lines.recv_timeout(Duration::from_millis(200)) {
            if let Some(seen) = self.seen.get_mut(r) {
                seen.push(line);
            }
        }
        let stderr: Vec<String> =
            self.stderr.iter_mut().map(|h| h.take().and_then(|h| h.join().ok()).unwrap_or_default()).collect();
        codes
            .into_iter()
            .zip(stderr)
            .enumerate()
            .map(|(rank, (code, stderr))| PeerOutcome {
                rank,
                code,
                lines: std::mem::take(&mut self.seen[rank]),
                stderr,
            })
            .collect()
    }
}

/// A CA and a certificate it signed for `localhost`, as PEM: (certificate, key, CA).
fn pems() -> Result<[String; 3], rcgen::Error> {
    use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
    let mut ca = CertificateParams::new(Vec::<String>::new())?;
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let issuer = CertifiedIssuer::self_signed(ca, KeyPair::generate()?)?;
    let key = KeyPair::generate()?;
    let cert = CertificateParams::new(vec!["localhost".to_string()])?.signed_by(&key, &issuer)?;
    Ok([cert.pem(), key.serialize_pem(), issuer.pem()])
}

impl Drop for PeerGroup {
    fn drop(&mut self) {
        for c in &mut self.children {
            if matches!(c.try_wait(), Ok(None)) {
                let _ = c.kill();
            }
            let _ = c.wait();
        }
        for path in std::iter::once(&self.shm_path).chain(&self.host_segments) {
            let _ = std::fs::remove_file(path);
        }
    }
}
