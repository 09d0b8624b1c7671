//! The worker side of benchmarks and multi-process tests: a process started with
//! `TRAINRUN_COLLECTIVE_PEER` set joins a communicator described by environment variables,
//! does what the mode says, reports on stdout in `TRAINRUN-…` lines, and exits.
//! [`super::group::PeerGroup`] is the other end.
//!
//! TCP needs addresses nobody knows in advance: each peer binds `127.0.0.1:0`, prints
//! `TRAINRUN-PORT <addr>`, and reads `TRAINRUN-ADDRS <a0>,<a1>,…` from stdin. TCP under TLS
//! also takes a CA and a certificate for `localhost` that every peer shares, as PEM text in
//! the environment.

use super::choice::SizeChoice;
use super::cost::{CostModel, Placement};
use super::probe::{self, AutoBySize};
use super::reduce::sequential_sum;
use super::{
    Algorithm, Collective, CollectiveTimeouts, Communicator, Peers, RingTls, ShmOptions, TcpOptions, TlsPeers,
    Transport,
};
use std::collections::BTreeMap;
use std::io::{self, BufRead, Write};
use std::net::{SocketAddr, TcpListener};
use std::process::ExitCode;
use std::str::FromStr;
use std::time::Duration;

mod bench_mode;

pub(crate) const ENV_MODE: &str = "TRAINRUN_COLLECTIVE_PEER";
pub const ENV_RANK: &str = "TRAINRUN_COLLECTIVE_RANK";
pub(crate) const ENV_WORLD: &str = "TRAINRUN_COLLECTIVE_WORLD";
pub(crate) const ENV_WIRE: &str = "TRAINRUN_COLLECTIVE_TRANSPORT";
pub(crate) const ENV_SHM_PATH: &str = "TRAINRUN_COLLECTIVE_SHM_PATH";
pub(crate) const ENV_SIZES: &str = "TRAINRUN_COLLECTIVE_SIZES";
pub(crate) const ENV_ITERS: &str = "TRAINRUN_COLLECTIVE_ITERS";
pub(crate) const ENV_OP_TIMEOUT_MS: &str = "TRAINRUN_COLLECTIVE_OP_TIMEOUT_MS";
pub(crate) const ENV_CONNECT_TIMEOUT_MS: &str = "TRAINRUN_COLLECTIVE_CONNECT_TIMEOUT_MS";
/// The algorithm ([`Algorithm::name`]); the wire's usual one when unset.
pub(crate) const ENV_ALGORITHM: &str = "TRAINRUN_COLLECTIVE_ALGORITHM";
/// The host index of every rank, comma-separated (`0,0,1,1`); every rank on host 0 when
/// unset.
pub(crate) const ENV_HOSTS: &str = "TRAINRUN_COLLECTIVE_HOSTS";
/// PEM text of the certificate, key and CA every peer uses under TLS.
pub(crate) const ENV_TLS_CERT: &str = "TRAINRUN_COLLECTIVE_TLS_CERT";
pub(crate) const ENV_TLS_KEY: &str = "TRAINRUN_COLLECTIVE_TLS_KEY";
pub(crate) const ENV_TLS_CA: &str = "TRAINRUN_COLLECTIVE_TLS_CA";
/// Optional tuning knobs: shared-memory staging bytes per rank, TCP segment and socket buffer
/// bytes.
pub(crate) const ENV_STAGING: &str = "TRAINRUN_COLLECTIVE_STAGING_BYTES";
pub(crate) const ENV_SEGMENT: &str = "TRAINRUN_COLLECTIVE_SEGMENT_BYTES";
pub(crate) const ENV_SOCKET_BUFFER: &str = "TRAINRUN_COLLECTIVE_SOCKET_BUFFER_BYTES";
/// The address a TCP peer listens on: 127.0.0.1 unless set (a peer in a network namespace of
/// its own listens on that namespace's address, `bench --only scale`).
pub const ENV_HOST: &str = "TRAINRUN_COLLECTIVE_HOST";
/// `1`: the peer runs as `implementation = "auto"` does: connected for every algorithm the
/// wire carries, the cost model measured at start-up, each size the algorithm it picks
/// (rank 0 says which, `TRAINRUN-AUTO <bytes> <algorithm>`, after the model's figures,
/// `TRAINRUN-MODEL <text>`). In bench mode it also times every candidate in turn with `auto`
/// ([`PeerMode::Bench`]).
pub const ENV_AUTO: &str = "TRAINRUN_COLLECTIVE_AUTO";

