//! A link emulator in user space, for kernels without `sch_netem` (as VDE's `wirefilter`
//! does it): each namespace host's `eth0` is a TAP device, and one forwarding thread of the
//! harness switches the Ethernet frames between them (a learning switch: a frame goes to the
//! port its destination address was last seen on, or to every other port), delivering each
//! one a fixed one-way delay after it left its host and no faster than the link's rate, both
//! on the sender's link and on the receiver's. A frame that would queue more than
//! [`QUEUE_BYTES`] for one host is dropped, as a full queue in a switch drops it.
//!
//! Timing: the thread sleeps in `ppoll` until the next frame is due or a frame arrives, with
//! its timer slack at 1 ns (`PR_SET_TIMERSLACK`; the default 50 µs would be as large as the
//! delay), and spins the last [`SPIN`] before a frame is due. What it really adds is measured
//! ([`super::rtt`]) and printed beside the results.
//!
//! The TAP devices are opened by hand (`open("/dev/net/tun")`, `ioctl(TUNSETIFF)`) rather than
//! through a crate: it is one ioctl, and the crates that wrap it bring an async runtime or do
//! not open the device inside another network namespace, which the harness needs. The device
//! is made inside its host's namespace by a thread that enters it (`setns` changes only the
//! calling thread's namespace). A TAP device that is not persistent lives as long as its file
//! descriptor: dropping the emulator (or the harness dying, SIGKILL included) removes it.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The frames queued for one host, in bytes, beyond which a frame is dropped: a few times a
/// 10 Gbit/s link's bytes in flight at 100 µs.
pub const QUEUE_BYTES: usize = 4 << 20;

/// How long before a frame is due the thread stops sleeping and spins: a wake-up from
/// `ppoll` comes a few microseconds late even with 1 ns of slack.
pub const SPIN: Duration = Duration::from_micros(4);

/// The MTU of every emulated link: jumbo frames, as a data-centre network has them, so the
/// forwarding thread handles six times fewer frames than at 1500.
pub const MTU: u32 = 9000;

