//! Facts that make a run reproducible and that the spec does not hold: the git commit of the
//! folder a spec came from, the host, and wall-clock times. Gathering them never fails a run:
//! what cannot be found is `null`.

use serde::Serialize;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{SystemTime, UNIX_EPOCH};

/// The git state of the folder a spec came from; every field is `null` without git or
/// outside a repository.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Git {
    /// `HEAD`'s commit.
    pub commit: Option<String>,
    /// Whether tracked files differ from `HEAD` (untracked files do not count).
    pub dirty: Option<bool>,
    /// The checked-out branch (`null` when detached).
    pub branch: Option<String>,
    /// The repository's top folder.
    pub root: Option<String>,
}

impl Git {
    /// The state of the repository holding `folder`, through the `git` command line.
    pub fn of(folder: &Path) -> Git {
        let folder = if folder.as_os_str().is_empty() { Path::new(".") } else { folder };
        let git = |args: &[&str]| -> Option<String> {
            let out = Command::new("git")
                .arg("-C")
                .arg(folder)
                .args(args)
                .stdin(Stdio::null())
                .stderr(Stdio::null())
                .output()
                .ok()?;
            out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
        };
        let Some(commit) = git(&["rev-parse", "--verify", "HEAD"]) else {
            return Git::default();
        };
        Git {
            commit: Some(commit),
            dirty: git(&["status", "--porcelain", "--untracked-files=no"]).map(|s| !s.is_empty()),
            branch: git(&["symbolic-ref", "--short", "-q", "HEAD"]).filter(|b| !b.is_empty()),
            root: git(&["rev-parse", "--show-toplevel"]),
        }
    }
}

/// The machine a run ran on.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Host {
    /// Host name.
    pub hostname: Option<String>,
    /// Operating system (`linux`).
    pub os: &'static str,
    /// Kernel release.
    pub kernel: Option<String>,
    /// CPU architecture (`x86_64`).
    pub arch: &'static str,
    /// CPU model.
    pub cpu: Option<String>,
    /// The CPU family whose row of speed thresholds the engine used (`engine::tuning`: this
    /// CPU's, or the one `run.cpu_tuning` pinned): the same spec and seed give the same bits
    /// on one row, and may differ in the last bits between rows.
    pub cpu_family: crate::engine::tuning::CpuFamily,
    /// Cores this process may use.
    pub cores: usize,
    /// Total memory, MB.
    pub memory_mb: Option<u64>,
    /// This process's id.
    pub pid: u32,
}

impl Host {
    /// This machine.
    pub fn here() -> Host {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        Host {
            hostname: hostname(),
            os: std::env::consts::OS,
            kernel: kernel(),
            arch: std::env::consts::ARCH,
            cpu: field(&cpuinfo, "model name").map(str::to_string),
            cpu_family: crate::engine::tuning::Tuning::here().family,
            cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
            memory_mb: field(&meminfo, "MemTotal")
                .and_then(|v| v.trim_end_matches("kB").trim().parse::<u64>().ok())
                .map(|kb| kb / 1024),
            pid: std::process::id(),
        }
    }
}

/// The value of `name: value` lines as in `/proc/cpuinfo`.
fn field<'t>(text: &'t str, name: &str) -> Option<&'t str> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        (k.trim() == name).then(|| v.trim())
    })
}

/// This machine's host name.
pub fn hostname() -> Option<String> {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most `len` bytes into the buffer it is given.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return None;
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    Some(String::from_utf8_lossy(&buf[..end]).into_owned()).filter(|h| !h.is_empty())
}

fn kernel() -> Option<String> {
    // SAFETY: uname only writes the struct it is given; all-zero is a valid utsname.
    let mut uts: libc::utsname = unsafe { std::mem::zeroed() };
    if unsafe { libc::uname(&mut uts) } != 0 {
        return None;
    }
    let bytes: Vec<u8> = uts.release.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect();
    Some(String::from_utf8_lossy(&bytes).into_owned())
}

/// Seconds since the Unix epoch.
pub fn unix_seconds(t: SystemTime) -> f64 {
    t.duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
}

/// `t` in RFC 3339, UTC, to the millisecond: `2026-11-21T12:34:56.789Z`.
pub fn rfc3339(t: SystemTime) -> String {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs();
    let (days, rest) = (secs / 86_400, secs % 86_400);
    let (y, m, day) = civil(days as i64);
    format!(
        "{y:04}-{m:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rest / 3600,
        rest % 3600 / 60,
        rest % 60,
        d.subsec_millis()
    )
}

/// Year, month, day of the `days`-th day after 1970-01-01 (Howard Hinnant's `civil_from_days`).
fn civil(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn formats_utc_times() {
        let at = |s: u64, ms: u64| rfc3339(UNIX_EPOCH + Duration::from_millis(s * 1000 + ms));
        assert_eq!(at(0, 0), "1970-01-01T00:00:00.000Z");
        assert_eq!(at(951_782_400, 5), "2000-02-29T00:00:00.005Z");
        assert_eq!(at(1_700_000_000, 123), "2023-11-14T22:13:20.123Z");
        assert_eq!(at(4_102_444_799, 999), "2099-12-31T23:59:59.999Z");
    }

    #[test]
    fn git_outside_a_repository_is_all_null() {
        let Ok(dir) = tempfile::tempdir() else { panic!("no temporary folder") };
        assert_eq!(Git::of(dir.path()), Git::default());
        assert_eq!(Git::of(&dir.path().join("missing")), Git::default());
    }

    #[test]
    fn host_facts_are_found() {
        let h = Host::here();
        assert!(h.cores >= 1);
        assert_eq!(h.pid, std::process::id());
        assert_eq!(field("model name\t: Zen 4\nflags : x", "model name"), Some("Zen 4"));
    }
}