/// Exit codes of a peer process.
pub const EXIT_OK: u8 = 0;
/// The environment did not describe a peer correctly.
pub const EXIT_USAGE: u8 = 2;
/// A collective failed; stderr has the error.
pub const EXIT_COLLECTIVE: u8 = 3;
/// Verify mode found a wrong sum.
pub const EXIT_WRONG_SUM: u8 = 4;

/// What a peer process does once connected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeerMode {
    /// Times all-reduces of each size; rank 0 prints `TRAINRUN-RESULT <bytes> <median s> <min s>`.
    /// Under `auto` ([`ENV_AUTO`]) it also times every candidate algorithm, the turns taking
    /// blocks of calls in a rotating order ([`schedule`]), and rank 0 prints each as
    /// `TRAINRUN-BESIDE <algorithm> <bytes> <median s> <min s>`: the same processes and links as
    /// `auto`'s row, so the two differ by the choice alone.
    Bench,
    /// All-reduces the first size over and over (printing `TRAINRUN-READY` after the first),
    /// for `iters` rounds or until an error: something to kill mid-collective.
    Soak,
    /// All-reduces seeded data of each size, checks it against the sequential sum and prints
    /// `TRAINRUN-SUM <bytes> <hash of the result bits>`.
    Verify,
    /// Times a synthetic backward over an arena of the first size alone, then followed by an
    /// all-reduce, then overlapped with it through [`super::BucketReducer`] with packs of each
    /// further size (floats); rank 0 prints `TRAINRUN-OVERLAP <label> <median s>`.
    Overlap,
}

/// How the peers talk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wire {
    /// Shared memory, through `all_reduce_sum` (a copy in and out).
    Shm,
    /// Shared memory, zero-copy through the arena.
    ShmArena,
    /// TCP over loopback.
    Tcp,
    /// TCP over loopback under mutual TLS.
    TcpTls,
    /// Shared memory among the ranks given one host, TCP over loopback across "hosts"
    /// ([`super::PeerGroup::spawn_on_hosts`]).
    Routed,
}

impl Wire {
    pub fn as_str(self) -> &'static str {
        match self {
            Wire::Shm => "shm",
            Wire::ShmArena => "shm-arena",
            Wire::Tcp => "tcp",
            Wire::TcpTls => "tcp-tls",
            Wire::Routed => "shm+tcp",
        }
    }

    /// The algorithm [`Collective::connect`] runs over it.
    pub fn usual_algorithm(self) -> Algorithm {
        match self {
            Wire::Shm | Wire::ShmArena => Algorithm::Direct,
            Wire::Tcp | Wire::TcpTls => Algorithm::Ring,
            Wire::Routed => Algorithm::Hierarchical,
        }
    }

    /// The transport it is.
    pub fn kind(self) -> super::TransportKind {
        match self {
            Wire::Shm | Wire::ShmArena => super::TransportKind::SharedMemory,
            Wire::Tcp => super::TransportKind::Tcp,
            Wire::TcpTls => super::TransportKind::TcpTls,
            Wire::Routed => super::TransportKind::SharedMemoryAndTcp,
        }
    }

    /// Whether `algorithm` can run over it: the arena is the `direct` algorithm's alone.
    pub fn carries(self, algorithm: Algorithm) -> bool {
        match self {
            Wire::ShmArena => algorithm == Algorithm::Direct,
            Wire::Shm | Wire::Tcp | Wire::TcpTls => algorithm.refuses(self.kind()).is_none(),
            // The flat algorithms run over it as over TCP (`HostRoute::Network`): no rows of
            // their own.
            Wire::Routed => algorithm == Algorithm::Hierarchical,
        }
    }
}