/// Runs `f` on a thread that has entered network namespace `ns` (`ip netns add`'s name), so
/// that sockets and devices it makes live there.
pub fn in_namespace<T: Send + 'static>(ns: &str, f: impl FnOnce() -> io::Result<T> + Send + 'static) -> io::Result<T> {
    let path = format!("/run/netns/{ns}");
    let handle = std::fs::File::open(&path).map_err(|e| io::Error::new(e.kind(), format!("{path}: {e}")))?;
    std::thread::spawn(move || {
        // SAFETY: setns(2) on an open namespace file; it changes this (short-lived) thread only.
        if unsafe { libc::setns(handle.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
            return Err(io::Error::last_os_error());
        }
        f()
    })
    .join()
    .map_err(|_| io::Error::other("the thread entering a namespace panicked"))?
}

/// Opens a TAP device called `name` inside namespace `ns`, nonblocking, frames without the
/// packet-information header.
pub fn open_tap(ns: &str, name: &str) -> io::Result<OwnedFd> {
    let name = name.to_string();
    in_namespace(ns, move || {
        // SAFETY: open(2) of a fixed path; the result is checked before use.
        let fd = unsafe { libc::open(c"/dev/net/tun".as_ptr(), libc::O_RDWR | libc::O_NONBLOCK | libc::O_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` was just opened and is owned by nothing else.
        let tap = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: an all-zero ifreq is valid (a C struct of integers and byte arrays).
        let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
        for (dst, src) in req.ifr_name.iter_mut().zip(name.bytes().take(libc::IFNAMSIZ - 1)) {
            *dst = src as libc::c_char;
        }
        req.ifr_ifru.ifru_flags = (libc::IFF_TAP | libc::IFF_NO_PI) as libc::c_short;
        // SAFETY: TUNSETIFF reads and writes the ifreq it is given, which outlives the call.
        if unsafe { libc::ioctl(tap.as_raw_fd(), libc::TUNSETIFF, &mut req) } < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(tap)
    })
}

/// One host's link as the switch sees it.
struct Port {
    tap: OwnedFd,
    /// When the host's link has finished sending the frames it sent so far.
    sent_by: Instant,
    /// When the last frame queued for the host reaches it.
    delivered_by: Instant,
    /// Frames for the host and when each is due, in order.
    queue: VecDeque<(Instant, Vec<u8>)>,
    queued: usize,
}

/// The switch's state: ports, learned addresses, the link.
struct Switch {
    ports: Vec<Port>,
    /// Each Ethernet address's port, learned from the frames it sent.
    learned: HashMap<[u8; 6], usize>,
    /// Nanoseconds a byte takes at the link's rate.
    ns_per_byte: f64,
    delay: Arc<AtomicU64>,
}

impl Switch {
    /// Queues `frame`, read from port `from` at `now`, for the ports it goes to.
    fn switch(&mut self, from: usize, frame: Vec<u8>, now: Instant) {
        if frame.len() < 14 {
            return;
        }
        let at = |b: &[u8]| -> [u8; 6] { [b[0], b[1], b[2], b[3], b[4], b[5]] };
        let (dst, src) = (at(&frame[0..6]), at(&frame[6..12]));
        self.learned.insert(src, from);
        let wire = Duration::from_nanos((frame.len() as f64 * self.ns_per_byte) as u64);
        let sent = self.ports[from].sent_by.max(now) + wire;
        self.ports[from].sent_by = sent;
        let arrives = sent + Duration::from_nanos(self.delay.load(Ordering::Relaxed));
        // Group bit set (broadcast, multicast) or not yet learned: every other port.
        let to: Vec<usize> = match self.learned.get(&dst) {
            Some(&p) if dst[0] & 1 == 0 => vec![p],
            Some(_) | None => (0..self.ports.len()).collect(),
        };
        for p in to.into_iter().filter(|&p| p != from) {
            let port = &mut self.ports[p];
            if port.queued + frame.len() > QUEUE_BYTES {
                continue;
            }
            let due = arrives.max(port.delivered_by + wire);
            port.delivered_by = due;
            port.queued += frame.len();
            port.queue.push_back((due, frame.clone()));
        }
    }

    /// Hands every frame due by `now` to its host; when the next one is due.
    fn deliver(&mut self, now: Instant) -> Option<Instant> {
        let mut next: Option<Instant> = None;
        for port in &mut self.ports {
            while let Some((due, _)) = port.queue.front() {
                if *due > now {
                    next = Some(next.map_or(*due, |n| n.min(*due)));
                    break;
                }
                let Some((_, frame)) = port.queue.pop_front() else { break };
                port.queued -= frame.len();
                // SAFETY: write(2) from a live buffer to an open descriptor. A frame the
                // device refuses (its queue full) is dropped, as on a real link.
                unsafe { libc::write(port.tap.as_raw_fd(), frame.as_ptr().cast(), frame.len()) };
            }
        }
        next
    }

    /// Reads every frame waiting on port `p`.
    fn read(&mut self, p: usize, buf: &mut [u8]) {
        loop {
            // SAFETY: read(2) into a live buffer of `buf.len()` bytes from an open descriptor.
            let n = unsafe { libc::read(self.ports[p].tap.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
            let Ok(n) = usize::try_from(n) else { return };
            if n == 0 {
                return;
            }
            let now = Instant::now();
            self.switch(p, buf[..n].to_vec(), now);
        }
    }

    /// Forwards until `alive` is cleared.
    fn run(mut self, alive: &AtomicBool) {
        // SAFETY: prctl(2) with integer arguments; it sets this thread's timer slack only.
        unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong, 0, 0, 0) };
        let mut buf = vec![0u8; 65_536];
        let mut fds: Vec<libc::pollfd> = self
            .ports
            .iter()
            .map(|p| libc::pollfd { fd: p.tap.as_raw_fd(), events: libc::POLLIN, revents: 0 })
            .collect();
        while alive.load(Ordering::Relaxed) {
            let next = self.deliver(Instant::now());
            // At most 50 ms asleep, so that a cleared `alive` ends the thread soon.
            let wait = next.map_or(Duration::from_millis(50), |t| t.saturating_duration_since(Instant::now()));
            let wait = wait.min(Duration::from_millis(50));
            let sleep = if wait <= SPIN { Duration::ZERO } else { wait - SPIN };
            // `as _`: the field's own type, as `libc::time_t` is deprecated on musl (its width changes).
            let ts = libc::timespec { tv_sec: sleep.as_secs() as _, tv_nsec: sleep.subsec_nanos().into() };
            // SAFETY: ppoll(2) over `fds`, which lives across the call, with a valid timeout.
            let ready = unsafe { libc::ppoll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, &ts, std::ptr::null()) };
            if ready > 0 {
                for (p, fd) in fds.iter().enumerate() {
                    if fd.revents & libc::POLLIN != 0 {
                        self.read(p, &mut buf);
                    }
                }
            } else if let Some(due) = next
                && sleep < wait
            {
                // The last microseconds: spin (a frame arriving meanwhile waits as long).
                while Instant::now() < due {
                    std::hint::spin_loop();
                }
            }
        }
    }
}

/// The running emulator: its forwarding thread and the TAP devices it owns.
pub struct LinkEmulator {
    alive: Arc<AtomicBool>,
    delay: Arc<AtomicU64>,
    thread: Option<JoinHandle<()>>,
}

impl LinkEmulator {
    /// Starts switching between `taps` (one a host) at `rate_mbit` each way on every link,
    /// with `delay` one way between two hosts.
    pub fn start(taps: Vec<OwnedFd>, rate_mbit: u32, delay: Duration) -> io::Result<LinkEmulator> {
        let now = Instant::now();
        let ports = taps
            .into_iter()
            .map(|tap| Port { tap, sent_by: now, delivered_by: now, queue: VecDeque::new(), queued: 0 })
            .collect();
        let delay = Arc::new(AtomicU64::new(delay.as_nanos() as u64));
        let switch = Switch {
            ports,
            learned: HashMap::new(),
            ns_per_byte: 8_000.0 / f64::from(rate_mbit.max(1)),
            delay: delay.clone(),
        };
        let alive = Arc::new(AtomicBool::new(true));
        let running = alive.clone();
        let thread = std::thread::Builder::new().name("link-emulator".into()).spawn(move || switch.run(&running))?;
        Ok(LinkEmulator { alive, delay, thread: Some(thread) })
    }

    /// The one-way delay between two hosts from now on (to measure the round trip without it).
    pub fn set_delay(&self, delay: Duration) {
        self.delay.store(delay.as_nanos() as u64, Ordering::Relaxed);
    }
}

impl Drop for LinkEmulator {
    /// Stops the thread, which closes the TAP devices and so removes them.
    fn drop(&mut self) {
        self.alive.store(false, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
