//! A cluster on one machine: one network namespace per host, joined by a Linux bridge that
//! lives in a namespace of its own, host `h` at 10.213.0.(h + 1)/16. Every address is inside
//! namespaces this file makes, so nothing outside them (this machine's own 192.0.2.0/24, or
//! another run's cluster) can collide with them. Where the kernel has `sch_netem`, each host's
//! link is a veth on the bridge, shaped in both directions with `htb` (rate) and on the host's
//! end with `netem` (delay). Without it, each host's link is a TAP device and the harness's
//! own link emulator ([`super::link`]) switches the frames with the delay and at the rate, and
//! measures the round trip it really gives; where neither can run, the delay is reported as
//! not applied rather than silently dropped.
//!
//! Names carry the process id and a counter, so two runs at once do not collide. Dropping the
//! cluster kills every process inside its namespaces (`ip netns pids`: whoever started them),
//! stops the link emulator (closing its TAP devices removes them) and deletes the namespaces,
//! which takes their links and the bridge with them; a stop
//! request (SIGINT, SIGTERM) does the killing at once from a watcher thread, so a harness
//! waiting on its tasks returns and unwinds through the same drop. Needs root.

use super::link::{LinkEmulator, MTU, open_tap};
use super::rtt::tcp_round_trip;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// How each host's link is shaped: the rate and the delay, by `htb` and `netem` where the kernel
/// has `netem`, else by the link emulator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Profile {
    /// Its name in the tables.
    pub name: &'static str,
    /// Each link's rate in each direction, Mbit/s.
    pub rate_mbit: u32,
    /// One-way delay added between two hosts, µs (a round trip adds twice as much).
    pub delay_us: u32,
}

impl Profile {
    /// A data-centre link: 10 Gbit/s, 50 µs.
    pub const FAST: Profile = Profile { name: "10 Gbit/s", rate_mbit: 10_000, delay_us: 50 };
    /// A slower one: 1 Gbit/s, 200 µs.
    pub const SLOW: Profile = Profile { name: "1 Gbit/s", rate_mbit: 1_000, delay_us: 200 };
    /// Every profile the bench runs, fastest first.
    pub const ALL: [Profile; 2] = [Profile::FAST, Profile::SLOW];
}

/// Whether the profile's delay is on the links, and by what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Delay {
    /// By `netem` on each host's end of its link.
    Applied,
    /// By the link emulator, with the TCP round trip from host 0 to host 1 it measured without
    /// the delay and with it (`None` with one host).
    Emulated { round_trip: Option<(Duration, Duration)> },
    /// Why not, as printed with the results.
    NotApplied(String),
}

/// What shapes the links.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shaping {
    /// `netem` where the kernel has it, else the link emulator.
    Auto,
    /// The link emulator, even where the kernel has `netem` (to test it).
    Emulator,
}

#[derive(Debug, thiserror::Error)]
pub enum HostsError {
    /// Not root, or no `ip` command: the harness cannot run here.
    #[error(
        "cannot make a network namespace ({0}): the scale harness needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN) and iproute2's `ip` and `tc`"
    )]
    NoNamespaces(String),
    #[error("cannot set up the cluster: {0}")]
    Setup(String),
}

