//! Fetching dataset files: each missing file is tried on every mirror in order, streamed into a
//! temporary file beside its final place, checked against its checksum, synced, and renamed
//! into place, so a crash or a concurrent worker never leaves a half-written file under the
//! real name. All failures are reported together, per file and per mirror.

use super::error::{DataError, FileFailure};
use flate2::read::MultiGzDecoder;
use md5::Md5;
use sha2::{Digest, Sha256};
use std::fs::{self, File};
use std::io::{self, BufReader, BufWriter, Read};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Refuses bodies larger than this (the largest expected file is 26 MB), so a broken mirror
/// cannot fill the disk.
const MAX_BODY: u64 = 512 << 20;

/// How a file is checked after download.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Checksum {
    /// SHA-256 (lowercase hex) of the decompressed bytes: stable whichever gzip made the file.
    Sha256Decompressed(String),
    /// MD5 (lowercase hex) of the file exactly as served, when that is all the publisher gives.
    Md5File(String),
    /// SHA-256 (lowercase hex) of the file exactly as served: for archives, whose own bytes
    /// are what is published.
    Sha256File(String),
}

/// A file to fetch: its name (on the mirror and on disk) and its checksum.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteFile {
    pub name: String,
    pub checksum: Checksum,
}

/// How to download: which mirrors (when not the dataset's own), timeouts and proxy.
#[derive(Debug, Clone)]
pub struct Fetcher {
    /// Base URLs tried in order instead of the dataset's mirrors; tests point this at a local
    /// server.
    pub mirrors: Option<Vec<String>>,
    /// Time to establish a connection.
    pub connect_timeout: Duration,
    /// Longest silence while receiving, so a stalled mirror is abandoned for the next one.
    pub read_timeout: Duration,
    /// Honour `HTTP_PROXY` / `HTTPS_PROXY` / `NO_PROXY` as curl does (read by `ureq` when the
    /// download starts; the only environment this module reads outside `DataDirs`).
    pub proxy_from_env: bool,
}

impl Default for Fetcher {
    fn default() -> Self {
        Self {
            mirrors: None,
            connect_timeout: Duration::from_secs(15),
            read_timeout: Duration::from_secs(60),
            proxy_from_env: true,
        }
    }
}

impl Fetcher {
    /// A fetcher that uses exactly `mirrors` and no proxy.
    pub fn with_mirrors(mirrors: Vec<String>) -> Self {
        Self { mirrors: Some(mirrors), proxy_from_env: false, ..Self::default() }
    }

    /// Downloads each of `files` into `dir` (created if needed), trying the mirrors in order.
    /// Returns the paths written, or every file that no mirror could deliver and why.
    pub fn download(
        &self,
        dataset: &'static str,
        dir: &Path,
        files: &[&RemoteFile],
        default_mirrors: &[&str],
    ) -> Result<Vec<PathBuf>, DataError> {
        if files.is_empty() {
            return Ok(vec![]);
        }
        let mirrors: Vec<String> = match &self.mirrors {
            Some(m) => m.clone(),
            None => default_mirrors.iter().map(|m| m.to_string()).collect(),
        };
        let agent = self.agent();
        let mut written = vec![];
        let mut failures = vec![];
        for file in files {
            let mut attempts = vec![];
            let mut done = None;
            if let Err(e) = fs::create_dir_all(dir) {
                attempts.push((dir.display().to_string(), format!("cannot create: {e}")));
            } else {
                for mirror in &mirrors {
                    let url = format!("{}/{}", mirror.trim_end_matches('/'), file.name);
                    match fetch_one(&agent, &url, dir, file) {
                        Ok(path) => {
                            done = Some(path);
                            break;
                        }
                        Err(problem) => attempts.push((url, problem)),
                    }
                }
            }
            match done {
                Some(path) => written.push(path),
                None => failures.push(FileFailure { file: file.name.clone(), attempts }),
            }
        }
        if failures.is_empty() {
            Ok(written)
        } else {
            Err(DataError::DownloadFailed { dataset, dir: dir.to_path_buf(), failures })
        }
    }

    fn agent(&self) -> ureq::Agent {
        let proxy = if self.proxy_from_env { ureq::Proxy::try_from_env() } else { None };
        let config = ureq::Agent::config_builder()
            .timeout_connect(Some(self.connect_timeout))
            .timeout_per_read(Some(self.read_timeout))
            .proxy(proxy)
            .build();
        ureq::Agent::new_with_config(config)
    }
}

