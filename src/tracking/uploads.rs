//! A run's files go to the server over a few connections at once: at a run's end the uploads
//! are most of what tracking adds to its wall time, and `mlflow server` takes them in
//! parallel (half the time for a tutorial run's dozen files on loopback). Each file is one
//! call; which ones arrived, were refused or are worth another try is sorted per file, so a
//! failure part way repeats nothing that arrived.

use super::client::{CallError, MlflowClient};
use std::path::PathBuf;
use std::sync::Mutex;

/// Uploads at once; `mlflow server`'s default is 4 workers.
const CONNECTIONS: usize = 4;

/// A file to upload: its artifact name and where it is.
pub type ArtifactFile = (String, PathBuf);

/// What became of a batch of uploads.
#[derive(Debug, Default)]
pub struct UploadOutcome {
    /// Refused by the server (a retry would not change that), with why.
    pub refused: Vec<(String, CallError)>,
    /// Not delivered for now (the server is unreachable or busy), in their order.
    pub retry: Vec<ArtifactFile>,
    /// The last retryable problem.
    pub last_error: Option<CallError>,
}

/// Uploads `files` to the run whose proxied artifact folder is `artifact_path`, up to
/// [`CONNECTIONS`] at a time.
pub fn upload_all(client: &MlflowClient, artifact_path: &str, files: Vec<ArtifactFile>) -> UploadOutcome {
    let count = files.len();
    let queue = Mutex::new(files.iter().cloned().enumerate().collect::<std::collections::VecDeque<_>>());
    let results: Mutex<Vec<(usize, Result<(), CallError>)>> = Mutex::new(Vec::with_capacity(count));
    let next = || queue.lock().ok().and_then(|mut q| q.pop_front());
    std::thread::scope(|s| {
        for _ in 0..CONNECTIONS.min(count) {
            s.spawn(|| {
                while let Some((i, (name, file))) = next() {
                    let sent = client.upload(artifact_path, &name, &file);
                    if let Ok(mut r) = results.lock() {
                        r.push((i, sent));
                    }
                }
            });
        }
    });
    let mut sent: Vec<Option<Result<(), CallError>>> = vec![None; count];
    for (i, result) in results.into_inner().unwrap_or_default() {
        sent[i] = Some(result);
    }
    let mut outcome = UploadOutcome::default();
    for ((name, file), result) in files.into_iter().zip(sent) {
        match result {
            Some(Ok(())) => {}
            Some(Err(e)) if !e.retryable() => outcome.refused.push((name, e)),
            Some(Err(e)) => {
                outcome.retry.push((name, file));
                outcome.last_error = Some(e);
            }
            // Its connection's thread died before it was sent (a panic): tried again later.
            None => outcome.retry.push((name, file)),
        }
    }
    outcome
}

/// The files of `paths` that exist, named by their file names.
pub fn named(paths: &[PathBuf]) -> Vec<ArtifactFile> {
    paths
        .iter()
        .filter(|p| p.is_file())
        .filter_map(|p| Some((p.file_name()?.to_string_lossy().into_owned(), p.clone())))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_a_server_could_not_take_stay_in_their_order_and_missing_files_are_left_out() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let names = ["a.json", "b.png", "c.svg", "d.html", "e.toml", "f.csv"];
        for n in names {
            std::fs::write(dir.path().join(n), n).unwrap_or_else(|e| panic!("{e}"));
        }
        let mut paths: Vec<PathBuf> = names.iter().map(|n| dir.path().join(n)).collect();
        paths.push(dir.path().join("missing.png"));
        let files = named(&paths);
        assert_eq!(files.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(), names);
        // Nothing listens on port 1: every upload is refused a connection, which is retried.
        let outcome = upload_all(&MlflowClient::new("http://127.0.0.1:1"), "1/run/artifacts", files.clone());
        assert_eq!(outcome.retry, files);
        assert!(outcome.refused.is_empty());
        assert!(matches!(outcome.last_error, Some(CallError::Unreachable(_))), "{:?}", outcome.last_error);
    }
}