/// Runs `program args`; its stderr on failure.
fn command(program: &str, args: &[&str]) -> Result<String, String> {
    let out = Command::new(program).args(args).output().map_err(|e| format!("{program}: {e}"))?;
    match out.status.success() {
        true => Ok(String::from_utf8_lossy(&out.stdout).into_owned()),
        false => Err(format!("{program} {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim())),
    }
}

fn ip(args: &[&str]) -> Result<String, String> {
    command("ip", args)
}

/// `tc args` inside namespace `ns`.
fn tc(ns: &str, args: &[&str]) -> Result<String, String> {
    let all: Vec<&str> = ["netns", "exec", ns, "tc"].into_iter().chain(args.iter().copied()).collect();
    ip(&all)
}

/// SIGKILLs every process inside `namespaces`; how many there were.
pub fn kill_inside(namespaces: &[String]) -> usize {
    let mut killed = 0;
    for ns in namespaces {
        for pid in ip(&["netns", "pids", ns]).unwrap_or_default().split_whitespace() {
            if let Ok(pid) = pid.parse::<libc::pid_t>() {
                // SAFETY: kill(2) with a pid `ip` just listed; a pid that has exited since is ESRCH.
                unsafe { libc::kill(pid, libc::SIGKILL) };
                killed += 1;
            }
        }
    }
    killed
}

/// The namespaces on this machine that cluster `tag` made (after it is dropped: none).
pub fn leftovers(tag: &str) -> Vec<String> {
    let list = ip(&["netns", "list"]).unwrap_or_default();
    let mine = format!("{tag}-");
    list.lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| n.starts_with(&mine))
        .map(str::to_owned)
        .collect()
}

/// Removes what clusters of harnesses that no longer run left behind: a harness killed by
/// SIGKILL has no chance to clean up, so the next one does. A namespace's owner is the process
/// id in its name; while that process runs (another harness, or a process that reused the id)
/// its namespaces are left alone.
pub fn sweep_stale() {
    let owner = |name: &str| {
        let hex = name.strip_prefix("trs")?.split('x').next()?;
        u32::from_str_radix(hex, 16).ok()
    };
    let dead = |pid: u32| !std::path::Path::new(&format!("/proc/{pid}")).exists();
    let list = ip(&["netns", "list"]).unwrap_or_default();
    let stale: Vec<String> = list
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| owner(n).is_some_and(dead))
        .map(str::to_owned)
        .collect();
    kill_inside(&stale);
    for ns in &stale {
        let _ = ip(&["netns", "del", ns]);
    }
    let temp = std::env::temp_dir();
    for entry in std::fs::read_dir(&temp).into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.strip_prefix("trainrun-scale-").and_then(owner).is_some_and(dead) {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// The hosts of one run.
pub struct NamespaceHosts {
    /// In every name this cluster made: namespaces, its work folder.
    pub tag: String,
    pub profile: Profile,
    pub delay: Delay,
    switch: String,
    hosts: Vec<String>,
    /// The forwarding thread, when it makes the links.
    emulator: Option<LinkEmulator>,
    /// A folder for specs, logs and run records, removed with the cluster.
    work: tempfile::TempDir,
    /// Cleared on drop: ends the watcher.
    alive: Arc<AtomicBool>,
}

impl NamespaceHosts {
    /// `hosts` namespaces on a bridge, shaped by `profile`; when `stop` is set, a watcher kills
    /// whatever runs inside them.
    pub fn new(hosts: usize, profile: Profile, stop: &'static AtomicBool) -> Result<NamespaceHosts, HostsError> {
        NamespaceHosts::shaped(hosts, profile, Shaping::Auto, stop)
    }

    /// Like [`NamespaceHosts::new`], the links shaped as `shaping` says.
    pub fn shaped(
        hosts: usize,
        profile: Profile,
        shaping: Shaping,
        stop: &'static AtomicBool,
    ) -> Result<NamespaceHosts, HostsError> {
        static RUNS: AtomicU32 = AtomicU32::new(0);
        sweep_stale();
        let tag = format!("trs{:x}x{:x}", std::process::id(), RUNS.fetch_add(1, Ordering::Relaxed));
        let switch = format!("{tag}-sw");
        let work = tempfile::Builder::new()
            .prefix(&format!("trainrun-scale-{tag}-"))
            .tempdir()
            .map_err(|e| HostsError::Setup(format!("no temporary folder: {e}")))?;
        // The first namespace tells whether the harness can run here at all.
        ip(&["netns", "add", &switch]).map_err(HostsError::NoNamespaces)?;
        let mut cluster = NamespaceHosts {
            tag,
            profile,
            delay: Delay::Applied,
            switch,
            hosts: Vec::new(),
            emulator: None,
            work,
            alive: Arc::new(AtomicBool::new(true)),
        };
        let netem = match shaping {
            Shaping::Auto => cluster.kernel_has_netem(),
            Shaping::Emulator => Err("the link emulator was asked for".to_string()),
        };
        cluster.delay = match netem {
            Ok(()) => {
                cluster.wire(hosts).and_then(|()| cluster.shape()).map_err(HostsError::Setup)?;
                cluster.delay_hosts().map_err(HostsError::Setup)?
            }
            Err(no_netem) => match open_tap(&cluster.switch, "probe") {
                Ok(_) => cluster.emulate(hosts).map_err(HostsError::Setup)?,
                Err(e) => {
                    cluster.wire(hosts).and_then(|()| cluster.shape()).map_err(HostsError::Setup)?;
                    Delay::NotApplied(format!("{no_netem}, and no TAP device for the link emulator: {e}"))
                }
            },
        };
        cluster.watch(stop);
        Ok(cluster)
    }

    fn wire(&mut self, hosts: usize) -> Result<(), String> {
        let sw = self.switch.clone();
        ip(&["-n", &sw, "link", "add", "br0", "type", "bridge"])?;
        ip(&["-n", &sw, "link", "set", "br0", "up"])?;
        for h in 0..hosts {
            let ns = format!("{}-h{h}", self.tag);
            ip(&["netns", "add", &ns])?;
            self.hosts.push(ns.clone());
            let port = format!("p{h}");
            ip(&["-n", &sw, "link", "add", &port, "type", "veth", "peer", "name", "eth0", "netns", &ns])?;
            ip(&["-n", &sw, "link", "set", &port, "master", "br0", "up"])?;
            self.address(h)?;
        }
        Ok(())
    }

    /// Host `h`'s address on its `eth0`, which it brings up with its loopback.
    fn address(&self, h: usize) -> Result<(), String> {
        let ns = &self.hosts[h];
        ip(&["-n", ns, "addr", "add", &format!("{}/16", address(h)), "dev", "eth0"])?;
        ip(&["-n", ns, "link", "set", "eth0", "up"])?;
        ip(&["-n", ns, "link", "set", "lo", "up"]).map(drop)
    }

    /// Whether `tc` can add a `netem` qdisc here; why not.
    fn kernel_has_netem(&self) -> Result<(), String> {
        ip(&["-n", &self.switch, "link", "set", "lo", "up"])?;
        match tc(&self.switch, &["qdisc", "add", "dev", "lo", "root", "netem", "delay", "1us"]) {
            Ok(_) => tc(&self.switch, &["qdisc", "del", "dev", "lo", "root"]).map(drop),
            Err(e) if e.contains("Specified qdisc kind is unknown") => Err("no sch_netem in this kernel".into()),
            Err(e) => Err(e),
        }
    }

    /// The hosts' links as TAP devices that the link emulator switches, and the round trip
    /// it gives.
    fn emulate(&mut self, hosts: usize) -> Result<Delay, String> {
        let mut taps = Vec::new();
        for h in 0..hosts {
            let ns = format!("{}-h{h}", self.tag);
            ip(&["netns", "add", &ns])?;
            self.hosts.push(ns.clone());
            taps.push(open_tap(&ns, "eth0").map_err(|e| format!("a TAP device in {ns}: {e}"))?);
            ip(&["-n", &ns, "link", "set", "eth0", "mtu", &MTU.to_string()])?;
            self.address(h)?;
        }
        let delay = Duration::from_micros(u64::from(self.profile.delay_us));
        let emulator = LinkEmulator::start(taps, self.profile.rate_mbit, delay)
            .map_err(|e| format!("cannot start the link emulator: {e}"))?;
        let round_trip = match self.hosts.get(..2) {
            Some([a, b]) => {
                let probe = || tcp_round_trip(a, b, address(1).parse().map_err(std::io::Error::other)?);
                emulator.set_delay(Duration::ZERO);
                let without = probe().map_err(|e| format!("no round trip between the first two hosts: {e}"))?;
                emulator.set_delay(delay);
                let with = probe().map_err(|e| format!("no round trip between the first two hosts: {e}"))?;
                Some((without, with))
            }
            _ => None,
        };
        self.emulator = Some(emulator);
        Ok(Delay::Emulated { round_trip })
    }

    /// `htb` at the profile's rate on both ends of every host's link.
    fn shape(&self) -> Result<(), String> {
        let rate = format!("{}mbit", self.profile.rate_mbit);
        // A millisecond's worth of bytes: htb's default burst throttles a fast link below its rate.
        let burst = format!("{}k", (self.profile.rate_mbit / 8).max(16));
        let ends = self.hosts.iter().map(|ns| (ns.clone(), "eth0".to_string()));
        let ends: Vec<(String, String)> =
            ends.chain((0..self.hosts.len()).map(|h| (self.switch.clone(), format!("p{h}")))).collect();
        for (ns, dev) in &ends {
            tc(ns, &["qdisc", "add", "dev", dev, "root", "handle", "1:", "htb", "default", "10"])?;
            let class = ["class", "add", "dev", dev, "parent", "1:", "classid", "1:10", "htb", "rate", &rate];
            let all: Vec<&str> = class.into_iter().chain(["burst", &burst, "cburst", &burst]).collect();
            tc(ns, &all)?;
        }
        Ok(())
    }

    /// `netem` under `htb` on each host's end of its link: a frame between two hosts leaves
    /// one host through it once, so it is delayed once, as the link emulator delays it.
    fn delay_hosts(&self) -> Result<Delay, String> {
        let delay = format!("{}us", self.profile.delay_us);
        for ns in &self.hosts {
            tc(ns, &["qdisc", "add", "dev", "eth0", "parent", "1:10", "handle", "10:", "netem", "delay", &delay])?;
        }
        Ok(Delay::Applied)
    }

    /// Kills everything inside the namespaces once `stop` is set, until the cluster is dropped.
    fn watch(&self, stop: &'static AtomicBool) {
        let (alive, namespaces) = (self.alive.clone(), self.namespaces());
        std::thread::spawn(move || {
            while alive.load(Ordering::SeqCst) {
                if stop.load(Ordering::SeqCst) {
                    kill_inside(&namespaces);
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        });
    }

    /// Every namespace this cluster made, hosts first.
    pub fn namespaces(&self) -> Vec<String> {
        self.hosts.iter().chain([&self.switch]).cloned().collect()
    }

    /// The namespace of host `h`.
    pub fn host(&self, h: usize) -> &str {
        &self.hosts[h]
    }

    pub fn hosts(&self) -> usize {
        self.hosts.len()
    }

    /// The folder for specs, logs and records.
    pub fn work(&self) -> &std::path::Path {
        self.work.path()
    }

    /// The link settings, as printed with every result.
    pub fn settings(&self) -> String {
        let (hosts, rate, d) = (self.hosts.len(), self.profile.rate_mbit, self.profile.delay_us);
        let us = |t: Duration| t.as_secs_f64() * 1e6;
        match &self.delay {
            Delay::Applied => {
                format!("{hosts} hosts on one bridge, each link {rate} Mbit/s each way (htb), {d} µs one way (netem)")
            }
            Delay::NotApplied(why) => {
                format!(
                    "{hosts} hosts on one bridge, each link {rate} Mbit/s each way (htb), delay: not applied ({why})"
                )
            }
            Delay::Emulated { round_trip } => {
                let measured = match round_trip {
                    Some((without, with)) => format!(
                        "TCP round trip host 0 → 1: {:.0} µs without the delay, {:.0} µs with it (+{:.0} µs; 2 × delay = {})",
                        us(*without),
                        us(*with),
                        us(*with) - us(*without),
                        2 * d
                    ),
                    None => "round trip not measured (one host)".into(),
                };
                format!(
                    "{hosts} hosts on the harness's link emulator (TAP devices, MTU {MTU}; no sch_netem here), each link {rate} Mbit/s each way, {d} µs one way; {measured}"
                )
            }
        }
    }
}

/// Host `h`'s address.
pub fn address(h: usize) -> String {
    format!("10.213.{}.{}", (h + 1) / 256, (h + 1) % 256)
}

impl Drop for NamespaceHosts {
    fn drop(&mut self) {
        self.alive.store(false, Ordering::SeqCst);
        // Its TAP devices go with it.
        drop(self.emulator.take());
        let namespaces = self.namespaces();
        // Until nothing runs inside: a process killed between two listings, or started late.
        let deadline = Instant::now() + Duration::from_secs(5);
        while kill_inside(&namespaces) > 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        for ns in &namespaces {
            let _ = ip(&["netns", "del", ns]);
        }
    }
}