/// One attempt: download to a temporary file, verify, sync, rename. The problem comes back as
/// text for the report; the temporary file is removed whatever happens.
fn fetch_one(agent: &ureq::Agent, url: &str, dir: &Path, file: &RemoteFile) -> Result<PathBuf, String> {
    let target = dir.join(&file.name);
    // The process id keeps workers sharing a folder from writing into each other's files;
    // whichever renames last wins with an identical, verified file.
    let temp = dir.join(format!(".{}.{}.part", file.name, std::process::id()));
    let result = fetch_into(agent, url, &temp, &file.checksum)
        .and_then(|()| fs::rename(&temp, &target).map_err(|e| format!("cannot rename into place: {e}")));
    match result {
        Ok(()) => {
            // Makes the rename itself durable; some platforms cannot open folders, and the
            // file is already complete and synced, so failing here loses nothing.
            let _ = File::open(dir).and_then(|d| d.sync_all());
            Ok(target)
        }
        Err(problem) => {
            let _ = fs::remove_file(&temp);
            Err(problem)
        }
    }
}

fn fetch_into(agent: &ureq::Agent, url: &str, temp: &Path, checksum: &Checksum) -> Result<(), String> {
    let mut response = agent.get(url).call().map_err(|e| e.to_string())?;
    let mut body = response.body_mut().with_config().limit(MAX_BODY).reader();
    let out = File::create(temp).map_err(|e| format!("cannot create {}: {e}", temp.display()))?;
    let mut out = BufWriter::new(out);
    io::copy(&mut body, &mut out).map_err(|e| format!("download interrupted: {e}"))?;
    let out = out.into_inner().map_err(|e| format!("cannot write {}: {}", temp.display(), e.error()))?;
    verify(temp, checksum)?;
    out.sync_all().map_err(|e| format!("cannot sync {}: {e}", temp.display()))
}