impl FromStr for Wire {
    type Err = String;
    fn from_str(s: &str) -> Result<Wire, String> {
        [Wire::Shm, Wire::ShmArena, Wire::Tcp, Wire::TcpTls, Wire::Routed]
            .into_iter()
            .find(|w| w.as_str() == s)
            .ok_or_else(|| format!("unknown transport {s:?}; use shm, shm-arena, tcp, tcp-tls or shm+tcp"))
    }
}

impl PeerMode {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            PeerMode::Bench => "bench",
            PeerMode::Soak => "soak",
            PeerMode::Verify => "verify",
            PeerMode::Overlap => "overlap",
        }
    }
}

/// Everything a peer reads from its environment, parsed once.
#[derive(Debug, Clone)]
struct PeerEnv {
    mode: PeerMode,
    rank: usize,
    world: usize,
    wire: Wire,
    algorithm: Algorithm,
    /// The host of every rank.
    hosts: Vec<usize>,
    /// Certificate, key and CA (PEM) under TLS.
    tls: Option<[String; 3]>,
    shm_path: String,
    sizes: Vec<usize>,
    iters: usize,
    timeouts: CollectiveTimeouts,
    staging_bytes: Option<usize>,
    segment_bytes: Option<usize>,
    socket_buffer_bytes: Option<usize>,
    host: String,
}

fn parse<T: FromStr>(get: &impl Fn(&str) -> Option<String>, key: &str) -> Result<T, String> {
    let v = get(key).ok_or_else(|| format!("{key} is not set"))?;
    v.trim().parse().map_err(|_| format!("{key}={v:?} is not a valid value"))
}

impl PeerEnv {
    /// Reads the peer description through `get` (the environment, in production).
    fn from_vars(get: impl Fn(&str) -> Option<String>) -> Result<Option<PeerEnv>, String> {
        let Some(mode) = get(ENV_MODE) else {
            return Ok(None);
        };
        let mode = [PeerMode::Bench, PeerMode::Soak, PeerMode::Verify, PeerMode::Overlap]
            .into_iter()
            .find(|m| m.as_str() == mode)
            .ok_or_else(|| format!("{ENV_MODE}={mode:?}: use bench, soak, verify or overlap"))?;
        let sizes = get(ENV_SIZES).unwrap_or_default();
        let sizes = sizes
            .split(',')
            .filter(|s| !s.is_empty())
            .map(|s| s.parse().map_err(|_| format!("{ENV_SIZES}: {s:?} is not a count of floats")))
            .collect::<Result<Vec<usize>, String>>()?;
        let ms = |key: &str| parse::<u64>(&get, key).map(Duration::from_millis);
        let wire: Wire = parse(&get, ENV_WIRE)?;
        let algorithm = match get(ENV_ALGORITHM) {
            None => wire.usual_algorithm(),
            Some(name) => {
                Algorithm::from_name(&name).ok_or_else(|| format!("{ENV_ALGORITHM}={name:?} is no algorithm"))?
            }
        };
        let world: usize = parse(&get, ENV_WORLD)?;
        let hosts = match get(ENV_HOSTS) {
            None => vec![0; world],
            Some(list) => list
                .split(',')
                .map(|h| h.trim().parse().map_err(|_| format!("{ENV_HOSTS}: {h:?} is not a host index")))
                .collect::<Result<Vec<usize>, String>>()?,
        };
        let tls = match (get(ENV_TLS_CERT), get(ENV_TLS_KEY), get(ENV_TLS_CA)) {
            (Some(cert), Some(key), Some(ca)) => Some([cert, key, ca]),
            _ if wire == Wire::TcpTls => {
                return Err(format!("{ENV_WIRE}=tcp-tls needs {ENV_TLS_CERT}, {ENV_TLS_KEY} and {ENV_TLS_CA}"));
            }
            _ => None,
        };
        Ok(Some(PeerEnv {
            mode,
            rank: parse(&get, ENV_RANK)?,
            world,
            wire,
            algorithm,
            hosts,
            tls,
            shm_path: get(ENV_SHM_PATH).unwrap_or_default(),
            sizes,
            iters: parse(&get, ENV_ITERS)?,
            timeouts: CollectiveTimeouts { connect: ms(ENV_CONNECT_TIMEOUT_MS)?, op: ms(ENV_OP_TIMEOUT_MS)? },
            staging_bytes: get(ENV_STAGING).map(|_| parse(&get, ENV_STAGING)).transpose()?,
            segment_bytes: get(ENV_SEGMENT).map(|_| parse(&get, ENV_SEGMENT)).transpose()?,
            socket_buffer_bytes: get(ENV_SOCKET_BUFFER).map(|_| parse(&get, ENV_SOCKET_BUFFER)).transpose()?,
            host: get(ENV_HOST).unwrap_or_else(|| "127.0.0.1".into()),
        }))
    }
}