/// Checks a file against its checksum; the problem as text when it does not match.
pub fn verify(path: &Path, checksum: &Checksum) -> Result<(), String> {
    let file = File::open(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let mut file = BufReader::new(file);
    let (algo, expected, got) = match checksum {
        Checksum::Md5File(expected) => ("md5", expected, hash::<Md5>(&mut file)?),
        Checksum::Sha256File(expected) => ("sha256", expected, hash::<Sha256>(&mut file)?),
        Checksum::Sha256Decompressed(expected) => {
            let is_gzip = io::BufRead::fill_buf(&mut file).map_err(|e| e.to_string())?.starts_with(&[0x1f, 0x8b]);
            let got =
                if is_gzip { hash::<Sha256>(&mut MultiGzDecoder::new(file))? } else { hash::<Sha256>(&mut file)? };
            ("sha256 of the decompressed bytes", expected, got)
        }
    };
    if got.eq_ignore_ascii_case(expected) {
        Ok(())
    } else {
        Err(format!("checksum mismatch: {algo} is {got}, expected {expected}"))
    }
}

fn hash<D: Digest>(reader: &mut dyn Read) -> Result<String, String> {
    let mut hasher = D::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        match reader.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => hasher.update(&buf[..n]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(format!("unreadable: {e}")),
        }
    }
    Ok(hasher.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::data::source::idx::{encode_idx, gzip};
    use std::collections::HashMap;
    use std::io::Write;
    use std::net::{SocketAddr, TcpListener};
    use std::time::Instant;

    /// Serves `files` over HTTP/1.0 on a loopback port; the thread stops by itself after
    /// `max_requests` requests or 30 s, whichever comes first.
    pub(crate) fn serve(files: HashMap<String, Vec<u8>>, max_requests: usize) -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        listener.set_nonblocking(true).unwrap();
        std::thread::spawn(move || {
            let deadline = Instant::now() + Duration::from_secs(30);
            let mut served = 0;
            while served < max_requests && Instant::now() < deadline {
                let Ok((mut conn, _)) = listener.accept() else {
                    std::thread::sleep(Duration::from_millis(2));
                    continue;
                };
                served += 1;
                let _ = conn.set_nonblocking(false);
                let mut request = vec![];
                let mut byte = [0u8; 1];
                while !request.ends_with(b"\r\n\r\n") && conn.read(&mut byte).is_ok_and(|n| n == 1) {
                    request.push(byte[0]);
                }
                let line = String::from_utf8_lossy(&request);
                let path = line.split_whitespace().nth(1).unwrap_or("/").trim_start_matches('/');
                let reply = match files.get(path) {
                    Some(body) => [
                        format!("HTTP/1.0 200 OK\r\nContent-Length: {}\r\n\r\n", body.len()).into_bytes(),
                        body.clone(),
                    ]
                    .concat(),
                    None => b"HTTP/1.0 404 Not Found\r\nContent-Length: 0\r\n\r\n".to_vec(),
                };
                let _ = conn.write_all(&reply);
            }
        });
        addr
    }

    /// A loopback address where nothing listens.
    pub(crate) fn unreachable() -> String {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        drop(listener);
        format!("http://{addr}")
    }

    fn sha256_hex(bytes: &[u8]) -> String {
        Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
    }

    fn fixture() -> (Vec<u8>, RemoteFile) {
        let raw = encode_idx(&[3, 2, 2], &[1; 12]);
        let file =
            RemoteFile { name: "tiny-idx3-ubyte.gz".into(), checksum: Checksum::Sha256Decompressed(sha256_hex(&raw)) };
        (gzip(&raw), file)
    }

    #[test]
    fn downloads_from_the_first_mirror_that_works() {
        let dir = tempfile::tempdir().unwrap();
        let (gz, file) = fixture();
        let addr = serve(HashMap::from([(file.name.clone(), gz.clone())]), 1);
        let fetcher = Fetcher::with_mirrors(vec![unreachable(), format!("http://{addr}/")]);
        let written = fetcher.download("tiny", dir.path(), &[&file], &[]).unwrap();
        assert_eq!(written, vec![dir.path().join(&file.name)]);
        assert_eq!(fs::read(&written[0]).unwrap(), gz);
        // Only the final file remains: the temporary one was renamed.
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn bad_checksum_on_every_mirror_is_reported_per_mirror_and_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let (_, file) = fixture();
        let wrong = gzip(&encode_idx(&[3, 2, 2], &[2; 12]));
        let files = HashMap::from([(file.name.clone(), wrong)]);
        let a = serve(files.clone(), 1);
        let b = serve(files, 1);
        let fetcher = Fetcher::with_mirrors(vec![format!("http://{a}"), format!("http://{b}")]);
        let err = fetcher.download("tiny", dir.path(), &[&file], &[]).unwrap_err();
        let DataError::DownloadFailed { failures, .. } = &err else { panic!("{err}") };
        assert_eq!(failures[0].attempts.len(), 2);
        let text = err.to_string();
        assert!(text.starts_with("tiny: could not download tiny-idx3-ubyte.gz into "), "{text}");
        assert!(
            text.contains(&format!(
                "http://{a}/tiny-idx3-ubyte.gz: checksum mismatch: sha256 of the decompressed bytes is "
            )),
            "{text}"
        );
        assert!(text.contains("set `data.dir` (or TRAINRUN_DATA_DIR)"), "{text}");
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[test]
    fn unreachable_and_missing_mirrors_name_each_file() {
        let dir = tempfile::tempdir().unwrap();
        let (_, file) = fixture();
        let other = RemoteFile { name: "other.gz".into(), checksum: Checksum::Md5File("00".into()) };
        let addr = serve(HashMap::new(), 2);
        let fetcher = Fetcher::with_mirrors(vec![unreachable(), format!("http://{addr}")]);
        let err = fetcher.download("tiny", dir.path(), &[&file, &other], &[]).unwrap_err().to_string();
        assert!(err.contains("could not download tiny-idx3-ubyte.gz, other.gz into"), "{err}");
        assert!(err.contains(&format!("http://{addr}/other.gz: http status: 404")), "{err}");
        assert_eq!(err.matches("\n  http://").count(), 4, "{err}");
    }

    #[test]
    fn md5_of_the_served_file_is_checked() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        fs::write(&path, b"abc").unwrap();
        let ok = Checksum::Md5File("900150983cd24fb0d6963f7d28e17f72".into());
        assert_eq!(verify(&path, &ok), Ok(()));
        let bad = Checksum::Md5File("00".into());
        assert!(verify(&path, &bad).unwrap_err().starts_with("checksum mismatch: md5 is 9001"));
        let sha = Checksum::Sha256File("ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad".into());
        assert_eq!(verify(&path, &sha), Ok(()));
    }
}