/// For a binary's `main`, first thing: when this process was started as a collective peer
/// (by `trainrun bench` or a test), runs it and returns its exit code; otherwise `None`.
pub fn peer_main_from_env() -> Option<ExitCode> {
    peer_exit_code_from_env().map(ExitCode::from)
}

/// [`peer_main_from_env`] with the raw exit code (tests need it for `process::exit`).
pub fn peer_exit_code_from_env() -> Option<u8> {
    let env = match PeerEnv::from_vars(|k| std::env::var(k).ok()) {
        Ok(None) => return None,
        Ok(Some(env)) => env,
        Err(e) => {
            eprintln!("collective peer: {e}");
            return Some(EXIT_USAGE);
        }
    };
    Some(match run(&env) {
        Ok(()) => EXIT_OK,
        Err((code, message)) => {
            eprintln!("worker:{}: {message}", env.rank);
            code
        }
    })
}

pub(crate) fn say(line: &str) {
    // Straight to the stdout handle, not print!, which test harnesses capture.
    let mut out = io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

type PeerFailure = (u8, String);

fn collective(e: super::CollectiveError) -> PeerFailure {
    (EXIT_COLLECTIVE, e.to_string())
}

/// Under `auto`: the choice per size `auto` runs, and the candidates a bench times beside it.
struct AutoRun {
    runs: SizeChoice,
    beside: Vec<Algorithm>,
}

/// The communicator, and under `auto` what it runs.
fn connect(env: &PeerEnv, arena_floats: usize) -> Result<(Collective, Option<AutoRun>), PeerFailure> {
    let names = (0..env.world).map(|r| format!("worker:{r}")).collect();
    let peers = Peers::new(env.rank, names)
        .and_then(|p| p.on_hosts(env.hosts.clone()))
        .map_err(|e| (EXIT_USAGE, e.to_string()))?;
    let transport = match env.wire {
        Wire::Shm | Wire::ShmArena => {
            let defaults = ShmOptions::new(&env.shm_path);
            Transport::SharedMemory(ShmOptions {
                arena_bytes: if env.wire == Wire::ShmArena { arena_floats * 4 } else { 0 },
                staging_bytes: env.staging_bytes.unwrap_or(defaults.staging_bytes),
                ..defaults
            })
        }
        Wire::Tcp | Wire::TcpTls | Wire::Routed => {
            let listener =
                TcpListener::bind((env.host.as_str(), 0)).map_err(|e| (EXIT_USAGE, format!("cannot listen: {e}")))?;
            let me = listener.local_addr().map_err(|e| (EXIT_USAGE, e.to_string()))?;
            say(&format!("TRAINRUN-PORT {me}"));
            let mut line = String::new();
            io::stdin().lock().read_line(&mut line).map_err(|e| (EXIT_USAGE, format!("no address list: {e}")))?;
            let addrs = line
                .trim()
                .strip_prefix("TRAINRUN-ADDRS ")
                .ok_or_else(|| (EXIT_USAGE, format!("expected the address list, got {line:?}")))?
                .split(',')
                .map(|a| a.parse::<SocketAddr>().map_err(|e| (EXIT_USAGE, format!("address {a:?}: {e}"))))
                .collect::<Result<Vec<_>, _>>()?;
            let tls = match (&env.tls, env.wire) {
                (Some([cert, key, ca]), Wire::TcpTls) => Some(TlsPeers {
                    config: RingTls::new(cert.as_bytes(), key.as_bytes(), ca.as_bytes())
                        .map_err(|(file, e)| (EXIT_USAGE, format!("TLS {file:?}: {e}")))?,
                    names: vec!["localhost".to_string(); env.world],
                }),
                _ => None,
            };
            let defaults = TcpOptions::new(addrs, listener);
            let tcp = TcpOptions {
                segment_bytes: env.segment_bytes.unwrap_or(defaults.segment_bytes),
                socket_buffer_bytes: env.socket_buffer_bytes.or(defaults.socket_buffer_bytes),
                tls,
                ..defaults
            };
            match env.wire {
                // One segment per "host".
                Wire::Routed => {
                    let host = env.hosts.get(env.rank).copied().unwrap_or(0);
                    let shm = ShmOptions::new(format!("{}-host{host}", env.shm_path));
                    let staging_bytes = env.staging_bytes.unwrap_or(shm.staging_bytes);
                    Transport::Routed { shm: ShmOptions { staging_bytes, ..shm }, tcp }
                }
                Wire::Shm | Wire::ShmArena | Wire::Tcp | Wire::TcpTls => Transport::TcpRing(tcp),
            }
        }
    };
    if std::env::var(ENV_AUTO).as_deref() != Ok("1") {
        return Ok((Collective::build(peers, env.algorithm, transport, env.timeouts).map_err(collective)?, None));
    }
    let mut per_host = BTreeMap::<usize, usize>::new();
    for h in &env.hosts {
        *per_host.entry(*h).or_default() += 1;
    }
    let placement = Placement {
        ranks: env.world,
        hosts: per_host.len().max(1),
        per_host: per_host.values().copied().max().unwrap_or(1),
    };
    let choice = SizeChoice::over(CostModel::default(), env.wire.kind(), placement);
    if !choice.chooses() {
        // As a job's `auto` does: nothing to choose (two ranks), the transport's algorithm.
        if env.rank == 0 {
            for f in &env.sizes {
                say(&format!("TRAINRUN-AUTO {} {}", f * 4, env.algorithm.name()));
            }
        }
        let point_to_point = matches!(env.wire, Wire::Tcp | Wire::TcpTls | Wire::Routed);
        if env.mode != PeerMode::Bench || !point_to_point || choice.candidates.len() < 2 {
            return Ok((Collective::build(peers, env.algorithm, transport, env.timeouts).map_err(collective)?, None));
        }
        // Connected for the candidates too, to time them beside it: `auto`'s row is the
        // transport's algorithm throughout.
        let c = Collective::build_among(peers, env.algorithm, &choice.candidates, transport, env.timeouts)
            .map_err(collective)?;
        let beside = choice.candidates.clone();
        return Ok((c, Some(AutoRun { runs: choice.only(env.algorithm), beside })));
    }
    let mut c = Collective::build_among(peers, env.algorithm, &choice.candidates, transport, env.timeouts)
        .map_err(collective)?;
    let auto = AutoBySize {
        model: CostModel::default(),
        measure: true,
        placement,
        packs: env.sizes.iter().map(|f| f * 4).collect(),
    };
    let (choice, source) = probe::agree(&mut c, &auto, None).map_err(collective)?;
    if env.rank == 0 {
        say(&format!("TRAINRUN-MODEL {}", probe::describe(&choice, &source, &auto.packs)));
        for &bytes in &auto.packs {
            say(&format!("TRAINRUN-AUTO {bytes} {}", choice.pick(bytes).name()));
        }
    }
    c.choose_by_size(choice.clone()).map_err(collective)?;
    let beside = choice.candidates.clone();
    Ok((c, Some(AutoRun { runs: choice, beside })))
}

/// Seeded data, different per rank and size.
pub(crate) fn seeded(rank: usize, len: usize) -> Vec<f32> {
    let mut x = (rank as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ len as u64;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            ((x >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 2f32.powi((x % 8) as i32 - 4)
        })
        .collect()
}

/// All-reduces `data` through whichever path the wire names.
fn reduce(c: &mut Collective, wire: Wire, data: &mut [f32]) -> Result<(), PeerFailure> {
    match (wire, c) {
        (Wire::ShmArena, Collective::SharedMemory(s)) => {
            s.arena_mut()[..data.len()].copy_from_slice(data);
            s.all_reduce_arena(0..data.len()).map_err(collective)?;
            data.copy_from_slice(&s.arena_mut()[..data.len()]);
            Ok(())
        }
        (_, c) => c.all_reduce_sum(data).map_err(collective),
    }
}

fn run(env: &PeerEnv) -> Result<(), PeerFailure> {
    let biggest = env.sizes.iter().copied().max().unwrap_or(0);
    let (mut c, auto) = connect(env, biggest)?;
    match env.mode {
        PeerMode::Bench => bench_mode::bench(env, &mut c, auto.as_ref()),
        PeerMode::Soak => soak(env, &mut c),
        PeerMode::Verify => verify(env, &mut c),
        PeerMode::Overlap => super::overlap::measure(env.rank, env.world, env.wire, &env.sizes, env.iters, &mut c)
            .map(|rows| {
                if env.rank == 0 {
                    for (label, secs) in rows {
                        say(&format!("TRAINRUN-OVERLAP {label} {secs:e}"));
                    }
                }
            })
            .map_err(collective),
    }
}

fn soak(env: &PeerEnv, c: &mut Collective) -> Result<(), PeerFailure> {
    let mut data = seeded(env.rank, env.sizes.first().copied().unwrap_or(1));
    for i in 0..env.iters {
        data.fill(1.0);
        reduce(c, env.wire, &mut data)?;
        if i == 0 {
            say("TRAINRUN-READY");
        }
    }
    Ok(())
}

fn verify(env: &PeerEnv, c: &mut Collective) -> Result<(), PeerFailure> {
    let exact = env.algorithm.sums_in_rank_order(env.world);
    for &len in &env.sizes {
        let mut data = seeded(env.rank, len);
        reduce(c, env.wire, &mut data)?;
        let inputs: Vec<Vec<f32>> = (0..env.world).map(|r| seeded(r, len)).collect();
        let want = sequential_sum(&inputs);
        for (i, (g, w)) in data.iter().zip(&want).enumerate() {
            // Against the sum in f64: each of the N−1 additions rounds once, by at most ε of
            // the running sum, so the error is at most N·ε·Σ|x|.
            let exact_sum: f64 = inputs.iter().map(|x| f64::from(x[i])).sum();
            let scale: f64 = inputs.iter().map(|x| f64::from(x[i].abs())).sum();
            let close = (f64::from(*g) - exact_sum).abs() <= scale * env.world as f64 * f64::from(f32::EPSILON);
            // Rank-order algorithms give the plain sequential sum bit for bit.
            if !close || (exact && g.to_bits() != w.to_bits()) {
                return Err((
                    EXIT_WRONG_SUM,
                    format!("{len} floats: element {i} is {g}, the sequential sum is {w}, the f64 sum {exact_sum}"),
                ));
            }
        }
        let hash =
            data.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, x| (h ^ x.to_bits() as u64).wrapping_mul(0x100_0000_01b3));
        say(&format!("TRAINRUN-SUM {} {hash:016x}", len * 4));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn reads_its_description_from_the_given_variables() {
        let vars: HashMap<&str, &str> = [
            (ENV_MODE, "verify"),
            (ENV_RANK, "1"),
            (ENV_WORLD, "2"),
            (ENV_WIRE, "shm-arena"),
            (ENV_SHM_PATH, "/dev/shm/x"),
            (ENV_SIZES, "1,2"),
            (ENV_ITERS, "3"),
            (ENV_OP_TIMEOUT_MS, "1000"),
            (ENV_CONNECT_TIMEOUT_MS, "2000"),
        ]
        .into();
        let env = PeerEnv::from_vars(|k| vars.get(k).map(|v| v.to_string())).unwrap().unwrap();
        assert_eq!((env.mode, env.rank, env.world, env.wire), (PeerMode::Verify, 1, 2, Wire::ShmArena));
        assert_eq!(env.sizes, vec![1, 2]);
        assert_eq!(env.timeouts.op, Duration::from_secs(1));
        assert!(PeerEnv::from_vars(|_| None).unwrap().is_none());
        let err = PeerEnv::from_vars(|k| if k == ENV_MODE { Some("dance".into()) } else { None }).unwrap_err();
        assert!(err.contains("use bench, soak, verify or overlap"), "{err}");
    }
}
